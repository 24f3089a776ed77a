// batch, padded_batch and unbatch.
#include <cstring>

#include "dataset_internal.h"
#include "kiln/core/parallel.h"

namespace kiln::data {
namespace {

std::string component_name(const Element& e, size_t i) {
  return e.named() ? "'" + e.names()[i] + "'" : std::to_string(i);
}

ElementSpec batched_spec(const ElementSpec& in, int64_t batch_dim) {
  ElementSpec s = in;
  for (auto& c : s.components)
    if (!c.unknown_rank) c.dims.insert(c.dims.begin(), batch_dim);
  return s;
}

int64_t batched_cardinality(int64_t c, int64_t batch, bool drop) {
  if (c < 0) return c;
  return drop ? c / batch : (c + batch - 1) / batch;
}

// Pulls up to n elements; returns how many.
size_t pull_batch(IteratorImpl& in, int64_t n, std::vector<Element>* out) {
  out->resize(static_cast<size_t>(n));
  size_t k = 0;
  while (k < out->size() && in.next(&(*out)[k])) ++k;
  out->resize(k);
  return k;
}

class BatchNode : public DatasetNode {
 public:
  BatchNode(NodePtr input, int64_t batch, bool drop)
      : DatasetNode("Batch", batched_spec(input->spec(), drop ? batch : -1),
                    batched_cardinality(input->cardinality(), batch, drop), {input}),
        batch_(batch), drop_(drop) {}
  std::string params() const override {
    return detail::str_cat("batch_size=", batch_, drop_ ? ", drop_remainder=true" : "");
  }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      std::unique_ptr<IteratorImpl> in;
      int64_t batch;
      bool drop;
      std::vector<Element> elems;
      bool next(Element* out) override {
        size_t k = pull_batch(*in, batch, &elems);
        if (k == 0 || (drop && static_cast<int64_t>(k) < batch)) return false;
        std::vector<Value> vals;
        vals.reserve(elems[0].size());
        for (size_t c = 0; c < elems[0].size(); ++c) vals.push_back(stack_component(elems, c));
        *out = Element::with_names_of(elems[0], std::move(vals));
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->in = inputs()[0]->make(ctx);
    it->batch = batch_;
    it->drop = drop_;
    return it;
  }

 private:
  int64_t batch_;
  bool drop_;
};

// Copies `src` (shape s) into the leading corner of `dst` (shape d, same rank),
// row-major, `item` bytes per element.
void copy_into_corner(const char* src, const Shape& s, char* dst, const Shape& d, size_t item) {
  int r = s.rank();
  if (r == 0) {
    std::memcpy(dst, src, item);
    return;
  }
  auto ds = d.strides();
  auto ss = s.strides();
  size_t row = static_cast<size_t>(s[r - 1]) * item;
  int64_t rows = s[r - 1] == 0 ? 0 : s.numel() / s[r - 1];
  for (int64_t q = 0; q < rows; ++q) {
    // Multi-index of row q over dims [0, r-1).
    int64_t rem = q, src_off = 0, dst_off = 0;
    for (int k = r - 2; k >= 0; --k) {
      int64_t idx = rem % s[k];
      rem /= s[k];
      src_off += idx * ss[k];
      dst_off += idx * ds[k];
    }
    std::memcpy(dst + dst_off * item, src + src_off * item, row);
  }
}

class PaddedBatchNode : public DatasetNode {
 public:
  PaddedBatchNode(NodePtr input, int64_t batch, std::vector<std::vector<int64_t>> shapes, std::vector<double> values,
                  bool drop)
      : DatasetNode("PaddedBatch", padded_spec(input->spec(), shapes, drop ? batch : -1),
                    batched_cardinality(input->cardinality(), batch, drop), {input}),
        batch_(batch), shapes_(std::move(shapes)), values_(std::move(values)), drop_(drop) {}

  static ElementSpec padded_spec(const ElementSpec& in, const std::vector<std::vector<int64_t>>& shapes, int64_t b) {
    ElementSpec s = batched_spec(in, b);
    for (size_t i = 0; i < s.components.size() && i < shapes.size(); ++i) {
      if (shapes[i].empty()) continue;
      s.components[i].unknown_rank = false;
      s.components[i].dims = shapes[i];
      s.components[i].dims.insert(s.components[i].dims.begin(), b);
    }
    return s;
  }

  std::string params() const override {
    return detail::str_cat("batch_size=", batch_, drop_ ? ", drop_remainder=true" : "");
  }

  Value pad_component(const std::vector<Element>& elems, size_t c) const {
    const Value& first = elems[0][c];
    int rank = first.rank();
    std::vector<int64_t> target(static_cast<size_t>(rank), 0);
    for (const auto& e : elems) {
      const Value& v = e[c];
      if (v.is_string() != first.is_string() || (v.is_tensor() && v.tensor().dtype() != first.tensor().dtype()) ||
          v.rank() != rank)
        throw InvalidArgumentError(detail::str_cat("padded_batch: component ", component_name(e, c),
                                                   " differs in type or rank within a batch: ", first.desc(), " vs ",
                                                   v.desc()));
      for (int k = 0; k < rank; ++k) target[k] = std::max(target[k], v.shape()[k]);
    }
    if (c < shapes_.size() && !shapes_[c].empty()) {
      const auto& want = shapes_[c];
      KILN_CHECK_ARG(static_cast<int>(want.size()) == rank, "padded_batch: padded shape of component ", c,
                     " has rank ", want.size(), " but the elements have rank ", rank);
      for (int k = 0; k < rank; ++k) {
        if (want[k] < 0) continue;
        KILN_CHECK_ARG(target[k] <= want[k], "padded_batch: component ", component_name(elems[0], c), " dimension ", k,
                       " is ", target[k], ", longer than its padded size ", want[k]);
        target[k] = want[k];
      }
    }
    Shape row(target);
    Shape out_shape = row;
    out_shape.insert(0, static_cast<int64_t>(elems.size()));
    double pad = c < values_.size() ? values_[c] : 0.0;
    if (first.is_string()) {
      std::vector<std::string> vals(static_cast<size_t>(out_shape.numel()));
      // Strings: pad with "" (the padding value does not apply), copied via indices.
      for (size_t b = 0; b < elems.size(); ++b) {
        const StringTensor& s = elems[b][c].strings();
        std::vector<int64_t> idx(static_cast<size_t>(s.numel()));
        for (int64_t i = 0; i < s.numel(); ++i) idx[i] = i;
        // Reuse the byte copier on int64 indices, then look them up.
        std::vector<int64_t> placed(static_cast<size_t>(row.numel()), -1);
        copy_into_corner(reinterpret_cast<const char*>(idx.data()), s.shape, reinterpret_cast<char*>(placed.data()),
                         row, sizeof(int64_t));
        for (size_t i = 0; i < placed.size(); ++i)
          if (placed[i] >= 0) vals[b * placed.size() + i] = s.values[static_cast<size_t>(placed[i])];
      }
      return StringTensor(out_shape, std::move(vals));
    }
    DType dt = first.tensor().dtype();
    Tensor out = Tensor::empty(out_shape, dt);
    // Fill with the padding value, then copy each element into its corner.
    Tensor fill = Tensor::scalar<double>(pad).to(dt);
    size_t item = out.itemsize();
    char* dst = static_cast<char*>(out.raw_data());
    const char* pv = static_cast<const char*>(fill.raw_data());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(dst + i * item, pv, item);
    size_t row_bytes = static_cast<size_t>(row.numel()) * item;
    for (size_t b = 0; b < elems.size(); ++b) {
      const Tensor& t = elems[b][c].tensor();
      copy_into_corner(static_cast<const char*>(t.raw_data()), t.shape(), dst + b * row_bytes, row, item);
    }
    return out;
  }

  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      const PaddedBatchNode* node;
      std::unique_ptr<IteratorImpl> in;
      std::vector<Element> elems;
      bool next(Element* out) override {
        size_t k = pull_batch(*in, node->batch_, &elems);
        if (k == 0 || (node->drop_ && static_cast<int64_t>(k) < node->batch_)) return false;
        std::vector<Value> vals;
        for (size_t c = 0; c < elems[0].size(); ++c) vals.push_back(node->pad_component(elems, c));
        *out = Element::with_names_of(elems[0], std::move(vals));
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->node = this;
    it->in = inputs()[0]->make(ctx);
    return it;
  }

 private:
  int64_t batch_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<double> values_;
  bool drop_;
};

ElementSpec unbatched_spec(const ElementSpec& in) {
  ElementSpec s = in;
  for (auto& c : s.components)
    if (!c.unknown_rank && !c.dims.empty()) c.dims.erase(c.dims.begin());
  return s;
}

class UnbatchNode : public DatasetNode {
 public:
  explicit UnbatchNode(NodePtr input)
      : DatasetNode("Unbatch", unbatched_spec(input->spec()),
                    input->cardinality() == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality,
                    {input}) {}
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      std::unique_ptr<IteratorImpl> in;
      Element cur;
      int64_t rows = 0, pos = 0;
      bool next(Element* out) override {
        while (pos >= rows) {
          if (!in->next(&cur)) return false;
          pos = 0;
          rows = -1;
          for (size_t c = 0; c < cur.size(); ++c) {
            const Value& v = cur[c];
            KILN_CHECK_ARG(v.rank() >= 1, "unbatch: component ", component_name(cur, c), " is a scalar ", v.desc());
            if (rows < 0) rows = v.shape()[0];
            KILN_CHECK_ARG(v.shape()[0] == rows, "unbatch: components differ in dimension 0: ", cur.desc());
          }
          if (rows < 0) rows = 0;
        }
        std::vector<Value> vals;
        vals.reserve(cur.size());
        for (const auto& v : cur.values()) vals.push_back(slice_row(v, pos));
        ++pos;
        *out = Element::with_names_of(cur, std::move(vals));
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->in = inputs()[0]->make(ctx);
    return it;
  }
};

}  // namespace

Value stack_component(std::vector<Element>& elems, size_t c) {
  const Element& e0 = elems[0];
  KILN_CHECK_ARG(c < e0.size(), "batch: component ", c, " missing");
  const Value& first = e0[c];
  for (size_t b = 1; b < elems.size(); ++b) {
    const Element& e = elems[b];
    KILN_CHECK_ARG(e.size() == e0.size(), "batch: elements differ in their number of components: ", e0.desc(), " vs ",
                   e.desc());
    const Value& v = e[c];
    bool same = v.is_string() == first.is_string() && v.shape() == first.shape() &&
                (v.is_string() || v.tensor().dtype() == first.tensor().dtype());
    if (!same)
      throw InvalidArgumentError(detail::str_cat("batch: component ", component_name(e0, c),
                                                 " must have the same type and shape in every element of a batch, got ",
                                                 first.desc(), " and ", v.desc(), " (use padded_batch)"));
  }
  Shape shape = first.shape();
  shape.insert(0, static_cast<int64_t>(elems.size()));
  if (first.is_string()) {
    std::vector<std::string> vals;
    vals.reserve(static_cast<size_t>(shape.numel()));
    for (auto& e : elems)
      for (auto& s : e[c].strings().values) vals.push_back(std::move(s));
    return StringTensor(shape, std::move(vals));
  }
  const Tensor& t0 = first.tensor();
  Tensor out = Tensor::empty(shape, t0.dtype());
  size_t row = t0.nbytes();
  char* dst = static_cast<char*>(out.raw_data());
  for (size_t b = 0; b < elems.size(); ++b) std::memcpy(dst + b * row, elems[b][c].tensor().raw_data(), row);
  return out;
}

NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder) {
  KILN_CHECK_ARG(batch_size > 0, "batch: batch_size must be > 0, got ", batch_size);
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder);
}
NodePtr make_padded_batch_node(NodePtr input, int64_t batch_size, std::vector<std::vector<int64_t>> padded_shapes,
                               std::vector<double> padding_values, bool drop_remainder) {
  KILN_CHECK_ARG(batch_size > 0, "padded_batch: batch_size must be > 0, got ", batch_size);
  return std::make_shared<PaddedBatchNode>(std::move(input), batch_size, std::move(padded_shapes),
                                           std::move(padding_values), drop_remainder);
}
NodePtr make_unbatch_node(NodePtr input) { return std::make_shared<UnbatchNode>(std::move(input)); }

}  // namespace kiln::data
