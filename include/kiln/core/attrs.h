#pragma once
// Op attributes: a small ordered list of named values (ints, floats, bools, strings,
// int lists, dtypes), and the schema entries an op declares for them.
//
// Thread-safety: an Attrs is a value; concurrent reads are safe, writes are not.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/dtype.h"

namespace kiln {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, DType>;

// A small ordered list of named attributes. The getters without a default throw
// InvalidArgumentError naming the attribute when it is missing or of another type.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}
  void set(std::string name, AttrValue v);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  int64_t get_int(std::string_view name) const;
  int64_t get_int(std::string_view name, int64_t dflt) const;
  double get_float(std::string_view name) const;
  double get_float(std::string_view name, double dflt) const;
  bool get_bool(std::string_view name, bool dflt) const;
  const std::string& get_string(std::string_view name) const;
  std::string get_string(std::string_view name, const std::string& dflt) const;
  const std::vector<int64_t>& get_ints(std::string_view name) const;
  std::vector<int64_t> get_ints(std::string_view name, const std::vector<int64_t>& dflt) const;
  // The int list by reference, or an empty list when the attribute is absent.
  const std::vector<int64_t>& get_ints_or_empty(std::string_view name) const;
  DType get_dtype(std::string_view name) const;
  DType get_dtype(std::string_view name, DType dflt) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;

 private:
  const AttrValue* find(std::string_view name) const;
  const AttrValue& require(std::string_view name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

enum class AttrType { kInt, kFloat, kBool, kString, kInts, kDType };
struct AttrSpec {
  std::string name;
  AttrType type;
  std::string doc;
};

}  // namespace kiln
