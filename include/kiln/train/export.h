#pragma once
// Exporting a trained Model as a model package (kiln/package/package.h), the
// counterpart of Keras' model.export(): the inference call (training = false) traced
// into a graph with the weights' current values frozen in, under these signatures:
//
//   serving_default (predict): inputs named after the model's Input()s (Sequential:
//     "<first layer>_input"), outputs after its output layers (Keras' names);
//     with softmax_outputs, output 0 goes through a softmax (models trained on logits).
//   classify (only with classify_signature; one input, output 0 holds class scores):
//     "scores" (output 0, softmax-ed as above) and "classes" (i64 argmax).
//
// Input specs come from the model (functional: its Input shapes; Sequential: the
// shape it was built for), with the batch dimension open (-1); give input_specs to
// override (e.g. integer inputs of a Sequential that starts with an Embedding).
// The package's metadata records the model name and the last fit()'s
// hyperparameters and final metrics (Model::training_record), plus opts.metadata.
// Weights are stored under their model paths ("dense_1/kernel").
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor_spec.h"
#include "kiln/package/export.h"
#include "kiln/train/model.h"

namespace kiln::train {

struct ModelExportOptions : package::ExportOptions {
  std::optional<std::vector<TensorSpec>> input_specs;
  bool softmax_outputs = false;
  bool classify_signature = false;
};

// Writes <base>/<version>/ and returns its path. Throws FailedPreconditionError for an
// unbuilt model, and what package::export_package throws.
std::string export_model(Model& model, const std::string& base, ModelExportOptions opts = {});

}  // namespace kiln::train
