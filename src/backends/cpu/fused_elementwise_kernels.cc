// CPU kernel for fused_elementwise (kiln/ops/fused.h): the program runs over blocks
// of kChunk elements, so every intermediate stays in L1 and memory is read and
// written once. Each instruction is the expression of the op's own kernel
// (elementwise_kernels.cc), in f32, so results match the unfused graph.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../common/fused_program.h"
#include "kiln/core/kernel.h"
#include "kernel_util.h"
#include "loops.h"
#include "vecmath.h"

namespace kiln::cpu {
namespace {

enum class Code : uint8_t {
  kNeg, kAbs, kSquare, kExp, kLog, kLog1p, kSqrt, kRsqrt, kReciprocal, kSin, kCos, kTanh, kSigmoid, kRelu,
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kReluGrad
};

Code code_of(const std::string& op) {
  static const std::pair<const char*, Code> kTable[] = {
      {"neg", Code::kNeg},         {"abs", Code::kAbs},         {"square", Code::kSquare},
      {"exp", Code::kExp},         {"log", Code::kLog},         {"log1p", Code::kLog1p},
      {"sqrt", Code::kSqrt},       {"rsqrt", Code::kRsqrt},     {"reciprocal", Code::kReciprocal},
      {"sin", Code::kSin},         {"cos", Code::kCos},         {"tanh", Code::kTanh},
      {"sigmoid", Code::kSigmoid}, {"relu", Code::kRelu},       {"add", Code::kAdd},
      {"sub", Code::kSub},         {"mul", Code::kMul},         {"div", Code::kDiv},
      {"maximum", Code::kMaximum}, {"minimum", Code::kMinimum}, {"relu_grad", Code::kReluGrad}};
  for (const auto& [name, code] : kTable)
    if (op == name) return code;
  throw InternalError("fused_elementwise: no kernel for op '" + op + "'");  // inference checked the names
}

struct Instr {
  Code code;
  int a, b;
};

// o[i] = f(x[i]) or f(x[i], y[i]) over one block. o may be x or y (the last
// instruction writes the output, which the executor may place over an input): each
// element is read before it is written, and the simd pragma needs no __restrict.
void run_instr(const Instr& in, const float* x, const float* y, float* o, int64_t n) {
  switch (in.code) {
#define KILN_U(CODE, EXPR)                                      \
  case Code::CODE:                                              \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {       \
      const float v = x[i];                                     \
      o[i] = EXPR;                                              \
    }                                                           \
    return;
#define KILN_B(CODE, EXPR)                                      \
  case Code::CODE:                                              \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {       \
      const float v = x[i], w = y[i];                           \
      o[i] = EXPR;                                              \
    }                                                           \
    return;
    KILN_U(kNeg, -v)
    KILN_U(kAbs, v < 0.0f ? -v : v)
    KILN_U(kSquare, v * v)
    KILN_U(kExp, vm::exp(v))
    KILN_U(kLog, vm::log(v))
    KILN_U(kLog1p, vm::log1p(v))
    KILN_U(kSqrt, std::sqrt(v))
    KILN_U(kRsqrt, 1.0f / std::sqrt(v))
    KILN_U(kReciprocal, 1.0f / v)
    KILN_U(kSin, vm::sin(v))
    KILN_U(kCos, vm::cos(v))
    KILN_U(kTanh, vm::tanh(v))
    KILN_U(kSigmoid, 1.0f / (1.0f + vm::exp(-v)))
    KILN_U(kRelu, v > 0.0f ? v : 0.0f)
    KILN_B(kAdd, v + w)
    KILN_B(kSub, v - w)
    KILN_B(kMul, v * w)
    KILN_B(kDiv, v / w)
    KILN_B(kMaximum, (v > w || v != v) ? v : w)
    KILN_B(kMinimum, (v < w || v != v) ? v : w)
    KILN_B(kReluGrad, w > 0.0f ? v : 0.0f)
#undef KILN_U
#undef KILN_B
  }
}

// dst[j] = src[(start + j) % period] for j < m: an input broadcast along leading dims,
// copied in contiguous runs.
void fill_periodic(const float* src, int64_t period, int64_t start, float* dst, int64_t m) {
  int64_t k = start % period;
  for (int64_t j = 0; j < m;) {
    const int64_t run = std::min(m - j, period - k);
    std::copy_n(src + k, run, dst + j);
    j += run;
    k = 0;
  }
}

// The program and its block assignment, from the attrs and which inputs are scalars or
// broadcast: prepared once per graph node and shapes.
class FusedProgram final : public PreparedKernel {
 public:
  explicit FusedProgram(const PrepareContext& pc);
  void run(OpContext& ctx) const override;

 private:
  std::vector<Instr> prog_;
  std::vector<int> block_of_;  // per register: its scratch block, -1 = read the tensor directly
  int n_slots_ = 0;
  std::vector<int64_t> period_;  // per input: > 0 broadcast along leading dims (its size), 0 = not
  std::vector<uint8_t> scalar_;  // per input: one element (broadcast to a larger output)
};

FusedProgram::FusedProgram(const PrepareContext& pc) {
  std::vector<Instr>& prog = prog_;
  for (const backends::FusedStep& st : backends::fused_program(pc.attrs)) prog.push_back({code_of(st.op), st.a, st.b});
  const int n_in = static_cast<int>(pc.in.size());
  const int n_regs = n_in + static_cast<int>(prog.size());
  const int64_t numel = pc.out[0].shape.numel();
  period_.assign(pc.in.size(), 0);
  scalar_.assign(pc.in.size(), 0);
  for (size_t r = 0; r < pc.in.size(); ++r) {
    const int64_t size = pc.in[r].shape.numel();
    scalar_[r] = size == 1;
    if (size > 1 && size < numel) period_[r] = size;  // broadcast along leading dims
  }
  // Scratch blocks: one per scalar or broadcast input, and one per instruction result while it
  // is live (reused after its last reader, so a chain needs two): the working set
  // stays in L1 however long the program.
  std::vector<int> last_use(static_cast<size_t>(n_regs), -1);
  for (size_t k = 0; k < prog.size(); ++k) {
    last_use[static_cast<size_t>(prog[k].a)] = static_cast<int>(k);
    if (prog[k].b >= 0) last_use[static_cast<size_t>(prog[k].b)] = static_cast<int>(k);
  }
  // Blocks: broadcast inputs first, then each result takes a free one; operands read
  // for the last time free theirs after the result took its own (an instruction never
  // writes a scratch block it reads). -1: read the tensor directly.
  std::vector<int> block_of(static_cast<size_t>(n_regs), -1);
  {
    std::vector<int> fs;
    int next = 0;
    for (int r = 0; r < n_in; ++r)
      if ((scalar_[static_cast<size_t>(r)] && numel != 1) || period_[static_cast<size_t>(r)] > 0)
        block_of[static_cast<size_t>(r)] = next++;
    for (size_t k = 0; k + 1 < prog.size(); ++k) {
      const int r = n_in + static_cast<int>(k);
      if (fs.empty()) {
        block_of[static_cast<size_t>(r)] = next++;
      } else {
        block_of[static_cast<size_t>(r)] = fs.back();
        fs.pop_back();
      }
      const int a = prog[k].a, b = prog[k].b;
      if (a >= n_in && last_use[static_cast<size_t>(a)] == static_cast<int>(k)) fs.push_back(block_of[static_cast<size_t>(a)]);
      if (b >= n_in && b != a && last_use[static_cast<size_t>(b)] == static_cast<int>(k))
        fs.push_back(block_of[static_cast<size_t>(b)]);
    }
    n_slots_ = next;
  }
  block_of_ = std::move(block_of);
}

void FusedProgram::run(OpContext& ctx) const {
  // Per-call state in the calling thread's buffers, which only grow: no heap allocation
  // once warm. (Named through references: a lambda does not capture a thread_local, the
  // pool's threads would see their own.)
  thread_local std::vector<float> t_scalars;
  thread_local std::vector<const float*> t_inputs;
  std::vector<float>& scalars = t_scalars;
  std::vector<const float*>& inputs = t_inputs;
  const std::vector<int64_t>& period = period_;
  const std::vector<Instr>& prog = prog_;
  const std::vector<int>& block_of = block_of_;
  const int n_slots = n_slots_;
  const int n_in = static_cast<int>(ctx.in.size());
  const int n_regs = n_in + static_cast<int>(prog.size());
  const int64_t numel = ctx.out[0].numel();
  scalars.assign(static_cast<size_t>(n_in), 0.0f);
  inputs.assign(static_cast<size_t>(n_in), nullptr);
  for (int r = 0; r < n_in; ++r) {
    const auto ru = static_cast<size_t>(r);
    inputs[ru] = static_cast<const float*>(ctx.in[ru].raw_data());
    if (scalar_[ru]) scalars[ru] = inputs[ru][0];
  }
  float* out = static_cast<float*>(ctx.out[0].raw_data());
  parallel_for(numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;  // per thread: no allocation once warm
    thread_local std::vector<const float*> src;
    scratch.resize(static_cast<size_t>(std::max(n_slots, 1)) * kChunk);
    src.resize(static_cast<size_t>(n_regs));
    auto block = [&](int r) { return scratch.data() + static_cast<size_t>(block_of[static_cast<size_t>(r)]) * kChunk; };
    for (int r = 0; r < n_in; ++r)
      if (block_of[static_cast<size_t>(r)] >= 0 && period[static_cast<size_t>(r)] == 0)
        std::fill_n(block(r), kChunk, scalars[static_cast<size_t>(r)]);
    for (int64_t i = begin; i < end; i += kChunk) {
      const int64_t m = std::min(kChunk, end - i);
      for (int r = 0; r < n_in; ++r) {
        const auto ru = static_cast<size_t>(r);
        if (period[ru] > 0) fill_periodic(inputs[ru], period[ru], i, block(r), m);
        src[ru] = block_of[ru] >= 0 ? block(r) : inputs[ru] + i;
      }
      for (size_t k = 0; k < prog.size(); ++k) {
        const Instr& in = prog[k];
        const int r = n_in + static_cast<int>(k);
        float* o = k + 1 == prog.size() ? out + i : block(r);
        run_instr(in, src[static_cast<size_t>(in.a)], in.b >= 0 ? src[static_cast<size_t>(in.b)] : nullptr, o, m);
        src[static_cast<size_t>(r)] = o;
      }
    }
  });
}

std::unique_ptr<const PreparedKernel> prepare_fused_elementwise(const PrepareContext& pc) {
  return std::make_unique<FusedProgram>(pc);
}

KILN_REGISTER_PREPARED_KERNEL("fused_elementwise", kCPU, DType::kF32, prepare_fused_elementwise);

}  // namespace
}  // namespace kiln::cpu
