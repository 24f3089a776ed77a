// conv2d, fused_conv2d, conv2d_backward_data, conv2d_backward_filter on CUDA: cuDNN's
// convolution API.
//
// Activations keep the op's layout (NHWC or NCHW, given to cuDNN as such). Filters:
// NCHW's OIHW is cuDNN's KCRS; NHWC's HWIO has no cuDNN equivalent and is transposed
// (one 2-d transpose, [kh*kw*I, O] <-> [O, kh*kw*I]) to/from KRSC in a temporary.
// cuDNN pads symmetrically: asymmetric padding ("same" with an even window or a stride
// that does not divide the input, or explicit) zero-pads the input into a temporary
// and runs unpadded (backward data computes the padded gradient and crops it).
//
// Math: f16/bf16 on Tensor Cores with f32 accumulation; f32 on TF32 Tensor Cores when
// allow_tf32(), FMA only otherwise; f64 in double. The algorithm of each problem
// (direction, dtype, shapes, window, layout, pointer alignment) is found once with
// cudnnFind*AlgorithmEx (timed runs on the real buffers; a heuristic when that fails)
// and cached. Bias (+ ReLU) of conv2d / fused_conv2d: cudnnConvolutionBiasActivationForward
// for ReLU with a bias of the input's dtype, else the convolution then one
// bias/activation pass (matmul_launch.h).
#include <cudnn.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "conv_launch.h"
#include "cuda_error.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"
#include "../common/composite_kernels.h"
#include "../common/nn_geometry.h"
#include "matmul_launch.h"
#include "pool_launch.h"

namespace kiln::cuda {
namespace {

using nn_geometry::Conv2dGeometry;
using nn_geometry::conv2d_geometry;

constexpr size_t kFindWorkspaceBytes = size_t{128} << 20;

enum class Dir { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::kF32: return CUDNN_DATA_FLOAT;
    case DType::kF16: return CUDNN_DATA_HALF;
    case DType::kBF16: return CUDNN_DATA_BFLOAT16;
    case DType::kF64: return CUDNN_DATA_DOUBLE;
    default: throw InternalError("conv2d: no cuDNN type for dtype " + std::string(dtype_name(t)));
  }
}

cudnnMathType_t math_type(DType t) {
  switch (t) {
    case DType::kF16:
    case DType::kBF16: return CUDNN_TENSOR_OP_MATH;
    case DType::kF32: return allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

// ---- descriptor ownership ------------------------------------------------------------------

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};
struct ActDesc {
  cudnnActivationDescriptor_t d = nullptr;
  ActDesc() { KILN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&d)); }
  ~ActDesc() { cudnnDestroyActivationDescriptor(d); }
  ActDesc(const ActDesc&) = delete;
  ActDesc& operator=(const ActDesc&) = delete;
};

int to_int(int64_t v, const char* what) {
  if (v > 0x7fffffff) throw UnimplementedError(std::string("conv2d on CUDA: ") + what + " too large for cuDNN");
  return static_cast<int>(v);
}

// ---- one convolution as cuDNN sees it ----------------------------------------------------

struct Conv {
  Conv2dGeometry g;
  DType dtype = DType::kF32;
  bool padded = false;   // asymmetric padding: the input is zero-padded into a temporary
  int64_t hp = 0, wp = 0;  // input height and width as cuDNN sees them
  int64_t ph = 0, pw = 0;  // cuDNN's (symmetric) padding
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;

  Conv(const Conv2dGeometry& geom, DType t) : g(geom), dtype(t) {
    const auto& v = g.win;
    padded = v.pt != v.pb || v.pl != v.pr;
    hp = padded ? g.h + v.pt + v.pb : g.h;
    wp = padded ? g.w + v.pl + v.pr : g.w;
    ph = padded ? 0 : v.pt;
    pw = padded ? 0 : v.pl;
    const cudnnTensorFormat_t fmt = g.nchw ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
    const cudnnDataType_t dt = cudnn_dtype(t);
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.d, fmt, dt, to_int(g.n, "batch"), to_int(g.c, "channels"),
                                                to_int(hp, "height"), to_int(wp, "width")));
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.d, fmt, dt, to_int(g.n, "batch"), to_int(g.o, "channels"),
                                                to_int(v.oh, "height"), to_int(v.ow, "width")));
    KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.d, dt, fmt, to_int(g.o, "channels"),
                                                to_int(g.cin_per_group(), "channels"), to_int(v.kh, "window"),
                                                to_int(v.kw, "window")));
    KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.d, to_int(ph, "padding"), to_int(pw, "padding"),
                                                     to_int(v.sh, "stride"), to_int(v.sw, "stride"),
                                                     to_int(v.dh, "dilation"), to_int(v.dw, "dilation"),
                                                     CUDNN_CROSS_CORRELATION,
                                                     t == DType::kF64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.d, to_int(g.groups, "groups")));
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, math_type(t)));
  }

  // NHWC filters: HWIO = [kh*kw*I, O], cuDNN's KRSC = [O, kh*kw*I]; identical when either is 1.
  bool filter_transposed() const { return !g.nchw && g.o > 1 && g.win.kh * g.win.kw * g.cin_per_group() > 1; }
  int64_t filter_rows() const { return g.win.kh * g.win.kw * g.cin_per_group(); }

  std::string key(const DeviceContext& ctx, Dir dir, uint64_t align) const {
    const auto& v = g.win;
    const int64_t a[] = {ctx.logical, static_cast<int64_t>(dir), static_cast<int64_t>(dtype), math_type(dtype),
                         g.nchw, g.n, g.c, hp, wp, g.o, g.groups, v.kh, v.kw, v.sh, v.sw, v.dh, v.dw, ph, pw,
                         static_cast<int64_t>(align)};
    return std::string(reinterpret_cast<const char*>(a), sizeof a);
  }
};

// Largest power of two (<= 16) dividing every address.
uint64_t alignment_of(std::initializer_list<const void*> ptrs) {
  uint64_t bits = 16;
  for (const void* p : ptrs) bits |= static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  return bits & (~bits + 1);
}

// ---- algorithm cache -------------------------------------------------------------------------

struct Algo {
  int algo = 0;
  size_t ws = 0;
  bool fused_ok = true;  // cudnnConvolutionBiasActivationForward accepted it (forward only)
};

std::mutex g_algo_mu;
std::unordered_map<std::string, Algo> g_algos;

// Picks the first successful result of a (time-ordered) Find or heuristic list.
template <typename Perf>
bool pick(const Perf* perf, int n, Algo& out) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) {
      out.algo = static_cast<int>(perf[i].algo);
      out.ws = perf[i].memory;
      return true;
    }
  return false;
}

// The cached algorithm of `c` in direction `dir` for these buffers, found on first use
// (the Find runs write the result buffer, which the caller then overwrites).
Algo find_algo(KernelScope& s, cudnnHandle_t h, const Conv& c, Dir dir, const void* x, const void* w, void* y) {
  const std::string key = c.key(s.ctx, dir, alignment_of({x, w, y}));
  std::lock_guard<std::mutex> lock(g_algo_mu);
  auto it = g_algos.find(key);
  if (it != g_algos.end()) return it->second;
  void* ws = nullptr;
  size_t ws_size = kFindWorkspaceBytes;
  try {
    ws = workspace(s.ctx, ws_size);
  } catch (const ResourceExhaustedError&) {
    ws_size = 0;
  }
  Algo a;
  bool ok = false;
  constexpr int kMax = 16;
  int n = 0;
  switch (dir) {
    case Dir::kForward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      if (cudnnFindConvolutionForwardAlgorithmEx(h, c.x.d, x, c.w.d, w, c.conv.d, c.y.d, y, kMax, &n, perf, ws,
                                                 ws_size) == CUDNN_STATUS_SUCCESS)
        ok = pick(perf, n, a);
      if (!ok) {
        KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.x.d, c.w.d, c.conv.d, c.y.d, kMax, &n, perf));
        ok = pick(perf, n, a);
      }
      break;
    }
    case Dir::kBackwardData: {  // x: dy, y: dx
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      if (cudnnFindConvolutionBackwardDataAlgorithmEx(h, c.w.d, w, c.y.d, x, c.conv.d, c.x.d, y, kMax, &n, perf, ws,
                                                      ws_size) == CUDNN_STATUS_SUCCESS)
        ok = pick(perf, n, a);
      if (!ok) {
        KILN_CUDNN_CHECK(
            cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w.d, c.y.d, c.conv.d, c.x.d, kMax, &n, perf));
        ok = pick(perf, n, a);
      }
      break;
    }
    case Dir::kBackwardFilter: {  // w: dy, y: dw
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      if (cudnnFindConvolutionBackwardFilterAlgorithmEx(h, c.x.d, x, c.y.d, w, c.conv.d, c.w.d, y, kMax, &n, perf,
                                                        ws, ws_size) == CUDNN_STATUS_SUCCESS)
        ok = pick(perf, n, a);
      if (!ok) {
        KILN_CUDNN_CHECK(
            cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x.d, c.y.d, c.conv.d, c.w.d, kMax, &n, perf));
        ok = pick(perf, n, a);
      }
      break;
    }
  }
  if (!ok)
    throw UnimplementedError("conv2d on CUDA: cuDNN has no algorithm for input " + c.g.input_shape().str() +
                             ", filter " + c.g.filter_shape().str() + " (" + std::string(dtype_name(c.dtype)) + ")");
  g_algos.emplace(key, a);
  return a;
}

void mark_unfusable(KernelScope& s, const Conv& c, const void* x, const void* w, void* y) {
  std::lock_guard<std::mutex> lock(g_algo_mu);
  auto it = g_algos.find(c.key(s.ctx, Dir::kForward, alignment_of({x, w, y})));
  if (it != g_algos.end()) it->second.fused_ok = false;
}

// alpha = 1, beta = 0 in the scaling type cuDNN wants (double for f64, else float).
struct Scale {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scale(DType t) : dbl(t == DType::kF64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
};

// ---- kernels -------------------------------------------------------------------------------

// The input as cuDNN reads it: x itself, or x zero-padded into `tmp`.
const void* padded_input(KernelScope& s, const Conv& c, const Tensor& x, Tensor& tmp) {
  if (!c.padded) return x.raw_data();
  const auto& g = c.g;
  tmp = Tensor::empty(g.nchw ? Shape{g.n, g.c, c.hp, c.wp} : Shape{g.n, c.hp, c.wp, g.c}, x.dtype(), x.device());
  launch_window_copy(x.raw_data(), tmp.raw_data(), x.itemsize(), g.nchw, g.n, g.c, g.h, g.w, c.hp, c.wp, -g.win.pt,
                     -g.win.pl, s.stream);
  return tmp.raw_data();
}

// The filter as cuDNN reads it: w itself (OIHW, or HWIO when equal to KRSC) or KRSC in `tmp`.
const void* cudnn_filter(KernelScope& s, const Conv& c, const Tensor& w, Tensor& tmp) {
  if (!c.filter_transposed()) return w.raw_data();
  const auto& g = c.g;
  tmp = Tensor::empty(Shape{g.o, g.win.kh, g.win.kw, g.cin_per_group()}, w.dtype(), w.device());
  launch_transpose2d(w.raw_data(), tmp.raw_data(), w.itemsize(), c.filter_rows(), g.o, s.stream);
  return tmp.raw_data();
}

// conv2d / fused_conv2d into `out` (the convolution's whole output).
void conv_forward(OpContext& ctx, bool relu, Tensor& out) {
  if (out.numel() == 0) return;
  const Tensor &x = ctx.in[0], &w = ctx.in[1];
  const Conv2dGeometry g = conv2d_geometry("conv2d", x.shape(), w.shape(), ctx.attrs);
  const bool with_bias = ctx.in.size() == 3;
  const void* bias = with_bias ? ctx.in[2].raw_data() : nullptr;
  const DType bias_dtype = with_bias ? ctx.in[2].dtype() : out.dtype();
  const int64_t inner = g.nchw ? g.win.oh * g.win.ow : 1;
  KernelScope s(out);
  if (x.numel() == 0) {  // every window lies in the padding
    KILN_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), s.stream));
    launch_bias_act(out.raw_data(), out.dtype(), out.numel(), bias, bias_dtype, g.o, inner, relu, s.stream);
    return;
  }
  Conv c(g, out.dtype());
  cudnnHandle_t h = cudnn_handle(s.ctx);
  Tensor xtmp, wtmp;
  const void* xp = padded_input(s, c, x, xtmp);
  const void* wp = cudnn_filter(s, c, w, wtmp);
  void* yp = out.raw_data();
  const Algo a = find_algo(s, h, c, Dir::kForward, xp, wp, yp);
  void* ws = workspace(s.ctx, a.ws);
  const Scale sc(out.dtype());
  if (relu && with_bias && bias_dtype == out.dtype() && a.fused_ok) {
    // One pass: relu(conv(x, w) + 0 * y + bias).
    TensorDesc bd;
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bd.d, CUDNN_TENSOR_NCHW, cudnn_dtype(out.dtype()), 1,
                                                to_int(g.o, "channels"), 1, 1));
    ActDesc act;
    KILN_CUDNN_CHECK(cudnnSetActivationDescriptor(act.d, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    const cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        h, sc.one(), c.x.d, xp, c.w.d, wp, c.conv.d, static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws, a.ws,
        sc.zero(), c.y.d, yp, bd.d, bias, act.d, c.y.d, yp);
    if (st == CUDNN_STATUS_SUCCESS) return;
    mark_unfusable(s, c, xp, wp, yp);  // e.g. not supported for this algorithm: the two-pass path below
  }
  KILN_CUDNN_CHECK(cudnnConvolutionForward(h, sc.one(), c.x.d, xp, c.w.d, wp, c.conv.d,
                                           static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws, a.ws, sc.zero(), c.y.d,
                                           yp));
  launch_bias_act(yp, out.dtype(), out.numel(), bias, bias_dtype, g.o, inner, relu, s.stream);
}

void conv2d(OpContext& ctx) { conv_forward(ctx, false, ctx.out[0]); }

// With max_pool = 2 (NHWC): the convolution into a scratch tensor (or the second
// output, attr conv_output), then the 2x2 max pool (stride 2, no padding) into the
// output (and its mask, attr pool_mask).
void fused_conv2d(OpContext& ctx) {
  const bool relu = ctx.attrs.get_string("activation", "") == "relu";
  if (ctx.attrs.get_int("max_pool", 0) != 2) return conv_forward(ctx, relu, ctx.out[0]);
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  const Conv2dGeometry g = conv2d_geometry("conv2d", ctx.in[0].shape(), ctx.in[1].shape(), ctx.attrs);
  // Attr conv_output: the second output holds the convolution's output; attr pool_mask:
  // the pool's mask (kiln/ops/fused.h).
  const bool mask = ctx.attrs.get_bool("pool_mask", false);
  Tensor full = ctx.out.size() > 1 && !mask
                    ? ctx.out[1]
                    : Tensor::empty(Shape{g.n, g.win.oh, g.win.ow, g.o}, out.dtype(), out.device());
  conv_forward(ctx, relu, full);
  KernelScope s(out);
  PoolDims d;
  d.n = g.n, d.c = g.o, d.h = g.win.oh, d.w = g.win.ow;
  d.oh = g.win.oh / 2, d.ow = g.win.ow / 2;
  d.kh = d.kw = d.sh = d.sw = 2;
  launch_pool2d(full.raw_data(), out.raw_data(), out.dtype(), d, true, s.stream);
  if (mask)
    launch_pool_mask_2x2(static_cast<const float*>(full.raw_data()), static_cast<uint8_t*>(ctx.out[1].raw_data()), g.n,
                         d.oh, d.ow, g.o, relu, s.stream);
}

void conv2d_backward_data(OpContext& ctx) {
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  const Tensor &dy = ctx.in[0], &w = ctx.in[1];
  const Conv2dGeometry g =
      conv2d_geometry("conv2d_backward_data", Shape(ctx.attrs.get_ints("input_shape")), w.shape(), ctx.attrs);
  KernelScope s(dx);
  if (dy.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), s.stream));
    return;
  }
  Conv c(g, dx.dtype());
  cudnnHandle_t h = cudnn_handle(s.ctx);
  Tensor wtmp, dxtmp;
  const void* wp = cudnn_filter(s, c, w, wtmp);
  void* dxp = dx.raw_data();
  if (c.padded) {
    dxtmp = Tensor::empty(g.nchw ? Shape{g.n, g.c, c.hp, c.wp} : Shape{g.n, c.hp, c.wp, g.c}, dx.dtype(), dx.device());
    dxp = dxtmp.raw_data();
  }
  const Algo a = find_algo(s, h, c, Dir::kBackwardData, dy.raw_data(), wp, dxp);
  void* ws = workspace(s.ctx, a.ws);
  const Scale sc(dx.dtype());
  KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(h, sc.one(), c.w.d, wp, c.y.d, dy.raw_data(), c.conv.d,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), ws, a.ws,
                                                sc.zero(), c.x.d, dxp));
  if (c.padded)  // the gradient of the real input is the padded gradient's interior
    launch_window_copy(dxp, dx.raw_data(), dx.itemsize(), g.nchw, g.n, g.c, c.hp, c.wp, g.h, g.w, g.win.pt, g.win.pl,
                       s.stream);
}

void conv2d_backward_filter(OpContext& ctx) {
  Tensor& dw = ctx.out[0];
  if (dw.numel() == 0) return;
  const Tensor &x = ctx.in[0], &dy = ctx.in[1];
  const Conv2dGeometry g =
      conv2d_geometry("conv2d_backward_filter", x.shape(), Shape(ctx.attrs.get_ints("filter_shape")), ctx.attrs);
  KernelScope s(dw);
  if (dy.numel() == 0 || x.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), s.stream));
    return;
  }
  Conv c(g, dw.dtype());
  cudnnHandle_t h = cudnn_handle(s.ctx);
  Tensor xtmp, dwtmp;
  const void* xp = padded_input(s, c, x, xtmp);
  void* dwp = dw.raw_data();
  if (c.filter_transposed()) {
    dwtmp = Tensor::empty(Shape{g.o, g.win.kh, g.win.kw, g.cin_per_group()}, dw.dtype(), dw.device());
    dwp = dwtmp.raw_data();
  }
  const Algo a = find_algo(s, h, c, Dir::kBackwardFilter, xp, dy.raw_data(), dwp);
  void* ws = workspace(s.ctx, a.ws);
  const Scale sc(dw.dtype());
  KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, sc.one(), c.x.d, xp, c.y.d, dy.raw_data(), c.conv.d,
                                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), ws, a.ws,
                                                  sc.zero(), c.w.d, dwp));
  if (c.filter_transposed())  // KRSC [O, kh*kw*I] -> HWIO [kh*kw*I, O]
    launch_transpose2d(dwp, dw.raw_data(), dw.itemsize(), g.o, c.filter_rows(), s.stream);
}

KILN_REGISTER_KERNEL("conv2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, conv2d);
KILN_REGISTER_KERNEL("fused_conv2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, fused_conv2d);
KILN_REGISTER_KERNEL("conv2d_backward_data", kCUDA, KILN_CUDA_FLOAT_DTYPES, conv2d_backward_data);
KILN_REGISTER_KERNEL("conv2d_backward_filter", kCUDA, KILN_CUDA_FLOAT_DTYPES, conv2d_backward_filter);
// The pool backward into a temporary, then cuDNN's filter gradient (no fused kernel yet).
KILN_REGISTER_KERNEL("fused_conv2d_backward_filter", kCUDA, DType::kF32, backends::fused_conv2d_backward_filter_unfused);

}  // namespace
}  // namespace kiln::cuda
