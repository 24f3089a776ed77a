#pragma once
// Shared test helpers: fixtures, tolerances, typed-error assertions.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/sanitizers.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"
#include "kiln/core/tensor.h"
#include "test_paths.h"

namespace kiln::testing {

// True in the sanitizer presets (AddressSanitizer, ThreadSanitizer), where a language-model
// step is 5-10x slower than in the default preset. Tests that repeat one code path many
// times (greedy continuations of every oracle prompt, dozens of solo runs to compare a
// batch against) check a few of the repetitions there: the default preset checks them
// all, and repeating a path adds nothing to what the sanitizers look for.
#if defined(KILN_TSAN)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif
#if defined(KILN_ASAN) || defined(KILN_TSAN)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Path of a fixture file under tests/fixtures.
std::string fixture(const std::string& rel);
// Loads tests/fixtures/<rel>; fails the test (throws) when missing.
Tensor load(const std::string& rel);

// Tolerances by dtype for results computed in that dtype vs an f64/f32 reference.
struct Tol {
  double rtol, atol;
};
Tol tol_for(DType t);

template <typename T>
Tensor make(std::vector<T> v, Shape s) {
  return Tensor::from_vector<T>(v, s);
}

// Kernel preferences (kiln/core/flags.h) changed for a scope and restored after it:
//   ScopedKernelPreferences off([](KernelPreferences& k) { k.winograd = false; });
class ScopedKernelPreferences {
 public:
  explicit ScopedKernelPreferences(const std::function<void(KernelPreferences&)>& edit)
      : saved_(kernel_preferences()) {
    KernelPreferences p = saved_;
    edit(p);
    set_kernel_preferences(p);
  }
  ~ScopedKernelPreferences() { set_kernel_preferences(saved_); }
  ScopedKernelPreferences(const ScopedKernelPreferences&) = delete;
  ScopedKernelPreferences& operator=(const ScopedKernelPreferences&) = delete;

 private:
  KernelPreferences saved_;
};
// The preference's name for test traces: "off", "auto", "force-tile".
const char* direct_conv_name(DirectConv d);

// A fresh directory under the system temp dir ("kiln_<tag>.XXXXXX"), removed with its
// contents when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `bytes` to `path` (truncating); fails the test when the write fails.
void write_bytes(const std::string& path, const std::string& bytes);

// Deterministic pseudo-random test data in [lo, hi).
Tensor rand_tensor(const Shape& s, DType dt, double lo = -1, double hi = 1, uint64_t seed = 1);

}  // namespace kiln::testing

namespace kiln {
inline void PrintTo(const Shape& s, std::ostream* os) { *os << s.str(); }
inline void PrintTo(const Tensor& t, std::ostream* os) { *os << t.str(); }
}  // namespace kiln

#define EXPECT_CLOSE(actual, expected, rtol, atol)                                                  \
  do {                                                                                              \
    const ::kiln::Tensor kiln_a_ = (actual); /* a copy: `actual` may be a temporary */             \
    const ::kiln::Tensor kiln_e_ = (expected);                                                      \
    EXPECT_TRUE(::kiln::allclose(kiln_a_, kiln_e_, rtol, atol))                                     \
        << ::kiln::describe_mismatch(kiln_a_, kiln_e_, rtol, atol);                                 \
  } while (0)

// Asserts that `stmt` throws kiln::Error with the given code and a message containing `substr`.
#define EXPECT_KILN_ERROR(stmt, code_, substr)                                                     \
  do {                                                                                              \
    try {                                                                                           \
      (void)(stmt);                                                                                 \
      ADD_FAILURE() << "expected " #code_ " from: " #stmt;                                          \
    } catch (const ::kiln::Error& e) {                                                              \
      EXPECT_EQ(e.code(), ::kiln::ErrorCode::code_) << e.what();                                    \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                              \
          << "message '" << e.what() << "' lacks '" << substr << "'";                               \
    }                                                                                               \
  } while (0)
