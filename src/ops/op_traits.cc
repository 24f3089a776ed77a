// Op traits in one place (kiln/core/op_def.h, OpTraits): what the executor, the
// mixed-precision pass and elementwise fusion read instead of lists of op names. The
// registry self-test (tests/ops/registry_test.cc) reports a name here that no op defines.
#include "kiln/core/op_def.h"

namespace kiln {
namespace {

constexpr OpTraits view() {
  OpTraits t;
  t.view = true;
  t.amp = AmpClass::kClear;
  return t;
}
constexpr OpTraits heavy(AmpClass amp) {
  OpTraits t;
  t.heavy = true;
  t.amp = amp;
  return t;
}
constexpr OpTraits amp(AmpClass a, ElementwiseArity e = ElementwiseArity::kNone) {
  OpTraits t;
  t.amp = a;
  t.elementwise = e;
  return t;
}
constexpr OpTraits fusable(ElementwiseArity e) { return amp(AmpClass::kDeny, e); }

constexpr auto kUnary = ElementwiseArity::kUnary;
constexpr auto kBinary = ElementwiseArity::kBinary;

// The buffer-sharing reshape.
KILN_REGISTER_OP_TRAITS("reshape", view());

// Matmuls and convolutions: heavy; 16-bit under mixed precision (the fused forms stay
// f32: fusion runs after the mixed-precision pass and its kernels are f32).
KILN_REGISTER_OP_TRAITS("matmul", heavy(AmpClass::kAllow));
KILN_REGISTER_OP_TRAITS("conv2d", heavy(AmpClass::kAllow));
KILN_REGISTER_OP_TRAITS("conv2d_backward_data", heavy(AmpClass::kAllow));
KILN_REGISTER_OP_TRAITS("conv2d_backward_filter", heavy(AmpClass::kAllow));
KILN_REGISTER_OP_TRAITS("fused_matmul", heavy(AmpClass::kDeny));
KILN_REGISTER_OP_TRAITS("fused_conv2d", heavy(AmpClass::kDeny));

// Elementwise arithmetic and activations: 16-bit between 16-bit ops; fusable in f32.
KILN_REGISTER_OP_TRAITS("add", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("sub", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("mul", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("maximum", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("minimum", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("relu_grad", amp(AmpClass::kInfer, kBinary));
KILN_REGISTER_OP_TRAITS("neg", amp(AmpClass::kInfer, kUnary));
KILN_REGISTER_OP_TRAITS("relu", amp(AmpClass::kInfer, kUnary));
KILN_REGISTER_OP_TRAITS("tanh", amp(AmpClass::kInfer, kUnary));
KILN_REGISTER_OP_TRAITS("sigmoid", amp(AmpClass::kInfer, kUnary));
KILN_REGISTER_OP_TRAITS("leaky_relu", amp(AmpClass::kInfer));
KILN_REGISTER_OP_TRAITS("gelu", amp(AmpClass::kInfer));
KILN_REGISTER_OP_TRAITS("max_pool2d", amp(AmpClass::kInfer));
KILN_REGISTER_OP_TRAITS("max_pool2d_backward", amp(AmpClass::kInfer));
KILN_REGISTER_OP_TRAITS("avg_pool2d", amp(AmpClass::kInfer));
KILN_REGISTER_OP_TRAITS("avg_pool2d_backward", amp(AmpClass::kInfer));

// Fusable, but f32 under mixed precision (precision-sensitive).
KILN_REGISTER_OP_TRAITS("div", fusable(kBinary));
KILN_REGISTER_OP_TRAITS("abs", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("square", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("exp", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("log", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("log1p", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("sqrt", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("rsqrt", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("reciprocal", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("sin", fusable(kUnary));
KILN_REGISTER_OP_TRAITS("cos", fusable(kUnary));

// Data movement: follows its inputs under mixed precision.
KILN_REGISTER_OP_TRAITS("transpose", amp(AmpClass::kClear));
KILN_REGISTER_OP_TRAITS("concat", amp(AmpClass::kClear));
KILN_REGISTER_OP_TRAITS("pad", amp(AmpClass::kClear));
KILN_REGISTER_OP_TRAITS("stop_gradient", amp(AmpClass::kClear));

}  // namespace
}  // namespace kiln
