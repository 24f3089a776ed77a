// Model -> model package: signatures from the model's inputs/outputs, lineage from fit.
#include "kiln/train/export.h"

#include <map>
#include <set>

#include "kiln/core/error.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/package/export.h"

namespace kiln::train {

std::string export_model(Model& model, const std::string& base, ModelExportOptions opts) {
  if (!model.built())
    throw FailedPreconditionError("export_model: model '" + model.name() +
                                  "' is not built; call it, fit it or give Sequential an input_shape first");
  // Input names and specs.
  std::vector<package::TensorInfo> inputs;
  if (model.is_functional()) {
    for (size_t i = 0; i < model.inputs().size(); ++i) {
      const SymbolicTensor& in = model.inputs()[i];
      std::string name = in.node()->input_name.empty() ? "input_" + std::to_string(i + 1) : in.node()->input_name;
      std::vector<int64_t> dims = in.shape().vec();
      if (!dims.empty()) dims[0] = -1;
      inputs.push_back({name, {dims, in.dtype()}});
    }
  } else {
    auto& seq = dynamic_cast<Sequential&>(model);
    std::vector<int64_t> dims = model.built_input_shapes().at(0).vec();
    if (!dims.empty()) dims[0] = -1;
    inputs.push_back({seq.stack().at(0)->name() + "_input", {dims, DType::kF32}});
  }
  if (opts.input_specs) {
    if (opts.input_specs->size() != inputs.size())
      throw InvalidArgumentError("export_model: input_specs has " + std::to_string(opts.input_specs->size()) +
                                 " specs, the model has " + std::to_string(inputs.size()) + " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].spec = (*opts.input_specs)[i];
  }
  // Output names: the output layers' names (made unique).
  std::vector<std::string> outputs;
  std::set<std::string> used;
  auto add_output = [&](std::string n) {
    std::string u = n;
    for (int k = 1; used.count(u); ++k) u = n + "_" + std::to_string(k);
    used.insert(u);
    outputs.push_back(u);
  };
  if (model.is_functional()) {
    for (const SymbolicTensor& o : model.outputs()) add_output(o.node()->layer ? o.node()->layer->name() : "output");
  } else {
    add_output(dynamic_cast<Sequential&>(model).stack().back()->name());
  }

  // Weight names: model paths instead of the variables' short names.
  std::map<uintptr_t, std::string> paths;
  for (const auto& [path, var] : model.named_weights()) paths[var.uid()] = path;

  const bool softmax = opts.softmax_outputs;
  auto call = [&model, softmax](const std::vector<Tensor>& x) {
    std::vector<Tensor> y = model(x, /*training=*/false);
    if (softmax) y.at(0) = ops::softmax(y.at(0), -1);
    return y;
  };
  std::vector<package::ExportSignature> sigs;
  sigs.push_back({package::kDefaultSignature, package::kPredictMethod, call, inputs, outputs});
  if (opts.classify_signature) {
    if (inputs.size() != 1)
      throw InvalidArgumentError("export_model: a classify signature needs a model with one input, this one has " +
                                 std::to_string(inputs.size()));
    auto classify = [call](const std::vector<Tensor>& x) {
      Tensor scores = call(x).at(0);
      return std::vector<Tensor>{scores, ops::argmax(scores, -1)};
    };
    sigs.push_back({"classify", package::kClassifyMethod, classify, inputs, {"scores", "classes"}});
  }
  opts.weight_name = [&paths](const Variable& v) {
    auto it = paths.find(v.uid());
    return it == paths.end() ? v.name() : it->second;
  };
  package::Metadata& md = opts.metadata;
  if (md.model_name.empty()) md.model_name = model.name();
  const auto& rec = model.training_record();
  for (const auto& [k, v] : rec.hyperparameters) md.hyperparameters.emplace(k, v);
  for (const auto& [k, v] : rec.metrics) md.metrics.emplace(k, v);
  return package::export_package(base, sigs, opts);
}

}  // namespace kiln::train
