#include "kernel_selection.h"

#include "onednn.h"
#include "packed_gemm.h"
#include "small_gemm.h"

namespace kiln::cpu {

MatmulAlgo select_matmul(const MatmulProblem& p) {
  const int64_t rows = p.batch * p.M;
  if (rows == 0 || p.N == 0) return MatmulAlgo::kNothing;
  if (p.K == 0) return MatmulAlgo::kZeros;
  if (p.constant_b && !p.trans_a && p.b_rank == 2) {
    if (small_gemm::supports(rows, p.K, p.N)) return MatmulAlgo::kSmallGemm;
    if (rows <= kPackedGemmMaxRows && packed_gemm::available()) return MatmulAlgo::kPackedGemm;
  }
  if (!p.fused && p.trans_a && !p.trans_b && p.batch == 1 && p.a_rank == 2 && p.b_rank == 2 &&
      p.K <= kWeightGradientMaxK && p.M >= kWeightGradientMinM && packed_gemm::available())
    return MatmulAlgo::kWeightGradient;
  if (p.fused && p.M < kFusedPostOpsMinRows) return MatmulAlgo::kOneDnnThenBias;
  return MatmulAlgo::kOneDnn;
}

const char* algo_name(MatmulAlgo a) {
  switch (a) {
    case MatmulAlgo::kNothing: return "nothing";
    case MatmulAlgo::kZeros: return "zeros";
    case MatmulAlgo::kSmallGemm: return "small_gemm";
    case MatmulAlgo::kPackedGemm: return "packed_gemm";
    case MatmulAlgo::kWeightGradient: return "weight_gradient";
    case MatmulAlgo::kOneDnnThenBias: return "onednn_then_bias";
    case MatmulAlgo::kOneDnn: return "onednn";
  }
  return "?";
}

namespace {

// Problems the direct kernel's general tile would run, where oneDNN's AVX-512 kernels
// are faster (direct_conv::uses_general_tile; its filter gradient is level with them).
bool to_onednn(const direct_conv::Problem& p) {
  return direct_conv::uses_general_tile(p) && onednn::runs_avx512() && !direct_conv::general_tile_forced();
}

// The direct kernel's forward problem for `g` (NHWC, one group, unit strides and
// dilations); false when it has none.
bool direct_problem(const nn_geometry::Conv2dGeometry& g, bool allow_winograd, direct_conv::Problem& p) {
  const auto& v = g.win;
  if (g.nchw || g.groups != 1 || v.sh != 1 || v.sw != 1 || v.dh != 1 || v.dw != 1) return false;
  p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.o = g.o;
  p.kh = v.kh, p.kw = v.kw, p.pt = v.pt, p.pb = v.pb, p.pl = v.pl, p.pr = v.pr;
  p.allow_winograd = allow_winograd || p.n * p.oh() * p.ow() >= kEagerWinogradPixels;
  return p.oh() == v.oh && p.ow() == v.ow;
}

bool empty(const nn_geometry::Conv2dGeometry& g) {
  return g.n == 0 || g.o == 0 || g.win.oh == 0 || g.win.ow == 0;
}

}  // namespace

ConvAlgo select_conv_forward(const nn_geometry::Conv2dGeometry& g, bool constant_filter, direct_conv::Problem* dp) {
  if (empty(g)) return ConvAlgo::kNothing;
  return direct_problem(g, constant_filter, *dp) && direct_conv::supports(*dp) && !to_onednn(*dp) ? ConvAlgo::kDirect
                                                                                                  : ConvAlgo::kOneDnn;
}

ConvAlgo select_conv_backward_data(const nn_geometry::Conv2dGeometry& g, direct_conv::Problem* dp) {
  if (!direct_problem(g, false, *dp) || !direct_conv::supports(*dp) || to_onednn(*dp)) return ConvAlgo::kOneDnn;
  const direct_conv::Problem bp = direct_conv::backward_data_problem(*dp);
  return direct_conv::supports(bp) && !to_onednn(bp) ? ConvAlgo::kDirect : ConvAlgo::kOneDnn;
}

ConvAlgo select_conv_backward_filter(const nn_geometry::Conv2dGeometry& g, direct_conv::Problem* dp) {
  return direct_problem(g, false, *dp) && direct_conv::supports_backward_filter(*dp) ? ConvAlgo::kDirect
                                                                                     : ConvAlgo::kOneDnn;
}

const char* algo_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::kNothing: return "nothing";
    case ConvAlgo::kDirect: return "direct";
    case ConvAlgo::kOneDnn: return "onednn";
  }
  return "?";
}

}  // namespace kiln::cpu
