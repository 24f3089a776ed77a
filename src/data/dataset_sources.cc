// Sources: tensor slices, tensors, range, generator, list_files; and zip.
#include <glob.h>

#include <algorithm>
#include <random>

#include "dataset_internal.h"

namespace kiln::data {
namespace {

ElementSpec row_spec(const Element& components) {
  ElementSpec spec = ElementSpec::of(components);
  for (auto& c : spec.components) c.dims.erase(c.dims.begin());
  return spec;
}

class TensorSlicesNode : public DatasetNode {
 public:
  TensorSlicesNode(Element components, int64_t n)
      : DatasetNode("TensorSlices", row_spec(components), n), components_(std::move(components)) {}

  std::unique_ptr<IteratorImpl> make(const IterContext&) const override {
    struct It : IteratorImpl {
      const TensorSlicesNode* node;
      int64_t i = 0;
      bool next(Element* out) override {
        if (i >= node->cardinality()) return false;
        std::vector<Value> vals;
        vals.reserve(node->components_.size());
        for (const auto& v : node->components_.values()) vals.push_back(slice_row(v, i));
        *out = Element::with_names_of(node->components_, std::move(vals));
        ++i;
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->node = this;
    return it;
  }

 private:
  Element components_;
};

class TensorsNode : public DatasetNode {
 public:
  explicit TensorsNode(Element e) : DatasetNode("Tensors", ElementSpec::of(e), 1), e_(std::move(e)) {}
  std::unique_ptr<IteratorImpl> make(const IterContext&) const override {
    struct It : IteratorImpl {
      const Element* e;
      bool done = false;
      bool next(Element* out) override {
        if (done) return false;
        *out = *e;
        done = true;
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->e = &e_;
    return it;
  }

 private:
  Element e_;
};

class RangeNode : public DatasetNode {
 public:
  RangeNode(int64_t start, int64_t stop, int64_t step)
      : DatasetNode("Range", ElementSpec{{}, {TypeSpec::tensor(DType::kI64)}}, count(start, stop, step)),
        start_(start), step_(step) {}
  static int64_t count(int64_t start, int64_t stop, int64_t step) {
    KILN_CHECK_ARG(step != 0, "range: step must not be 0");
    if (step > 0) return stop > start ? (stop - start + step - 1) / step : 0;
    return start > stop ? (start - stop - step - 1) / -step : 0;
  }
  std::string params() const override {
    return detail::str_cat("start=", start_, ", step=", step_);
  }
  std::unique_ptr<IteratorImpl> make(const IterContext&) const override {
    struct It : IteratorImpl {
      int64_t v, step, left;
      bool next(Element* out) override {
        if (left <= 0) return false;
        *out = Element{Value(Tensor::scalar<int64_t>(v))};
        v += step;
        --left;
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->v = start_;
    it->step = step_;
    it->left = cardinality();
    return it;
  }

 private:
  int64_t start_, step_;
};

class GeneratorNode : public DatasetNode {
 public:
  GeneratorNode(ElementSpec spec, std::function<PullFn()> make_pass, int64_t card, std::string name)
      : DatasetNode(std::move(name), std::move(spec), card), make_pass_(std::move(make_pass)) {}
  std::unique_ptr<IteratorImpl> make(const IterContext&) const override {
    struct It : IteratorImpl {
      const GeneratorNode* node;
      PullFn pull;
      int64_t index = 0;
      bool next(Element* out) override {
        bool ok;
        try {
          ok = pull(out);
        } catch (...) {
          rethrow_with_context(detail::str_cat(node->name(), ": element ", index));
        }
        if (!ok) return false;
        if (!node->spec().components.empty()) check(*out);
        ++index;
        return true;
      }
      void check(const Element& e) const {
        const ElementSpec& spec = node->spec();
        bool ok = e.size() == spec.size();
        for (size_t i = 0; ok && i < e.size(); ++i) ok = spec.components[i].matches(e[i]);
        if (!ok)
          throw InvalidArgumentError(detail::str_cat(node->name(), ": element ", index, " is ", e.desc(),
                                                     ", which does not match the declared spec ", spec.str()));
      }
    };
    auto it = std::make_unique<It>();
    it->node = this;
    try {
      it->pull = make_pass_();
    } catch (...) {
      rethrow_with_context(name() + ": starting a pass");
    }
    KILN_CHECK_ARG(it->pull != nullptr, name(), ": the pass function is empty");
    return it;
  }

 private:
  std::function<PullFn()> make_pass_;
};

std::vector<std::string> glob_files(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    glob_t g{};
    int rc = ::glob(p.c_str(), GLOB_NOSORT, nullptr, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
      ::globfree(&g);
      throw NotFoundError("list_files: no file matches '" + p + "'");
    }
    if (rc != 0) {
      ::globfree(&g);
      throw InvalidArgumentError("list_files: cannot expand '" + p + "' (glob error " + std::to_string(rc) + ")");
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

class ListFilesNode : public DatasetNode {
 public:
  ListFilesNode(std::vector<std::string> files, bool shuffle, uint64_t seed)
      : DatasetNode("ListFiles", ElementSpec{{}, {TypeSpec::string()}},
                    static_cast<int64_t>(files.size())),
        files_(std::move(files)), shuffle_(shuffle), seed_(seed) {}
  std::string params() const override { return detail::str_cat("files=", files_.size(), ", shuffle=", shuffle_); }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      std::vector<std::string> files;
      size_t i = 0;
      bool next(Element* out) override {
        if (i >= files.size()) return false;
        *out = Element{Value(files[i++])};
        return true;
      }
    };
    auto it = std::make_unique<It>();
    it->files = files_;
    if (shuffle_) {
      std::mt19937_64 rng(seed_ + ctx.next_pass(passes_));
      std::shuffle(it->files.begin(), it->files.end(), rng);
    }
    return it;
  }

 private:
  std::vector<std::string> files_;
  bool shuffle_;
  uint64_t seed_;
  mutable std::atomic<uint64_t> passes_{0};
};

ElementSpec zip_spec(const std::vector<NodePtr>& inputs) {
  ElementSpec spec;
  bool all_named = true;
  for (const auto& in : inputs) all_named = all_named && !in->spec().names.empty();
  for (const auto& in : inputs) {
    for (size_t i = 0; i < in->spec().size(); ++i) {
      spec.components.push_back(in->spec().components[i]);
      if (all_named) spec.names.push_back(in->spec().names[i]);
    }
  }
  // Names must stay unique; otherwise the zip is a tuple.
  auto sorted = spec.names;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) spec.names.clear();
  return spec;
}

int64_t zip_cardinality(const std::vector<NodePtr>& inputs) {
  int64_t c = kInfiniteCardinality;
  for (const auto& in : inputs) {
    int64_t ci = in->cardinality();
    if (ci == kUnknownCardinality) return kUnknownCardinality;
    if (ci == kInfiniteCardinality) continue;
    c = c == kInfiniteCardinality ? ci : std::min(c, ci);
  }
  return c;
}

class ZipNode : public DatasetNode {
 public:
  explicit ZipNode(std::vector<NodePtr> inputs)
      : DatasetNode("Zip", zip_spec(inputs), zip_cardinality(inputs), inputs) {}
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      std::vector<std::unique_ptr<IteratorImpl>> ins;
      std::shared_ptr<const std::vector<std::string>> names;
      Element named_template;
      bool next(Element* out) override {
        std::vector<Value> vals;
        Element e;
        for (auto& in : ins) {
          if (!in->next(&e)) return false;
          for (auto& v : e.values()) vals.push_back(std::move(v));
        }
        *out = named_template.empty() ? Element(std::move(vals))
                                      : Element::with_names_of(named_template, std::move(vals));
        return true;
      }
    };
    auto it = std::make_unique<It>();
    for (const auto& in : inputs()) it->ins.push_back(in->make(ctx));
    if (!spec().names.empty()) {
      std::vector<Value> dummies(spec().size());
      it->named_template = Element(spec().names, std::move(dummies));
    }
    return it;
  }
};

}  // namespace

Value slice_row(const Value& v, int64_t i) {
  KILN_CHECK_ARG(v.rank() >= 1, "cannot take row ", i, " of a scalar ", v.desc());
  if (v.is_string()) {
    const StringTensor& s = v.strings();
    Shape row(std::span<const int64_t>(s.shape.begin() + 1, s.shape.end()));
    int64_t n = row.numel();
    std::vector<std::string> vals(s.values.begin() + i * n, s.values.begin() + (i + 1) * n);
    return StringTensor(row, std::move(vals));
  }
  const Tensor& t = v.tensor();
  Shape row(std::span<const int64_t>(t.shape().begin() + 1, t.shape().end()));
  size_t row_bytes = static_cast<size_t>(row.numel()) * t.itemsize();
  size_t base = static_cast<size_t>(static_cast<const char*>(t.raw_data()) -
                                    static_cast<const char*>(t.storage()->data()));
  return Tensor(t.storage(), base + static_cast<size_t>(i) * row_bytes, row, t.dtype());
}

NodePtr make_tensor_slices_node(Element components) {
  KILN_CHECK_ARG(!components.empty(), "from_tensor_slices: needs at least one component");
  int64_t n = -1;
  for (size_t i = 0; i < components.size(); ++i) {
    const Value& v = components[i];
    KILN_CHECK_ARG(v.defined() && v.rank() >= 1, "from_tensor_slices: component ", i,
                   " must have rank >= 1 to be sliced, got ", v.desc());
    if (v.is_tensor()) KILN_CHECK_ARG(v.tensor().device().type == DeviceType::kCPU, "from_tensor_slices: component ", i,
                                      " must be on the CPU, got ", v.tensor().desc());
    if (n < 0) n = v.shape()[0];
    KILN_CHECK_ARG(v.shape()[0] == n, "from_tensor_slices: components differ in dimension 0: component 0 has ", n,
                   ", component ", i, " is ", v.desc());
  }
  return std::make_shared<TensorSlicesNode>(std::move(components), n);
}

NodePtr make_tensors_node(Element components) { return std::make_shared<TensorsNode>(std::move(components)); }
NodePtr make_range_node(int64_t start, int64_t stop, int64_t step) {
  return std::make_shared<RangeNode>(start, stop, step);
}
NodePtr make_generator_node(ElementSpec spec, std::function<PullFn()> make_pass, int64_t cardinality,
                            std::string name) {
  KILN_CHECK_ARG(make_pass != nullptr, "from_generator: the pass function is empty");
  return std::make_shared<GeneratorNode>(std::move(spec), std::move(make_pass), cardinality, std::move(name));
}
NodePtr make_list_files_node(std::vector<std::string> patterns, bool shuffle, uint64_t seed) {
  KILN_CHECK_ARG(!patterns.empty(), "list_files: needs at least one pattern");
  return std::make_shared<ListFilesNode>(glob_files(patterns), shuffle, seed);
}
NodePtr make_zip_node(std::vector<NodePtr> inputs) {
  KILN_CHECK_ARG(!inputs.empty(), "zip: needs at least one dataset");
  return std::make_shared<ZipNode>(std::move(inputs));
}

}  // namespace kiln::data
