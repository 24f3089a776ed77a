#pragma once
// The values that flow through an input pipeline.
//
// A pipeline element is a tuple of components (or a named map of them, like a dict
// in tf.data). A component is a numeric kiln::Tensor or a StringTensor: a row-major
// array of byte strings, TensorFlow's tf.string (file names, serialized records,
// text lines, encoded images). Strings live in the data layer until the core grows a
// string dtype for serving; Value is the seam where that swap happens.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::data {

// A tensor of byte strings: shape.numel() values in row-major order.
struct StringTensor {
  Shape shape;
  std::vector<std::string> values;

  StringTensor() = default;  // a scalar holding ""
  // Throws InvalidArgumentError when values.size() != shape.numel().
  StringTensor(Shape shape, std::vector<std::string> values);
  static StringTensor scalar(std::string value);
  static StringTensor vector(std::vector<std::string> values);
  int64_t numel() const { return static_cast<int64_t>(values.size()); }
  // The single value of a one-element tensor; InvalidArgumentError otherwise.
  const std::string& item() const;
};

// One component: a numeric Tensor or a StringTensor (or undefined).
class Value {
 public:
  Value() = default;
  Value(Tensor t);        // NOLINT: implicit, so {tensor, strings} braces build elements
  Value(StringTensor s);  // NOLINT
  Value(const char* s) : Value(StringTensor::scalar(s)) {}         // NOLINT
  Value(std::string s) : Value(StringTensor::scalar(std::move(s))) {}  // NOLINT

  bool defined() const { return v_.index() != 0; }
  bool is_string() const { return v_.index() == 2; }
  bool is_tensor() const { return v_.index() == 1; }
  // The held tensor; InvalidArgumentError naming what is held instead.
  const Tensor& tensor() const;
  const StringTensor& strings() const;
  StringTensor& strings();
  const Shape& shape() const;
  int rank() const { return shape().rank(); }
  // "string" or the dtype's name.
  std::string type_name() const;
  // "f32[28, 28]", "string[4]".
  std::string desc() const;
  // Bytes held (string payloads included), for memory budgets.
  size_t nbytes() const;

 private:
  std::variant<std::monostate, Tensor, StringTensor> v_;
};

// An element: a tuple of components, optionally with one name per component.
class Element {
 public:
  Element() = default;
  Element(std::vector<Value> values) : values_(std::move(values)) {}  // NOLINT: tuple
  Element(std::initializer_list<Value> values) : values_(values) {}
  // Named components; names must be unique (InvalidArgumentError).
  Element(std::vector<std::string> names, std::vector<Value> values);
  // Same names (shared, not copied) as `like`.
  static Element with_names_of(const Element& like, std::vector<Value> values);

  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  const Value& operator[](size_t i) const;  // OutOfRangeError past the end
  Value& operator[](size_t i);
  // NotFoundError listing the names there are.
  const Value& operator[](std::string_view name) const;
  Value& operator[](std::string_view name);
  int index_of(std::string_view name) const;  // -1 if absent
  bool named() const { return names_ != nullptr; }
  // Empty for a tuple.
  const std::vector<std::string>& names() const;
  const std::vector<Value>& values() const { return values_; }
  std::vector<Value>& values() { return values_; }
  // The i-th component as a tensor (InvalidArgumentError for a string).
  const Tensor& tensor(size_t i) const { return (*this)[i].tensor(); }
  const Tensor& tensor(std::string_view name) const { return (*this)[name].tensor(); }
  // "(f32[28, 28], u8[])" or "{image: f32[28, 28], label: u8[]}".
  std::string desc() const;
  size_t nbytes() const;

 private:
  std::shared_ptr<const std::vector<std::string>> names_;
  std::vector<Value> values_;
};

// The type of a component: dtype (or string) and shape, with -1 for a dimension that
// varies between elements and `unknown_rank` when even the rank varies.
struct TypeSpec {
  bool is_string = false;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
  bool unknown_rank = false;

  static TypeSpec of(const Value& v);
  static TypeSpec tensor(DType dtype, std::vector<int64_t> dims = {}) { return {false, dtype, std::move(dims), false}; }
  // (dtype is unused for strings and kept at kF32 so that specs compare equal.)
  static TypeSpec string(std::vector<int64_t> dims = {}) { return {true, DType::kF32, std::move(dims), false}; }
  bool matches(const Value& v) const;  // same type, shape compatible
  // The most specific spec that both this and `o` match (dims that differ become -1,
  // ranks that differ make the rank unknown). InvalidArgumentError if types differ.
  TypeSpec merge(const TypeSpec& o) const;
  std::string str() const;  // "f32[-1, 28]", "string[]", "i64[?]" (unknown rank)
  bool operator==(const TypeSpec& o) const = default;
};

// What every element of a dataset looks like.
struct ElementSpec {
  std::vector<std::string> names;  // empty for tuples
  std::vector<TypeSpec> components;

  static ElementSpec of(const Element& e);
  size_t size() const { return components.size(); }
  // InvalidArgumentError saying which component and how they differ.
  ElementSpec merge(const ElementSpec& o) const;
  std::string str() const;
  bool operator==(const ElementSpec& o) const = default;
};

}  // namespace kiln::data
