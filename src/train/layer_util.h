#pragma once
// Helpers shared by the built-in layers (src/train/layer*.cc); not a public header.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/train/layer.h"

namespace kiln::train::detail {

// "Dense 'dense_1'": how errors name a layer.
std::string layer_label(const Layer& layer);

// Throws InvalidArgumentError "<label>: <message>".
template <typename... Args>
[[noreturn]] void layer_error(const Layer& layer, const Args&... args) {
  throw InvalidArgumentError(::kiln::detail::str_cat(layer_label(layer), ": ", args...));
}

// Throws InvalidArgumentError listing the known activation names unless `name` is one.
void check_activation(const std::string& name);

// An axis in [-rank, rank) as a non-negative index; InvalidArgumentError naming the layer otherwise.
int normalize_axis(const Layer& layer, int64_t axis, int rank);

// A 1- or 2-entry size list ({k} means {k, k}) as two positive sizes.
std::vector<int64_t> pair_arg(const std::string& what, const std::vector<int64_t>& v, bool allow_empty = false);

// "[-1, 4]": a dimension list that may hold -1 (Shape rejects negative dims).
std::string dims_str(const std::vector<int64_t>& dims);

// A fresh 64-bit seed from kiln's default generator (reproducible under kiln::set_seed).

}  // namespace kiln::train::detail
