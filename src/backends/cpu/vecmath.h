#pragma once
// Declares glibc's libmvec SIMD variants of libm functions so that `#pragma omp
// simd` loops calling them vectorise (glibc >= 2.35 has exp/log/log1p/expm1/tanh/
// erf/sin/cos/pow in 4- and 8-lane AVX2 forms). Internal to the CPU backend.
extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
float logf(float) noexcept;
#pragma omp declare simd notinbranch
float log1pf(float) noexcept;
#pragma omp declare simd notinbranch
float expm1f(float) noexcept;
#pragma omp declare simd notinbranch
float tanhf(float) noexcept;
#pragma omp declare simd notinbranch
float erff(float) noexcept;
#pragma omp declare simd notinbranch
float erfcf(float) noexcept;
#pragma omp declare simd notinbranch
float sinf(float) noexcept;
#pragma omp declare simd notinbranch
float cosf(float) noexcept;
#pragma omp declare simd notinbranch
float powf(float, float) noexcept;
#pragma omp declare simd notinbranch
double exp(double) noexcept;
#pragma omp declare simd notinbranch
double log(double) noexcept;
#pragma omp declare simd notinbranch
double log1p(double) noexcept;
#pragma omp declare simd notinbranch
double expm1(double) noexcept;
#pragma omp declare simd notinbranch
double tanh(double) noexcept;
#pragma omp declare simd notinbranch
double erf(double) noexcept;
#pragma omp declare simd notinbranch
double erfc(double) noexcept;
#pragma omp declare simd notinbranch
double sin(double) noexcept;
#pragma omp declare simd notinbranch
double cos(double) noexcept;
#pragma omp declare simd notinbranch
double pow(double, double) noexcept;
}
#include <cmath>

namespace kiln::cpu::vm {
inline float exp(float x) { return ::expf(x); }
inline double exp(double x) { return ::exp(x); }
inline float log(float x) { return ::logf(x); }
inline double log(double x) { return ::log(x); }
inline float log1p(float x) { return ::log1pf(x); }
inline double log1p(double x) { return ::log1p(x); }
inline float expm1(float x) { return ::expm1f(x); }
inline double expm1(double x) { return ::expm1(x); }
inline float tanh(float x) { return ::tanhf(x); }
inline double tanh(double x) { return ::tanh(x); }
inline float erf(float x) { return ::erff(x); }
inline double erf(double x) { return ::erf(x); }
inline float erfc(float x) { return ::erfcf(x); }
inline double erfc(double x) { return ::erfc(x); }
inline float sin(float x) { return ::sinf(x); }
inline double sin(double x) { return ::sin(x); }
inline float cos(float x) { return ::cosf(x); }
inline double cos(double x) { return ::cos(x); }
inline float pow(float x, float y) { return ::powf(x, y); }
inline double pow(double x, double y) { return ::pow(x, y); }
}  // namespace kiln::cpu::vm
