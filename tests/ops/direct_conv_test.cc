// The direct NHWC convolution (src/backends/cpu/direct_conv.h) against f64
// direct loops: the kernel itself over every tile width, filter sizes 1-5,
// asymmetric padding, channel counts that are not multiples of 8, bias and
// ReLU, at each ISA level (the AVX2 tiles, the AVX-512 one); the backward-data problem
// (flipped, transposed filter); and the conv2d
// ops with the kernel on and off (KILN_DIRECT_CONV), which must agree.
#include "backends/cpu/direct_conv.h"

#include "isa_levels.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using cpu::direct_conv::Problem;
namespace dc = cpu::direct_conv;

void kernel_matches_f64_loops();
void backward_data_matches_f64_loops();
void filter_gradient_matches_f64_loops();

Problem problem(int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh, int64_t kw,
                std::vector<int64_t> pads) {
  Problem p;
  p.n = n, p.h = h, p.w = w, p.c = c, p.o = o, p.kh = kh, p.kw = kw;
  p.pt = pads[0], p.pb = pads[1], p.pl = pads[2], p.pr = pads[3];
  return p;
}

ops::Conv2dOptions options(const Problem& p) {
  ops::Conv2dOptions o;
  o.padding = ops::Padding::explicit_pads({p.pt, p.pb, p.pl, p.pr});
  return o;
}

std::vector<Problem> problems() {
  std::vector<Problem> ps = {
      problem(2, 14, 14, 32, 64, 3, 3, {1, 1, 1, 1}),  // the cnn's second layer
      problem(3, 5, 7, 17, 32, 3, 3, {1, 1, 1, 1}),    // c not a multiple of 8
      problem(1, 6, 9, 8, 16, 1, 1, {0, 0, 0, 0}),     // 1x1
      problem(2, 9, 11, 12, 48, 5, 5, {2, 2, 2, 2}),   // 5x5
      problem(1, 7, 8, 9, 16, 2, 3, {0, 1, 2, 0}),     // even kh, asymmetric pads
      problem(1, 6, 6, 16, 16, 3, 3, {0, 0, 0, 0}),    // valid (no padding)
      problem(2, 4, 30, 8, 32, 3, 1, {1, 1, 0, 0}),    // a wide row: many tiles
  };
  for (int64_t w = 1; w <= 13; ++w) ps.push_back(problem(1, 3, w, 8, 16, 3, 3, {1, 1, 1, 1}));  // widths 1..13
  // Fewer than 8 input channels (the small tile: kw * c taps known at compile time).
  const std::vector<Problem> few = {
      problem(2, 28, 28, 1, 32, 3, 3, {1, 1, 1, 1}),  // the cnn's first layer
      problem(1, 9, 10, 1, 16, 5, 5, {2, 2, 2, 2}),   // 5x5, 16-channel groups
      problem(2, 7, 9, 3, 48, 3, 3, {1, 1, 1, 1}),    // RGB 3x3 (9 taps), o not a multiple of 32
      problem(1, 6, 13, 2, 64, 3, 3, {0, 1, 1, 0}),   // 2 channels, asymmetric pads
      problem(1, 5, 11, 1, 32, 1, 7, {0, 0, 3, 3}),   // 1x7: 7 taps
      problem(1, 4, 4, 1, 32, 1, 1, {0, 0, 0, 0}),    // 1x1: 1 tap
      problem(1, 3, 5, 4, 16, 2, 2, {1, 0, 0, 1}),    // 4 channels x 2 columns: 8 taps
  };
  ps.insert(ps.end(), few.begin(), few.end());
  for (int64_t w = 1; w <= 13; ++w) {  // every tile width of both group sizes
    ps.push_back(problem(1, 2, w, 1, 32, 3, 3, {1, 1, 1, 1}));
    ps.push_back(problem(1, 2, w, 3, 16, 3, 3, {1, 1, 1, 1}));
  }
  return ps;
}

std::string name(const Problem& p) {
  return "n" + std::to_string(p.n) + " h" + std::to_string(p.h) + " w" + std::to_string(p.w) + " c" +
         std::to_string(p.c) + " o" + std::to_string(p.o) + " k" + std::to_string(p.kh) + "x" + std::to_string(p.kw);
}

// Both algorithms for 3x3 filters: Winograd F(2x2, 3x3) where it applies, the direct
// tiles (KILN_WINOGRAD=0, or allow_winograd off).
std::vector<Problem> both_algorithms(std::vector<Problem> ps) {
  const size_t n = ps.size();
  for (size_t i = 0; i < n; ++i) {
    if (!dc::uses_winograd(ps[i])) continue;
    Problem q = ps[i];
    q.allow_winograd = false;
    ps.push_back(q);
  }
  return ps;
}

std::string name(const Problem& p, bool with_algorithm) {
  return name(p) + (with_algorithm && dc::uses_winograd(p) ? " winograd" : "");
}

TEST(DirectConv, WinogradTakesThe3x3LayersItShould) {
  Problem p = problem(2, 14, 14, 32, 64, 3, 3, {1, 1, 1, 1});
  EXPECT_TRUE(dc::uses_winograd(p));
  EXPECT_EQ(dc::packed_size(p), size_t(16 * 32 * 64));  // the transformed filter
  EXPECT_TRUE(dc::uses_winograd(dc::backward_data_problem(p)));
  Problem q = p;
  q.allow_winograd = false;
  EXPECT_FALSE(dc::uses_winograd(q));
  EXPECT_FALSE(dc::uses_winograd(dc::backward_data_problem(q)));
  EXPECT_EQ(dc::packed_size(q), size_t(9 * 32 * 64));
  q = p;
  q.kh = q.kw = 5;
  EXPECT_FALSE(dc::uses_winograd(q));
  q = p;
  q.c = 12;  // not a multiple of 8
  EXPECT_FALSE(dc::uses_winograd(q));
  q.c = 1;  // the small-channel tile
  EXPECT_FALSE(dc::uses_winograd(q));
  ScopedKernelPreferences off([](KernelPreferences& k) { k.winograd = false; });
  EXPECT_FALSE(dc::uses_winograd(p));
}

void kernel_matches_f64_loops() {
  for (const Problem& p : both_algorithms(problems())) {
    SCOPED_TRACE(name(p, true));
    ASSERT_TRUE(dc::supports(p)) << "the kernel must handle this shape (built without AVX2?)";
    const Tensor x = rand_tensor({p.n, p.h, p.w, p.c}, DType::kF64, -1, 1, 1);
    const Tensor w = rand_tensor({p.kh, p.kw, p.c, p.o}, DType::kF64, -1, 1, 2);
    const Tensor b = rand_tensor({p.o}, DType::kF64, -1, 1, 3);
    const Tensor x32 = x.to(DType::kF32), w32 = w.to(DType::kF32), b32 = b.to(DType::kF32);
    std::vector<float> packed(dc::packed_size(p));
    dc::pack_filter(p, w32.data<float>(), packed.data());
    for (const bool relu : {false, true}) {
      for (const bool bias : {false, true}) {
        SCOPED_TRACE(std::string(relu ? "relu" : "linear") + (bias ? " bias" : ""));
        Tensor ref = bias ? ops::conv2d(x, w, options(p), b) : ops::conv2d(x, w, options(p));
        if (relu) ref = ops::relu(ref);
        ASSERT_EQ(ref.shape(), Shape({p.n, p.oh(), p.ow(), p.o}));
        Tensor y = Tensor::zeros(ref.shape(), DType::kF32);
        dc::run(p, x32.data<float>(), packed.data(), bias ? b32.data<float>() : nullptr, y.data<float>(), relu);
        EXPECT_CLOSE(y, ref, 1e-4, 1e-4);
      }
    }
  }
}

void backward_data_matches_f64_loops() {
  for (Problem p : both_algorithms(problems())) {
    std::swap(p.c, p.o);  // the backward problem's output channels (p.c) must be
                          // a multiple of 16
    if (p.c % 16 != 0 || p.o < 8) continue;
    SCOPED_TRACE(name(p) + (dc::uses_winograd(dc::backward_data_problem(p)) ? " winograd" : ""));
    const Problem bp = dc::backward_data_problem(p);
    ASSERT_TRUE(dc::supports(bp));
    EXPECT_EQ(bp.oh(), p.h);
    EXPECT_EQ(bp.ow(), p.w);
    const Tensor w = rand_tensor({p.kh, p.kw, p.c, p.o}, DType::kF64, -1, 1, 4);
    const Tensor dy = rand_tensor({p.n, p.oh(), p.ow(), p.o}, DType::kF64, -1, 1, 5);
    const Tensor ref = ops::conv2d_backward_data(dy, w, {p.n, p.h, p.w, p.c}, options(p));
    const Tensor w32 = w.to(DType::kF32), dy32 = dy.to(DType::kF32);
    std::vector<float> packed(dc::packed_size(bp));
    dc::pack_filter_backward(p, w32.data<float>(), packed.data());
    Tensor dx = Tensor::zeros(ref.shape(), DType::kF32);
    dc::run(bp, dy32.data<float>(), packed.data(), nullptr, dx.data<float>(), false);
    EXPECT_CLOSE(dx, ref, 1e-4, 1e-4);
  }
}

// At each ISA level: the AVX2 tiles and the AVX-512 ones (up to four 16-channel blocks).
TEST(DirectConv, KernelMatchesF64Loops) {
  at_each_isa_level([] { kernel_matches_f64_loops(); });
}

TEST(DirectConv, BackwardDataProblemMatchesF64Loops) {
  at_each_isa_level([] { backward_data_matches_f64_loops(); });
}

TEST(DirectConv, FilterGradientMatchesF64Loops) {
  at_each_isa_level([] { filter_gradient_matches_f64_loops(); });
}

void filter_gradient_matches_f64_loops() {
  std::vector<Problem> ps = problems();
  ps.push_back(problem(3, 28, 28, 1, 32, 3, 3, {1, 1, 1, 1}));  // the cnn's first layer: c = 1
  ps.push_back(problem(2, 6, 5, 3, 16, 2, 2, {1, 0, 0, 1}));    // c = 3, even filter, asymmetric pads
  for (const Problem& p : both_algorithms(ps)) {
    SCOPED_TRACE(name(p, true));
    ASSERT_TRUE(dc::supports_backward_filter(p));
    const Tensor x = rand_tensor({p.n, p.h, p.w, p.c}, DType::kF64, -1, 1, 10);
    const Tensor dy = rand_tensor({p.n, p.oh(), p.ow(), p.o}, DType::kF64, -1, 1, 11);
    const Tensor ref = ops::conv2d_backward_filter(x, dy, {p.kh, p.kw, p.c, p.o}, options(p));
    const Tensor x32 = x.to(DType::kF32), dy32 = dy.to(DType::kF32);
    Tensor dw = Tensor::zeros(ref.shape(), DType::kF32);
    dc::backward_filter(p, x32.data<float>(), dy32.data<float>(), dw.data<float>());
    EXPECT_CLOSE(dw, ref, 1e-4, 1e-3);  // sums of up to 2 * 28 * 28 products
  }
}

// Which problems the conv ops hand to oneDNN where it runs AVX-512: those of the
// general tile, not Winograd's or the small-channel tile's.
TEST(DirectConv, GeneralTileProblems) {
  Problem p = problem(1, 14, 14, 32, 64, 3, 3, {1, 1, 1, 1});
  EXPECT_FALSE(dc::uses_general_tile(p));  // Winograd
  p.allow_winograd = false;                // an eager call on one image
  EXPECT_TRUE(dc::uses_general_tile(p));
  EXPECT_TRUE(dc::uses_general_tile(dc::backward_data_problem(p)));
  Problem q = p;
  q.c = 1;  // a first layer on grey images: the small-channel tile
  EXPECT_FALSE(dc::uses_general_tile(q));
  q = p;
  q.kh = q.kw = 5;  // no Winograd for 5x5
  q.allow_winograd = true;
  EXPECT_TRUE(dc::uses_general_tile(q));
  q.o = 24;  // not handled at all
  EXPECT_FALSE(dc::uses_general_tile(q));
  {
    ScopedKernelPreferences dflt([](KernelPreferences& k) { k.direct_conv = DirectConv::kAuto; });
    EXPECT_FALSE(dc::general_tile_forced());
  }
  ScopedKernelPreferences on([](KernelPreferences& k) { k.direct_conv = DirectConv::kForceTile; });
  EXPECT_TRUE(dc::general_tile_forced());
}

TEST(DirectConv, ShapesItDoesNotHandle) {
  Problem p = problem(1, 8, 8, 16, 16, 3, 3, {1, 1, 1, 1});
  EXPECT_TRUE(dc::supports(p));
  Problem q = p;
  q.o = 24;  // not a multiple of 16
  EXPECT_FALSE(dc::supports(q));
  q = p;
  q.c = 4;  // 4 channels x 3 columns: too many taps for the small tile, too few channels for the other
  EXPECT_FALSE(dc::supports(q));
  q.c = 3;  // RGB 3x3: 9 taps, the small tile
  EXPECT_TRUE(dc::supports(q));
  q.kw = 5;  // 15 taps
  EXPECT_FALSE(dc::supports(q));
  q = p;
  q.pt = -1;  // a backward problem whose forward padding exceeds the filter
  EXPECT_FALSE(dc::supports(q));
  q = p;
  q.kh = 12;  // filter taller than the padded input
  EXPECT_FALSE(dc::supports(q));
  EXPECT_FALSE(dc::supports_backward_filter(q));
  q = p;
  q.c = 1;  // the filter gradient takes any input channel count
  EXPECT_TRUE(dc::supports_backward_filter(q));
  q.o = 8;
  EXPECT_FALSE(dc::supports_backward_filter(q));
}

TEST(DirectConv, Conv2dOpsAgreeWithAndWithoutIt) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(name(p));
    const Tensor x = rand_tensor({p.n, p.h, p.w, p.c}, DType::kF32, -1, 1, 6);
    const Tensor w = rand_tensor({p.kh, p.kw, p.c, p.o}, DType::kF32, -1, 1, 7);
    const Tensor b = rand_tensor({p.o}, DType::kF32, -1, 1, 8);
    const Tensor dy = rand_tensor({p.n, p.oh(), p.ow(), p.o}, DType::kF32, -1, 1, 9);
    Tensor y, dx, dw;
    {
      // the general tile too where oneDNN runs AVX-512
      ScopedKernelPreferences on([](KernelPreferences& k) { k.direct_conv = DirectConv::kForceTile; });
      y = ops::conv2d(x, w, options(p), b);
      dx = ops::conv2d_backward_data(dy, w, x.shape(), options(p));
      dw = ops::conv2d_backward_filter(x, dy, w.shape(), options(p));
    }
    ScopedKernelPreferences off([](KernelPreferences& k) { k.direct_conv = DirectConv::kOff; });
    ASSERT_FALSE(dc::supports(p));
    EXPECT_CLOSE(y, ops::conv2d(x, w, options(p), b), 1e-4, 1e-4);
    EXPECT_CLOSE(dx, ops::conv2d_backward_data(dy, w, x.shape(), options(p)), 1e-4, 1e-4);
    EXPECT_CLOSE(dw, ops::conv2d_backward_filter(x, dy, w.shape(), options(p)), 1e-4, 1e-3);
  }
}

}  // namespace
}  // namespace kiln::testing
