#pragma once
// TensorFlow Serving's REST JSON (docs/serving-api.md): request bodies -> tensors or
// tf.Examples, tensors and statuses -> response bodies. Parsing uses simdjson.
//
// Every malformed body throws kiln::InvalidArgumentError whose message says what was
// expected and where ("instances[3]: expected 784 values, got 783"); nothing here
// aborts or reads past the body.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/example.h"
#include "kiln/package/package.h"
#include "kiln/serving/batching.h"
#include "kiln/serving/model_manager.h"

namespace kiln::serving::json {

// POST ...:predict
//   {"signature_name": "s"?, "instances": [row, ...]}   row format: one row per entry;
//       a row is the input's value (single-input signatures) or {"input": value, ...}
//   {"signature_name": "s"?, "inputs": value | {"input": value, ...}}   columnar
// A value is a number, true/false, a nested list (rectangular), or {"b64": "..."}
// (decoded bytes become the elements of a u8/i8 input). Numbers convert to the input's
// dtype (integers only for integer inputs; range-checked); shapes must fit the spec.
struct PredictRequest {
  std::string signature_name;  // as given ("" when absent)
  bool row_format = true;      // instances (true) or inputs (false)
  TensorMap inputs;
};
// `lookup` maps the body's signature_name ("" when absent) to the signature to decode
// against (it throws NotFoundError for an unknown one: passed through).
PredictRequest decode_predict(std::string_view body,
                              const std::function<const package::Signature&(const std::string&)>& lookup);

// {"predictions": [...]} (row format: one entry per row, an object of the outputs when
// there are several) or {"outputs": value | {"name": value, ...}} (columnar). Outputs in
// the signature's order; floats in shortest round-trip form, NaN/Infinity as TF writes them.
std::string encode_predict(const package::Signature& sig, const TensorMap& outputs, bool row_format);

// POST ...:classify / :regress: {"signature_name"?, "context"?: {...}, "examples": [{...}]}
// Each feature value: a number or list of numbers (float_list, or int64_list when all
// are integers), a string or list of strings, or {"b64": ...} (bytes_list).
struct ExamplesRequest {
  std::string signature_name;
  std::vector<Features> examples;
  bool has_context = false;
  Features context;
};
ExamplesRequest decode_examples(std::string_view body);
// {"results": [[["label", score], ...], ...]}
std::string encode_classify(const std::vector<std::vector<std::pair<std::string, float>>>& results);
// {"results": [v, ...]}
std::string encode_regress(const std::vector<float>& results);

// GET /v1/models/{name}[/versions/{v}]: {"model_version_status": [{"version": "3",
// "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
std::string encode_status(const std::vector<VersionStatus>& versions);
// GET .../metadata: {"model_spec": {"name", "signature_name": "", "version"},
//  "metadata": {"signature_def": {"signature_def": {name: {"inputs": {..TensorInfo..},
//  "outputs": {...}, "method_name": ...}}}}} with TensorInfo as TF's JSON form:
//  {"dtype": "DT_FLOAT", "tensor_shape": {"dim": [{"size": "-1", "name": ""}], "unknown_rank": false}, "name": "x"}
std::string encode_metadata(const std::string& model, int64_t version, const std::vector<package::Signature>& sigs);
// {"error": "message"} with the message escaped.
std::string encode_error(std::string_view message);

}  // namespace kiln::serving::json
