#pragma once
// Internals shared by model.cc and callbacks.cc.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/train/callbacks.h"
#include "kiln/train/metrics.h"

namespace kiln::train {

// "(None, 28, 28, 1)" for a shape with -1 batch.
std::string shape_str(const Shape& s);
// 203530 -> "203,530".
std::string with_commas(int64_t v);

// The metric for a compile() name; "accuracy"/"acc" picks the variant matching the
// loss (sparse/categorical/binary cross-entropy). Logged under the requested name.
MetricPtr resolve_metric(const std::string& name, const std::string& loss_name);

// Checks that every x and y tensor has the same (non-zero rank) first dimension;
// returns it. InvalidArgumentError naming `what` otherwise.
int64_t check_batch_dims(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const char* what);
// Rows [lo, hi) of each tensor.
std::vector<Tensor> take_rows(const std::vector<Tensor>& xs, int64_t lo, int64_t hi);
// Rows perm[lo..hi) of each tensor.
std::vector<Tensor> gather_rows(const std::vector<Tensor>& xs, const std::vector<int64_t>& perm, int64_t lo,
                                int64_t hi);
// A permutation of [0, n) that depends only on the seed (Fisher-Yates over splitmix64).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed);

// Records epoch logs into a History.
class HistoryRecorder : public Callback {
 public:
  void on_epoch_end(int epoch, Logs& logs) override;
  History history;
};

CallbackPtr make_progbar(int verbose, int64_t steps, int epochs);

}  // namespace kiln::train
