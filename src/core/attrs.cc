#include "kiln/core/attrs.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln {

void Attrs::set(std::string name, AttrValue v) {
  for (auto& [k, val] : items_)
    if (k == name) {
      val = std::move(v);
      return;
    }
  items_.emplace_back(std::move(name), std::move(v));
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (auto& [k, v] : items_)
    if (k == name) return &v;
  return nullptr;
}

const AttrValue& Attrs::require(std::string_view name) const {
  const AttrValue* v = find(name);
  if (!v) throw InvalidArgumentError("missing attribute '" + std::string(name) + "'");
  return *v;
}

namespace {
template <typename T>
const T& as(const AttrValue& v, std::string_view name, const char* type) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw InvalidArgumentError("attribute '" + std::string(name) + "' must be " + type);
}
}  // namespace

int64_t Attrs::get_int(std::string_view n) const {
  const AttrValue& v = require(n);
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  return as<int64_t>(v, n, "an integer");
}
int64_t Attrs::get_int(std::string_view n, int64_t d) const { return has(n) ? get_int(n) : d; }
double Attrs::get_float(std::string_view n) const {
  const AttrValue& v = require(n);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return as<double>(v, n, "a number");
}
double Attrs::get_float(std::string_view n, double d) const { return has(n) ? get_float(n) : d; }
bool Attrs::get_bool(std::string_view n, bool d) const {
  const AttrValue* v = find(n);
  if (!v) return d;
  if (const int64_t* i = std::get_if<int64_t>(v)) return *i != 0;
  return as<bool>(*v, n, "a bool");
}
const std::string& Attrs::get_string(std::string_view n) const { return as<std::string>(require(n), n, "a string"); }
std::string Attrs::get_string(std::string_view n, const std::string& d) const { return has(n) ? get_string(n) : d; }
const std::vector<int64_t>& Attrs::get_ints(std::string_view n) const {
  return as<std::vector<int64_t>>(require(n), n, "a list of integers");
}
std::vector<int64_t> Attrs::get_ints(std::string_view n, const std::vector<int64_t>& d) const {
  return has(n) ? get_ints(n) : d;
}
const std::vector<int64_t>& Attrs::get_ints_or_empty(std::string_view n) const {
  static const std::vector<int64_t> kEmpty;
  return has(n) ? get_ints(n) : kEmpty;
}
DType Attrs::get_dtype(std::string_view n) const { return as<DType>(require(n), n, "a dtype"); }
DType Attrs::get_dtype(std::string_view n, DType d) const { return has(n) ? get_dtype(n) : d; }

std::string Attrs::str() const {
  std::ostringstream os;
  os << '{';
  bool first = true;
  for (auto& [k, v] : items_) {
    os << (first ? "" : ", ") << k << '=';
    first = false;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            os << '[';
            for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
            os << ']';
          } else if constexpr (std::is_same_v<T, DType>) {
            os << dtype_name(x);
          } else {
            os << x;
          }
        },
        v);
  }
  os << '}';
  return os.str();
}

}  // namespace kiln
