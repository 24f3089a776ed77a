// libFuzzer target: whole REST requests through kiln's REST handler (routing, deadline
// parsing, JSON decoding, model lookup, predict/classify/regress, status, metadata)
// against a small model. Input: "METHOD TARGET\n" then the body. Every answer must be a
// TF Serving status code with a JSON body ({"error": ...} unless 200); a 500 (an
// internal error) or an exception escaping is a finding.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/ops.h"
#include "kiln/package/export.h"
#include "kiln/core/metrics.h"
#include "kiln/serving/model_manager.h"
#include "serving/log.h"
#include "serving/rest_api.h"
#include "serving/service.h"

using namespace kiln;
using namespace kiln::serving;

namespace {

struct World {
  Metrics metrics;
  std::unique_ptr<ModelManager> manager;
  std::unique_ptr<Service> service;
  HttpHandler handler;
  World() {
    set_log_enabled(false);
    auto dir = std::filesystem::temp_directory_path() / ("kiln_rest_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    auto w = std::make_shared<Variable>(Tensor::from_vector<float>(std::vector<float>(12, 0.1f), Shape{4, 3}), "w");
    package::ExportSignature predict;
    predict.fn = [w](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{ops::softmax(ops::matmul(x[0], w->value()), -1)};
    };
    predict.inputs = {{"x", {{-1, 4}, DType::kF32}}};
    predict.output_names = {"probs"};
    package::ExportSignature classify = predict;
    classify.name = "classify";
    classify.method = package::kClassifyMethod;
    classify.output_names = {"scores"};
    package::ExportSignature regress = predict;
    regress.name = "regress";
    regress.method = package::kRegressMethod;
    regress.fn = [w](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{ops::sum(ops::matmul(x[0], w->value()), {-1})};
    };
    regress.output_names = {"outputs"};
    package::ExportOptions o;
    o.version = 1;
    package::export_package(dir.string(), {predict, classify, regress}, o);
    ManagerOptions mo;
    mo.poll_seconds = 0;
    mo.metrics = &metrics;
    manager = std::make_unique<ModelManager>(mo);
    ModelConfig c;
    c.name = "m";
    c.base_path = dir.string();
    c.labels = {{"stable", 1}};
    manager->set_config({c});
    manager->poll_now();
    std::filesystem::remove_all(dir);  // the loaded version keeps its mapped weights; no polling after this
    service = std::make_unique<Service>(*manager, metrics);
    handler = make_rest_handler(*service, RestOptions{});
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World world;
  std::string in(reinterpret_cast<const char*>(data), size);
  auto nl = in.find('\n');
  std::string line = in.substr(0, nl);
  HttpRequest req;
  auto sp = line.find(' ');
  req.method = line.substr(0, sp);
  req.target = sp == std::string::npos ? "/" : line.substr(sp + 1);
  req.body = nl == std::string::npos ? "" : in.substr(nl + 1);
  int status = 0;
  std::string body;
  world.handler(std::move(req), [&](HttpResponse r) {
    status = r.status;
    body = std::move(r.body);
  });
  // Without batching every answer is given before the handler returns.
  if (status == 0) std::abort();
  switch (status) {
    case 200: case 400: case 404: case 413: case 429: case 501: case 503: case 504: break;
    default: std::abort();  // 500 or an unexpected code
  }
  if (status != 200 && body.find("\"error\"") == std::string::npos) std::abort();
  if (world.service && world.manager->loads() > 1) std::abort();
  return 0;
}
