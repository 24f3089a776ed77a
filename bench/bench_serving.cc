// Helpers of bench/serve_compare.sh (the model server's benchmarks):
//   bench_serving export-tiny DIR       a package with a 10-float input (x: f32[-1, 10] ->
//                                       probs: f32[-1, 4]) as DIR/1
//   bench_serving grpc PORT MODEL SECONDS CONNECTIONS FEATURES
//                                       closed-loop gRPC Predict load (one row of FEATURES
//                                       floats per request, CONNECTIONS threads each with
//                                       its own channel); prints requests/s, p50/p99, errors
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ops.h"
#include "kiln/package/export.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

using namespace kiln;

static int export_tiny(const std::string& dir) {
  auto w = std::make_shared<Variable>(Tensor::from_vector<float>(std::vector<float>(40, 0.05f), Shape{10, 4}), "w");
  package::ExportSignature s;
  s.fn = [w](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::softmax(ops::matmul(x[0], w->value()), -1)}; };
  s.inputs = {{"x", {{-1, 10}, DType::kF32}}};
  s.output_names = {"probs"};
  package::ExportOptions o;
  o.version = 1;
  o.overwrite = true;
  std::printf("%s\n", package::export_package(dir, {s}, o).c_str());
  return 0;
}

static int grpc_load(int port, const std::string& model, double seconds, int conns, int features) {
  tensorflow::serving::PredictRequest req;
  req.mutable_model_spec()->set_name(model);
  auto& t = (*req.mutable_inputs())[features == 784 ? "dense_input" : "x"];
  t.set_dtype(tensorflow::DT_FLOAT);
  t.mutable_tensor_shape()->add_dim()->set_size(1);
  t.mutable_tensor_shape()->add_dim()->set_size(features);
  std::vector<float> v(features, 0.5f);
  t.set_tensor_content(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  std::atomic<int64_t> errors{0};
  std::vector<std::vector<double>> lat(conns);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> ts;
  for (int c = 0; c < conns; ++c)
    ts.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per thread
      auto ch = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args);
      auto stub = tensorflow::serving::PredictionService::NewStub(ch);
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext ctx;
        tensorflow::serving::PredictResponse res;
        auto t0 = std::chrono::steady_clock::now();
        auto st = stub->Predict(&ctx, req, &res);
        lat[c].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (!st.ok()) ++errors;
      }
    });
  for (auto& th : ts) th.join();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0.0 : all[std::min(all.size() - 1, size_t(p * all.size()))] * 1e3; };
  std::printf("grpc requests=%zu rps=%.0f p50_ms=%.3f p99_ms=%.3f errors=%lld\n", all.size(), all.size() / seconds,
              pct(0.50), pct(0.99), static_cast<long long>(errors.load()));
  return errors ? 1 : 0;
}

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "export-tiny" && argc == 3) return export_tiny(argv[2]);
  if (cmd == "grpc" && argc == 7)
    return grpc_load(std::stoi(argv[2]), argv[3], std::stod(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  std::fprintf(stderr, "usage: bench_serving export-tiny DIR | grpc PORT MODEL SECONDS CONNECTIONS FEATURES\n");
  return 2;
}
