#include "kiln/core/shape.h"

#include <algorithm>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    throw InvalidArgumentError(detail::str_cat("rank ", dims.size(), " exceeds kiln's maximum rank ", kMaxRank));
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    if (dims[i] < 0)
      throw InvalidArgumentError(detail::str_cat("negative dimension ", dims[i], " at index ", i));
    dims_[i] = dims[i];
  }
  (void)numel();  // a shape of more than 2^63 - 1 elements is refused here, at construction
}

int64_t Shape::dim(int i) const { return dims_[normalize_axis(i, rank_, "dimension")]; }

int64_t Shape::numel() const {
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] == 0) return 0;  // empty, however large the other dimensions
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i)
    if (__builtin_mul_overflow(n, dims_[i], &n))
      throw InvalidArgumentError("shape " + str() + " has more than 2^63 - 1 elements");
  return n;
}

void Shape::push_back(int64_t d) { insert(rank_, d); }

void Shape::insert(int pos, int64_t d) {
  if (rank_ >= kMaxRank) throw InvalidArgumentError(detail::str_cat("rank exceeds kiln's maximum rank ", kMaxRank));
  for (int i = rank_; i > pos; --i) dims_[i] = dims_[i - 1];
  dims_[pos] = d;
  ++rank_;
  try {
    (void)numel();
  } catch (...) {
    erase(pos);  // leaves the shape as it was
    throw;
  }
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < rank_; ++i) dims_[i] = dims_[i + 1];
  --rank_;
  dims_[rank_] = 0;
}

std::array<int64_t, Shape::kMaxRank> Shape::strides() const {
  std::array<int64_t, kMaxRank> s{};
  uint64_t acc = 1;  // unsigned: an empty shape's strides may wrap, harmlessly
  for (int i = rank_ - 1; i >= 0; --i) {
    s[i] = static_cast<int64_t>(acc);
    acc *= static_cast<uint64_t>(dims_[i]);
  }
  return s;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  int r = std::max(a.rank(), b.rank());
  Shape out;
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      throw InvalidArgumentError("shapes " + a.str() + " and " + b.str() +
                                 " are not broadcast-compatible (dimension " + std::to_string(i) + ": " +
                                 std::to_string(da) + " vs " + std::to_string(db) + ")");
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

int normalize_axis(int64_t axis, int rank, const char* what) {
  if (axis < -rank || axis >= rank)
    throw OutOfRangeError(detail::str_cat(what, " ", axis, " is out of range for rank ", rank, " (expected [",
                                          -rank, ", ", rank, "))"));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace kiln
