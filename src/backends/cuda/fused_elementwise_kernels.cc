// fused_elementwise on CUDA (kiln/ops/fused.h): the program is compiled on the host
// into FusedProgram (instruction codes, operand references, scratch slots reused after
// their last reader) and interpreted per element by one kernel
// (fused_elementwise_kernels.cu). A program beyond the kernel's limits runs one
// instruction per launch through full-size temporaries (same kernel, same results).
#include <string>
#include <utility>
#include <vector>

#include "../common/fused_program.h"
#include "elementwise_launch.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

struct Code {
  uint8_t op;
  bool binary;
};

Code code_of(const std::string& op) {
  static const std::pair<const char*, EwUnaryOp> kUnary[] = {
      {"neg", EwUnaryOp::kNeg},         {"abs", EwUnaryOp::kAbs},       {"square", EwUnaryOp::kSquare},
      {"exp", EwUnaryOp::kExp},         {"log", EwUnaryOp::kLog},       {"log1p", EwUnaryOp::kLog1p},
      {"sqrt", EwUnaryOp::kSqrt},       {"rsqrt", EwUnaryOp::kRsqrt},   {"reciprocal", EwUnaryOp::kReciprocal},
      {"sin", EwUnaryOp::kSin},         {"cos", EwUnaryOp::kCos},       {"tanh", EwUnaryOp::kTanh},
      {"sigmoid", EwUnaryOp::kSigmoid}, {"relu", EwUnaryOp::kRelu}};
  static const std::pair<const char*, EwBinaryOp> kBinary[] = {
      {"add", EwBinaryOp::kAdd},         {"sub", EwBinaryOp::kSub},         {"mul", EwBinaryOp::kMul},
      {"div", EwBinaryOp::kDiv},         {"maximum", EwBinaryOp::kMaximum}, {"minimum", EwBinaryOp::kMinimum},
      {"relu_grad", EwBinaryOp::kReluGrad}};
  for (const auto& [name, code] : kUnary)
    if (op == name) return {static_cast<uint8_t>(code), false};
  for (const auto& [name, code] : kBinary)
    if (op == name) return {static_cast<uint8_t>(code), true};
  throw InternalError("fused_elementwise: no CUDA kernel for op '" + op + "'");  // inference checked the names
}

struct Instr {
  Code code;
  int a, b;  // registers: inputs first, then one per instruction
};

std::vector<Instr> parse(const Attrs& attrs) {
  std::vector<Instr> prog;
  for (const backends::FusedStep& st : backends::fused_program(attrs)) prog.push_back({code_of(st.op), st.a, st.b});
  return prog;
}

// Compiles the program with the inputs as registers 0..n_in-1; false when it exceeds
// the kernel's limits.
bool compile(const std::vector<Instr>& prog, std::span<const Tensor> in, int64_t numel, FusedProgram& fp) {
  const int n_in = static_cast<int>(in.size());
  const int n_instr = static_cast<int>(prog.size());
  if (n_in > kFusedMaxInputs || n_instr > kFusedMaxInstrs) return false;
  fp.n_in = n_in;
  fp.n_instr = n_instr;
  fp.scalar_mask = 0;
  for (int k = 0; k < n_in; ++k) {
    fp.in[k] = static_cast<const float*>(in[static_cast<size_t>(k)].raw_data());
    const int64_t size = in[static_cast<size_t>(k)].numel();
    if (size == 1 && numel != 1) fp.scalar_mask |= uint64_t{1} << k;
    fp.period[k] = size > 1 && size < numel ? size : 0;  // broadcast along leading dims
  }
  // Last reader of each instruction result.
  std::vector<int> last_use(static_cast<size_t>(n_in + n_instr), -1);
  for (int k = 0; k < n_instr; ++k) {
    last_use[static_cast<size_t>(prog[static_cast<size_t>(k)].a)] = k;
    if (prog[static_cast<size_t>(k)].b >= 0) last_use[static_cast<size_t>(prog[static_cast<size_t>(k)].b)] = k;
  }
  // Slots: operands read for the last time free theirs before the result takes one (the
  // kernel reads both operands before it writes).
  std::vector<int> slot_of(static_cast<size_t>(n_in + n_instr), -1), free_slots;
  int n_slots = 0;
  auto ref = [&](int r) -> uint8_t {
    return r < n_in ? static_cast<uint8_t>(kFusedInput | r) : static_cast<uint8_t>(slot_of[static_cast<size_t>(r)]);
  };
  for (int k = 0; k < n_instr; ++k) {
    const Instr& ins = prog[static_cast<size_t>(k)];
    FusedInstr& fi = fp.ins[k];
    fi.op = ins.code.op;
    fi.binary = ins.code.binary ? 1 : 0;
    fi.a = ref(ins.a);
    fi.b = ins.code.binary ? ref(ins.b) : 0;
    fi.dst = 0;
    for (int r : {ins.a, ins.code.binary ? ins.b : -1})
      if (r >= n_in && last_use[static_cast<size_t>(r)] == k && slot_of[static_cast<size_t>(r)] >= 0) {
        free_slots.push_back(slot_of[static_cast<size_t>(r)]);
        slot_of[static_cast<size_t>(r)] = -1;  // a == b frees once
      }
    if (k + 1 == n_instr) break;  // the last writes the output
    const int r = n_in + k;
    int s;
    if (!free_slots.empty()) {
      s = free_slots.back();
      free_slots.pop_back();
    } else {
      s = n_slots++;
      if (n_slots > kFusedMaxSlots) return false;
    }
    fi.dst = static_cast<uint8_t>(s);
    if (last_use[static_cast<size_t>(r)] < 0)
      free_slots.push_back(s);  // a dead result: stored into a free slot, which stays free
    else
      slot_of[static_cast<size_t>(r)] = s;
  }
  fp.n_slots = n_slots;
  return true;
}

void k_fused_elementwise(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const int64_t numel = out.numel();
  if (numel == 0) return;
  KernelScope s(out);
  const std::vector<Instr> prog = parse(ctx.attrs);
  FusedProgram fp;
  if (compile(prog, ctx.in, numel, fp)) {
    launch_fused_elementwise(fp, static_cast<float*>(out.raw_data()), numel, s.stream);
    return;
  }
  // Too long or too wide: one instruction per launch, every result a full tensor.
  std::vector<Tensor> regs(ctx.in.begin(), ctx.in.end());
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& ins = prog[k];
    std::vector<Tensor> operands{regs[static_cast<size_t>(ins.a)]};
    if (ins.code.binary) operands.push_back(regs[static_cast<size_t>(ins.b)]);
    Tensor r = k + 1 == prog.size() ? out : Tensor::empty(out.shape(), DType::kF32, out.device());
    FusedProgram one;
    std::vector<Instr> single{{ins.code, 0, ins.code.binary ? 1 : -1}};
    compile(single, operands, numel, one);
    launch_fused_elementwise(one, static_cast<float*>(r.raw_data()), numel, s.stream);
    regs.push_back(std::move(r));
  }
}

KILN_REGISTER_KERNEL("fused_elementwise", kCUDA, DType::kF32, k_fused_elementwise);

}  // namespace
}  // namespace kiln::cuda
