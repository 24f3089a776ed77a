#include "kiln/data/value.h"

#include <algorithm>
#include <utility>

#include "kiln/core/error.h"

namespace kiln::data {

// ---- StringTensor ----

StringTensor::StringTensor(Shape s, std::vector<std::string> v) : shape(std::move(s)), values(std::move(v)) {
  KILN_CHECK_ARG(static_cast<int64_t>(values.size()) == shape.numel(), "StringTensor of shape ", shape.str(),
                 " needs ", shape.numel(), " values, got ", values.size());
}

StringTensor StringTensor::scalar(std::string value) {
  StringTensor t;
  t.values.push_back(std::move(value));
  return t;
}

StringTensor StringTensor::vector(std::vector<std::string> values) {
  Shape s{static_cast<int64_t>(values.size())};
  return StringTensor(s, std::move(values));
}

const std::string& StringTensor::item() const {
  KILN_CHECK_ARG(values.size() == 1, "item() needs a string tensor with one value, got shape ", shape.str());
  return values[0];
}

// ---- Value ----

Value::Value(Tensor t) {
  if (t.defined()) v_ = std::move(t);
}
Value::Value(StringTensor s) : v_(std::move(s)) {}

const Tensor& Value::tensor() const {
  if (const auto* t = std::get_if<Tensor>(&v_)) return *t;
  throw InvalidArgumentError("expected a numeric tensor, got " + desc());
}

const StringTensor& Value::strings() const {
  if (const auto* s = std::get_if<StringTensor>(&v_)) return *s;
  throw InvalidArgumentError("expected a string tensor, got " + desc());
}

StringTensor& Value::strings() {
  if (auto* s = std::get_if<StringTensor>(&v_)) return *s;
  throw InvalidArgumentError("expected a string tensor, got " + desc());
}

const Shape& Value::shape() const {
  static const Shape kScalar;
  if (const auto* t = std::get_if<Tensor>(&v_)) return t->shape();
  if (const auto* s = std::get_if<StringTensor>(&v_)) return s->shape;
  return kScalar;
}

std::string Value::type_name() const {
  if (const auto* t = std::get_if<Tensor>(&v_)) return std::string(dtype_name(t->dtype()));
  if (is_string()) return "string";
  return "undefined";
}

std::string Value::desc() const {
  if (!defined()) return "undefined";
  return type_name() + shape().str();
}

size_t Value::nbytes() const {
  if (const auto* t = std::get_if<Tensor>(&v_)) return t->nbytes();
  if (const auto* s = std::get_if<StringTensor>(&v_)) {
    size_t n = 0;
    for (const auto& v : s->values) n += v.size() + sizeof(std::string);
    return n;
  }
  return 0;
}

// ---- Element ----

Element::Element(std::vector<std::string> names, std::vector<Value> values) : values_(std::move(values)) {
  KILN_CHECK_ARG(names.size() == values_.size(), "an element with ", values_.size(),
                 " components needs as many names, got ", names.size());
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j) KILN_CHECK_ARG(names[i] != names[j], "duplicate component name '", names[i], "'");
  names_ = std::make_shared<const std::vector<std::string>>(std::move(names));
}

Element Element::with_names_of(const Element& like, std::vector<Value> values) {
  Element e(std::move(values));
  if (like.names_) {
    KILN_CHECK_ARG(like.names_->size() == e.values_.size(), "an element with ", e.values_.size(),
                   " components cannot take the ", like.names_->size(), " names of ", like.desc());
    e.names_ = like.names_;
  }
  return e;
}

const Value& Element::operator[](size_t i) const {
  if (i >= values_.size())
    throw OutOfRangeError(detail::str_cat("component ", i, " of an element with ", values_.size(), " components"));
  return values_[i];
}

Value& Element::operator[](size_t i) { return const_cast<Value&>(std::as_const(*this)[i]); }

int Element::index_of(std::string_view name) const {
  if (!names_) return -1;
  for (size_t i = 0; i < names_->size(); ++i)
    if ((*names_)[i] == name) return static_cast<int>(i);
  return -1;
}

const Value& Element::operator[](std::string_view name) const {
  int i = index_of(name);
  if (i < 0) {
    std::string have;
    for (const auto& n : names()) have += (have.empty() ? "" : ", ") + n;
    throw NotFoundError("element has no component '" + std::string(name) + "'" +
                        (named() ? " (it has: " + have + ")" : " (it is a tuple, not named)"));
  }
  return values_[static_cast<size_t>(i)];
}

Value& Element::operator[](std::string_view name) { return const_cast<Value&>(std::as_const(*this)[name]); }

const std::vector<std::string>& Element::names() const {
  static const std::vector<std::string> kNone;
  return names_ ? *names_ : kNone;
}

std::string Element::desc() const {
  std::string s = named() ? "{" : "(";
  for (size_t i = 0; i < values_.size(); ++i) {
    if (i) s += ", ";
    if (named()) s += (*names_)[i] + ": ";
    s += values_[i].desc();
  }
  return s + (named() ? "}" : ")");
}

size_t Element::nbytes() const {
  size_t n = 0;
  for (const auto& v : values_) n += v.nbytes();
  return n;
}

// ---- specs ----

TypeSpec TypeSpec::of(const Value& v) {
  TypeSpec t;
  t.is_string = v.is_string();
  if (v.is_tensor()) t.dtype = v.tensor().dtype();
  t.dims = v.shape().vec();
  return t;
}

bool TypeSpec::matches(const Value& v) const {
  if (!v.defined() || v.is_string() != is_string) return false;
  if (!is_string && v.tensor().dtype() != dtype) return false;
  if (unknown_rank) return true;
  const Shape& s = v.shape();
  if (s.rank() != static_cast<int>(dims.size())) return false;
  for (int i = 0; i < s.rank(); ++i)
    if (dims[i] >= 0 && dims[i] != s[i]) return false;
  return true;
}

TypeSpec TypeSpec::merge(const TypeSpec& o) const {
  KILN_CHECK_ARG(is_string == o.is_string && (is_string || dtype == o.dtype), "component types differ: ", str(), " vs ",
                 o.str());
  TypeSpec r = *this;
  if (unknown_rank || o.unknown_rank || dims.size() != o.dims.size()) {
    r.unknown_rank = true;
    r.dims.clear();
    return r;
  }
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] != o.dims[i]) r.dims[i] = -1;
  return r;
}

std::string TypeSpec::str() const {
  std::string s = is_string ? "string" : std::string(dtype_name(dtype));
  if (unknown_rank) return s + "[?]";
  s += "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

ElementSpec ElementSpec::of(const Element& e) {
  ElementSpec s;
  s.names = e.names();
  for (const auto& v : e.values()) s.components.push_back(TypeSpec::of(v));
  return s;
}

ElementSpec ElementSpec::merge(const ElementSpec& o) const {
  KILN_CHECK_ARG(size() == o.size(), "elements differ in their number of components: ", str(), " vs ", o.str());
  ElementSpec r = *this;
  for (size_t i = 0; i < size(); ++i) {
    try {
      r.components[i] = components[i].merge(o.components[i]);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(detail::str_cat("component ", i, ": ", e.message()));
    }
  }
  return r;
}

std::string ElementSpec::str() const {
  bool named = !names.empty();
  std::string s = named ? "{" : "(";
  for (size_t i = 0; i < components.size(); ++i) {
    if (i) s += ", ";
    if (named) s += names[i] + ": ";
    s += components[i].str();
  }
  return s + (named ? "}" : ")");
}

}  // namespace kiln::data
