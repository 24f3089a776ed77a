#pragma once
// Shape: the dimensions of a dense row-major tensor, rank 0 to kMaxRank.
// Stored inline (no heap allocation) so that eager dispatch stays cheap.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace kiln {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;
  // The constructors, push_back and insert throw InvalidArgumentError for a rank over
  // kMaxRank or more than 2^63 - 1 elements (a zero dimension makes any shape empty), the
  // constructors also for a negative dimension.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims) : Shape(std::span<const int64_t>(dims)) {}

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  // Dimension with Python-style negative index; throws OutOfRangeError.
  int64_t dim(int i) const;
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  void push_back(int64_t d);
  void insert(int pos, int64_t d);
  void erase(int pos);
  // Row-major element strides.
  std::array<int64_t, kMaxRank> strides() const;
  std::string str() const;  // "[2, 3]"

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// NumPy broadcasting of two shapes; throws InvalidArgumentError naming both.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Normalises an axis in [-rank, rank) to [0, rank); throws OutOfRangeError.
int normalize_axis(int64_t axis, int rank, const char* what = "axis");

}  // namespace kiln
