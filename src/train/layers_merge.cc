// Merging layers: Add, Concatenate.
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train::layers {

namespace {

using detail::layer_error;

std::string shapes_str(const std::vector<Tensor>& xs) {
  std::string s;
  for (const Tensor& x : xs) s += (s.empty() ? "" : ", ") + x.shape().str();
  return s;
}

class AddLayer final : public Layer {
 public:
  using Layer::Layer;
  std::string type() const override { return "Add"; }

 protected:
  int num_inputs() const override { return -1; }
  std::vector<Tensor> call(const std::vector<Tensor>& in, bool) override {
    if (in.size() < 2) layer_error(*this, "needs at least 2 inputs, got ", in.size());
    // Keras allows broadcasting (size-1 dims); anything else is a wiring mistake.
    Tensor y = in[0];
    try {
      for (size_t i = 1; i < in.size(); ++i) y = ops::add(y, in[i]);
    } catch (const InvalidArgumentError&) {
      layer_error(*this, "inputs have incompatible shapes ", shapes_str(in));
    }
    return {y};
  }
};

class ConcatenateLayer final : public Layer {
 public:
  ConcatenateLayer(int64_t axis, std::string name) : Layer(std::move(name)), axis_(axis) {}
  std::string type() const override { return "Concatenate"; }

 protected:
  int num_inputs() const override { return -1; }
  std::vector<Tensor> call(const std::vector<Tensor>& in, bool) override {
    const int rank = in[0].rank();
    const int axis = detail::normalize_axis(*this, axis_, rank);
    for (const Tensor& x : in) {
      bool ok = x.rank() == rank;
      for (int d = 0; ok && d < rank; ++d) ok = d == axis || x.dim(d) == in[0].dim(d);
      if (!ok) layer_error(*this, "inputs must have equal shapes except on axis ", axis_, ", got ", shapes_str(in));
    }
    return {ops::concat(in, axis)};
  }

 private:
  int64_t axis_;
};

}  // namespace

LayerPtr Add(std::string name) { return std::make_shared<AddLayer>(std::move(name)); }
LayerPtr Concatenate(int64_t axis, std::string name) {
  return std::make_shared<ConcatenateLayer>(axis, std::move(name));
}

}  // namespace kiln::train::layers
