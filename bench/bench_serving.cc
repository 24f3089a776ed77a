// Helpers of bench/serve_compare.sh (the model server's benchmarks):
//   bench_serving export-tiny DIR       a package with a 10-float input (x: f32[-1, 10] ->
//                                       probs: f32[-1, 4]) as DIR/1
//   bench_serving export-wide DIR       a wide MLP (x: f32[-1, 784] -> 2048 -> 2048 -> 10,
//                                       ReLU, softmax; 23 MB of weights) as DIR/1: batch 1
//                                       is memory-bound (matrix-vector), as on a GPU
//   bench_serving grpc PORT MODEL SECONDS CONNECTIONS FEATURES
//                                       closed-loop gRPC Predict load (one row of FEATURES
//                                       floats per request, CONNECTIONS threads each with
//                                       its own channel); prints requests/s, p50/p99, errors
//   bench_serving json [ROWS]           REST predict body decoding: kiln's simdjson decoder
//                                       (json_codec) vs nlohmann::json parse + copy into the
//                                       same f32 tensor, ROWS x 784 floats; medians of 15
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/ops.h"
#include "serving/json_codec.h"
#include "kiln/package/export.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

using namespace kiln;

// Writes version 1 of a one-signature package (overwriting) and prints its path.
static int export_one(const std::string& dir, const package::ExportSignature& s) {
  package::ExportOptions o;
  o.version = 1;
  o.overwrite = true;
  std::printf("%s\n", package::export_package(dir, {s}, o).c_str());
  return 0;
}

static int export_tiny(const std::string& dir) {
  auto w = std::make_shared<Variable>(Tensor::from_vector<float>(std::vector<float>(40, 0.05f), Shape{10, 4}), "w");
  package::ExportSignature s;
  s.fn = [w](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::softmax(ops::matmul(x[0], w->value()), -1)}; };
  s.inputs = {{"x", {{-1, 10}, DType::kF32}}};
  s.output_names = {"probs"};
  return export_one(dir, s);
}

static int export_wide(const std::string& dir) {
  auto w1 = std::make_shared<Variable>(kiln::Tensor::zeros(Shape{784, 2048}), "w1");
  auto w2 = std::make_shared<Variable>(kiln::Tensor::zeros(Shape{2048, 2048}), "w2");
  auto w3 = std::make_shared<Variable>(kiln::Tensor::zeros(Shape{2048, 10}), "w3");
  for (auto* w : {w1.get(), w2.get(), w3.get()}) {
    float* p = w->value().data<float>();
    for (int64_t i = 0; i < w->value().numel(); ++i) p[i] = static_cast<float>((i * 7919) % 1000) * 1e-5f - 5e-3f;
  }
  package::ExportSignature s;
  s.fn = [w1, w2, w3](const std::vector<Tensor>& x) {
    Tensor h = ops::relu(ops::matmul(x[0], w1->value()));
    h = ops::relu(ops::matmul(h, w2->value()));
    return std::vector<Tensor>{ops::softmax(ops::matmul(h, w3->value()), -1)};
  };
  s.inputs = {{"x", {{-1, 784}, DType::kF32}}};
  s.output_names = {"probs"};
  return export_one(dir, s);
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

static int json_bench(int rows) {
  std::string body = "{\"instances\": [";
  for (int r = 0; r < rows; ++r) {
    body += r ? ", [" : "[";
    for (int k = 0; k < 784; ++k) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%s%.4f", k ? ", " : "", ((r * 784 + k) % 255) / 255.0);
      body += buf;
    }
    body += "]";
  }
  body += "]}";
  package::Signature sig;
  sig.name = "serving_default";
  sig.inputs = {{"x", {{-1, 784}, DType::kF32}}};
  auto lookup = [&](const std::string&) -> const package::Signature& { return sig; };
  auto kiln_once = [&] { return serving::json::decode_predict(body, lookup).inputs.at("x"); };
  auto peer_once = [&] {
    auto j = nlohmann::json::parse(body);
    const auto& inst = j.at("instances");
    Tensor t = Tensor::empty(Shape{static_cast<int64_t>(inst.size()), 784}, DType::kF32);
    float* p = t.data<float>();
    for (const auto& row : inst) {
      if (row.size() != 784) throw std::runtime_error("bad row");
      for (const auto& v : row) *p++ = v.get<float>();
    }
    return t;
  };
  if (kiln_once().to_vector<float>() != peer_once().to_vector<float>()) {
    std::fprintf(stderr, "decoders disagree\n");
    return 1;
  }
  auto median_ms = [](auto&& f) {
    std::vector<double> ts;
    for (int i = 0; i < 15; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };
  double k = median_ms(kiln_once), n = median_ms(peer_once);
  double mb = body.size() / 1e6;
  std::printf("json decode %d x 784 floats (%.2f MB): kiln %.3f ms (%.0f MB/s) | nlohmann %.3f ms (%.0f MB/s) | %.1fx\n",
              rows, mb, k, mb / (k / 1e3), n, mb / (n / 1e3), n / k);
  return 0;
}

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "export-tiny" && argc == 3) return export_tiny(argv[2]);
  if (cmd == "export-wide" && argc == 3) return export_wide(argv[2]);
  if (cmd == "json") return json_bench(argc > 2 ? std::stoi(argv[2]) : 64);
  if (cmd == "grpc" && argc == 7)
    return grpc_load(std::stoi(argv[2]), argv[3], std::stod(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  std::fprintf(stderr, "usage: bench_serving export-tiny DIR | grpc PORT MODEL SECONDS CONNECTIONS FEATURES | json [ROWS]\n");
  return 2;
}
