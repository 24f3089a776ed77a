#include "device_util.cuh"
#include "matmul_launch.h"

namespace kiln::cuda {
namespace {

// ---- integer matmul: 16x16 shared-memory tiles, wrap-around accumulation --------------

constexpr int kTile = 16;

template <typename T, typename Acc>
__device__ __forceinline__ Acc to_acc(T v) {
  // Sign-extend, then reduce modulo 2^bits(Acc): products and sums stay exact mod 2^bits.
  return static_cast<Acc>(static_cast<int64_t>(v));
}

template <typename T, typename Acc>
__global__ void matmul_int_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t batch,
                                  int64_t M, int64_t N, int64_t K, bool ta, bool tb, BroadcastMap am,
                                  BroadcastMap bm) {
  __shared__ Acc As[kTile][kTile + 1];
  __shared__ Acc Bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t mt = (M + kTile - 1) / kTile, nt = (N + kTile - 1) / kTile;
  const int64_t tiles = batch * mt * nt;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block
    const int64_t bi = t / (mt * nt), r = t % (mt * nt);
    const int64_t m0 = r / nt * kTile, n0 = r % nt * kTile;
    const T* A = a + am.offset(bi) * M * K;
    const T* B = b + bm.offset(bi) * K * N;
    Acc acc = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kTile) {
      {
        // As[i][kk] = op(A)(m0 + i, k0 + kk); threads along x walk the contiguous dim.
        const int64_t i = ta ? tx : ty, kk = ta ? ty : tx;
        const int64_t m = m0 + i, k = k0 + kk;
        As[i][kk] = (m < M && k < K) ? to_acc<T, Acc>(ta ? A[k * M + m] : A[m * K + k]) : Acc(0);
      }
      {
        // Bs[kk][j] = op(B)(k0 + kk, n0 + j).
        const int64_t kk = tb ? tx : ty, j = tb ? ty : tx;
        const int64_t k = k0 + kk, n = n0 + j;
        Bs[kk][j] = (k < K && n < N) ? to_acc<T, Acc>(tb ? B[n * K + k] : B[k * N + n]) : Acc(0);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTile; ++kk) acc += As[ty][kk] * Bs[kk][tx];
      __syncthreads();
    }
    const int64_t m = m0 + ty, n = n0 + tx;
    if (m < M && n < N) c[(bi * M + m) * N + n] = static_cast<T>(acc);
  }
}

// ---- bias + activation -------------------------------------------------------------------

template <typename T, typename B>
__global__ void bias_act_kernel(T* __restrict__ y, int64_t n, const B* __restrict__ bias, int64_t channels,
                                int64_t inner, bool relu) {
  using C = compute_t<T>;
  const bool small = n <= 0x7fffffff;
  KILN_GRID_STRIDE_LOOP(i, n) {
    C v = load_as<C>(y, i);
    if (bias) {
      int64_t ch;
      if (small) {  // 32-bit division is several times cheaper than 64-bit
        const uint32_t u = static_cast<uint32_t>(i);
        ch = (inner == 1 ? u : u / static_cast<uint32_t>(inner)) % static_cast<uint32_t>(channels);
      } else {
        ch = (i / inner) % channels;
      }
      v += load_as<C>(bias, ch);
    }
    if (relu) v = v < C(0) ? C(0) : v;  // NaN stays NaN
    store_from(y, i, v);
  }
}

template <typename T>
void bias_act_typed(void* y, int64_t n, const void* bias, DType bias_dtype, int64_t channels, int64_t inner, bool relu,
                    cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    if (bias && bias_dtype == DType::kF32) {
      bias_act_kernel<T, float><<<grid_for(n, 4), kThreads, 0, stream>>>(
          static_cast<T*>(y), n, static_cast<const float*>(bias), channels, inner, relu);
      return;
    }
  }
  bias_act_kernel<T, T><<<grid_for(n, 4), kThreads, 0, stream>>>(static_cast<T*>(y), n, static_cast<const T*>(bias),
                                                                  channels, inner, relu);
}

}  // namespace

void launch_matmul_int(const void* a, const void* b, void* c, DType dtype, int64_t batch, int64_t M, int64_t N,
                       int64_t K, bool ta, bool tb, const BroadcastMap& a_map, const BroadcastMap& b_map,
                       cudaStream_t stream) {
  const int64_t tiles = batch * ((M + kTile - 1) / kTile) * ((N + kTile - 1) / kTile);
  if (tiles == 0) return;
  const unsigned grid = static_cast<unsigned>(tiles < 65535LL * 8 ? tiles : 65535LL * 8);
  const dim3 block(kTile, kTile);
  auto go = [&](auto tag, auto acc_tag) {
    using T = decltype(tag);
    using Acc = decltype(acc_tag);
    matmul_int_kernel<T, Acc><<<grid, block, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                          static_cast<T*>(c), batch, M, N, K, ta, tb, a_map, b_map);
  };
  switch (dtype) {
    case DType::kI8: go(int8_t{}, uint32_t{}); break;
    case DType::kU8: go(uint8_t{}, uint32_t{}); break;
    case DType::kI32: go(int32_t{}, uint32_t{}); break;
    case DType::kI64: go(int64_t{}, uint64_t{}); break;
    default: throw_bad_dtype("matmul (integer)", dtype);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_bias_act(void* y, DType dtype, int64_t n, const void* bias, DType bias_dtype, int64_t channels,
                     int64_t inner, bool relu, cudaStream_t stream) {
  if (n == 0 || (!bias && !relu)) return;
  if (channels < 1) channels = 1;
  if (inner < 1) inner = 1;
  auto fail = [&] { throw_bad_dtype("bias_act", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, bias_act_typed<T>(y, n, bias, bias_dtype, channels, inner, relu, stream))
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
