// nn ops: softmax, dropout, embedding lookup, scaled dot-product attention.
#include <cmath>
#include <cstring>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/core/random.h"
#include "kiln/ops/nn.h"
#include "nn_util.h"

namespace kiln::ops {
namespace {
using detail::call1;
using namespace nn_detail;

std::vector<TensorMeta> infer_softmax(const char* op, std::span<const TensorMeta> in, const Attrs& a) {
  detail::require_floating(op, in[0]);
  if (in[0].shape.rank() < 1) throw InvalidArgumentError(std::string(op) + ": input must have rank >= 1, got a scalar");
  normalize_axis(a.get_int("axis", -1), in[0].shape.rank(), (std::string(op) + " axis").c_str());
  return {in[0]};
}
std::vector<TensorMeta> infer_softmax(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_softmax("softmax", in, a);
}
std::vector<TensorMeta> infer_log_softmax(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_softmax("log_softmax", in, a);
}

void check_rate(double rate) {
  if (!(rate >= 0 && rate < 1))
    throw InvalidArgumentError("dropout: rate must be in [0, 1), got " + std::to_string(rate));
}

std::vector<TensorMeta> infer_dropout(std::span<const TensorMeta> in, const Attrs& a) {
  detail::require_floating("dropout", in[0]);
  check_rate(a.get_float("rate"));
  (void)a.get_int("seed");
  return {in[0]};
}

std::vector<TensorMeta> infer_embedding(std::span<const TensorMeta> in, const Attrs&) {
  const Shape &table = in[0].shape, &ids = in[1].shape;
  if (table.rank() < 1) throw InvalidArgumentError("embedding: table must have rank >= 1 ([V, ...]), got a scalar");
  if (in[1].dtype != DType::kI32 && in[1].dtype != DType::kI64)
    throw InvalidArgumentError("embedding: ids must be i32 or i64, got " + detail::dtype_str(in[1].dtype));
  if (ids.rank() + table.rank() - 1 > Shape::kMaxRank)
    throw InvalidArgumentError("embedding: result rank " + std::to_string(ids.rank() + table.rank() - 1) +
                               " exceeds " + std::to_string(Shape::kMaxRank));
  Shape out = ids;
  for (int i = 1; i < table.rank(); ++i) out.push_back(table[i]);
  return {{out, in[0].dtype}};
}

Shape batch_of(const Shape& s) { return Shape(std::span<const int64_t>(s.begin(), s.end() - 2)); }

std::vector<TensorMeta> infer_attention(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "scaled_dot_product_attention";
  if (in.size() != 3 && in.size() != 4)
    throw InvalidArgumentError(std::string(op) + ": takes 3 or 4 inputs (q, k, v[, mask]), got " +
                               std::to_string(in.size()));
  detail::require_floating(op, in[0]);
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    if (in[i].shape.rank() < 2)
      throw InvalidArgumentError(std::string(op) + ": " + names[i] + " must have rank >= 2 ([..., L, d]), got " +
                                 in[i].shape.str());
    if (in[i].dtype != in[0].dtype)
      throw InvalidArgumentError(std::string(op) + ": q, k and v must have one dtype, got " +
                                 detail::dtype_str(in[0].dtype) + ", " + detail::dtype_str(in[1].dtype) + " and " +
                                 detail::dtype_str(in[2].dtype));
  }
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  int64_t lq = q.dim(-2), d = q.dim(-1), lk = k.dim(-2);
  if (k.dim(-1) != d)
    throw InvalidArgumentError(std::string(op) + ": q and k must have the same last dim (d), got q " + q.str() +
                               " and k " + k.str());
  if (v.dim(-2) != lk)
    throw InvalidArgumentError(std::string(op) + ": k and v must have the same key length (dim -2), got k " + k.str() +
                               " and v " + v.str());
  Shape batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k)), batch_of(v));
  if (batch.rank() + 2 > Shape::kMaxRank) throw InvalidArgumentError(std::string(op) + ": rank too large");
  Shape scores = batch;
  scores.push_back(lq);
  scores.push_back(lk);
  if (in.size() == 4) {
    const TensorMeta& m = in[3];
    if (m.dtype != DType::kBool && !param_dtype_ok(m.dtype, in[0].dtype))
      throw InvalidArgumentError(std::string(op) + ": mask must be bool or have q's dtype (" +
                                 detail::dtype_str(in[0].dtype) + "), got " + detail::dtype_str(m.dtype));
    bool ok = m.shape.rank() <= scores.rank();
    for (int i = 1; ok && i <= m.shape.rank(); ++i)
      ok = m.shape[m.shape.rank() - i] == 1 || m.shape[m.shape.rank() - i] == scores[scores.rank() - i];
    if (!ok)
      throw InvalidArgumentError(std::string(op) + ": mask of shape " + m.shape.str() +
                                 " does not broadcast to the scores' shape " + scores.str() + " [..., Lq, Lk]");
  }
  if (a.has("scale") && !std::isfinite(a.get_float("scale")))
    throw InvalidArgumentError(std::string(op) + ": scale must be finite, got " + std::to_string(a.get_float("scale")));
  Shape out = batch;
  out.push_back(lq);
  out.push_back(v.dim(-1));
  return {{out, in[0].dtype}};
}

KILN_REGISTER_OP(detail::make_def("softmax", "exp(x - max) / sum(exp(x - max)) along an axis", 1, infer_softmax,
                     {{"axis", AttrType::kInt, "reduction axis, default -1"}}));
KILN_REGISTER_OP(detail::make_def("log_softmax", "x - max - log(sum(exp(x - max))) along an axis", 1, infer_log_softmax,
                     {{"axis", AttrType::kInt, "reduction axis, default -1"}}));
KILN_REGISTER_OP([] {
  OpDef o = detail::make_def("dropout", "inverted dropout with a Philox mask from the seed", 1, infer_dropout,
                             {{"rate", AttrType::kFloat, "drop probability in [0, 1)"},
                              {"seed", AttrType::kInt, "Philox key (a uint64 stored bitwise)"}});
  o.redraw = [](Attrs& a) { a.set("seed", static_cast<int64_t>(draw_seed())); };
  return o;
}());
KILN_REGISTER_OP([] {
  OpDef o = detail::make_def("embedding", "rows of a table gathered by integer ids", 2, infer_embedding, {});
  o.dispatch_input = 0;  // the table's dtype selects the kernel
  return o;
}());
std::vector<TensorMeta> infer_paged_attention(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "paged_attention";
  const TensorMeta &q = in[0], &k = in[1], &v = in[2], &tables = in[3], &seqs = in[4], &pos = in[5];
  auto floating16_32 = [](DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; };
  if (q.shape.rank() != 3 || k.shape.rank() != 4)
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": q must be [T, H, d] and the caches [N, B, Hkv, d], got q ",
                                                     q.shape.str(), " and k_cache ", k.shape.str()));
  if (!floating16_32(q.dtype) || !floating16_32(k.dtype))
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": q and the caches must be f32, f16 or bf16, got ",
                                                     detail::dtype_str(q.dtype), " and ", detail::dtype_str(k.dtype)));
  if (v.shape != k.shape || v.dtype != k.dtype)
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": v_cache must have k_cache's shape and dtype, got ", v.shape.str(),
                                                     " ", detail::dtype_str(v.dtype), " and ", k.shape.str(), " ",
                                                     detail::dtype_str(k.dtype)));
  const int64_t T = q.shape.dim(0), H = q.shape.dim(1), d = q.shape.dim(2), hkv = k.shape.dim(2);
  if (k.shape.dim(3) != d || hkv < 1 || H % hkv != 0)
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": q ", q.shape.str(), " and k_cache ", k.shape.str(),
                                                     ": the head sizes must match and H be a multiple of Hkv"));
  if (tables.dtype != DType::kI32 || tables.shape.rank() != 2)
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": block_tables must be i32 [S, M], got ",
                                                     detail::dtype_str(tables.dtype), " ", tables.shape.str()));
  for (const TensorMeta* m : {&seqs, &pos})
    if (m->dtype != DType::kI32 || m->shape != Shape{T})
      throw InvalidArgumentError(kiln::detail::str_cat(op, ": seq_ids and positions must be i32 [", T,
                                                       "] (one per query), got ", detail::dtype_str(m->dtype), " ",
                                                       m->shape.str()));
  if (a.has("scale") && !std::isfinite(a.get_float("scale")))
    throw InvalidArgumentError(std::string(op) + ": scale must be finite");
  if (a.has("softcap") && !(a.get_float("softcap") >= 0 && std::isfinite(a.get_float("softcap"))))
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": softcap must be a finite number >= 0, got ", a.get_float("softcap")));
  if (a.get_int("window", 0) < 0) throw InvalidArgumentError(kiln::detail::str_cat(op, ": window must be >= 0, got ", a.get_int("window", 0)));
  return {{q.shape, q.dtype}};
}

KILN_REGISTER_OP(detail::make_def("paged_attention", "attention of queries over a paged KV cache (block tables)", 6,
                                  infer_paged_attention,
                                  {{"scale", AttrType::kFloat, "score scale, default 1/sqrt(d)"},
                                   {"window", AttrType::kInt, "sliding window: the last `window` positions (0: all)"},
                                   {"softcap", AttrType::kFloat, "> 0: scores become softcap * tanh(score / softcap)"}},
                                  Differentiable::kNo));
KILN_REGISTER_OP(detail::make_def("scaled_dot_product_attention", "softmax(q k^T * scale + mask) v, fused", -1, infer_attention,
                     {{"causal", AttrType::kBool, "query i attends to keys j <= i"},
                      {"scale", AttrType::kFloat, "score scale, default 1/sqrt(d)"}}));

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) {
  require_defined("softmax", "input", x);
  return call1(KILN_OP("softmax"), {as_floating(x)}, {{"axis", axis}});
}

Tensor log_softmax(const Tensor& x, int64_t axis) {
  require_defined("log_softmax", "input", x);
  return call1(KILN_OP("log_softmax"), {as_floating(x)}, {{"axis", axis}});
}

Tensor dropout(const Tensor& x, double rate, uint64_t seed, bool training) {
  require_defined("dropout", "input", x);
  check_rate(rate);
  if (rate == 0 || !training) return x;
  int64_t key;
  std::memcpy(&key, &seed, sizeof key);
  return call1(KILN_OP("dropout"), {as_floating(x)}, {{"rate", rate}, {"seed", key}});
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  require_defined("embedding", "table", table);
  require_defined("embedding", "ids", ids);
  return call1(KILN_OP("embedding"), {table, ids});
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  require_defined(op, "q", q);
  require_defined(op, "k", k);
  require_defined(op, "v", v);
  DType t = promote_types(promote_types(q.dtype(), k.dtype()), v.dtype());
  if (!is_floating(t)) t = DType::kF32;
  Attrs a{{"causal", causal}};
  if (scale) a.set("scale", *scale);
  std::vector<Tensor> in{cast(q, t), cast(k, t), cast(v, t)};
  if (mask.defined()) {
    // bool (or integer: nonzero keeps) masks select; floating masks are added.
    if (mask.dtype() == DType::kBool || is_integral(mask.dtype()))
      in.push_back(cast(mask, DType::kBool));
    else
      in.push_back(param_for(mask, t));
  }
  return call_op1(KILN_OP("scaled_dot_product_attention"), in, a);
}

Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                       const Tensor& seq_ids, const Tensor& positions, std::optional<double> scale, int64_t window, double softcap) {
  const char* op = "paged_attention";
  require_defined(op, "q", q);
  require_defined(op, "k_cache", k_cache);
  require_defined(op, "v_cache", v_cache);
  require_defined(op, "block_tables", block_tables);
  require_defined(op, "seq_ids", seq_ids);
  require_defined(op, "positions", positions);
  Attrs a;
  if (scale) a.set("scale", *scale);
  if (window) a.set("window", window);
  if (softcap != 0) a.set("softcap", softcap);
  const std::vector<Tensor> in{q, k_cache, v_cache, block_tables, seq_ids, positions};
  return call_op1(KILN_OP("paged_attention"), in, a);
}

}  // namespace kiln::ops
