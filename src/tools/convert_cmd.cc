#include "convert_cmd.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/npy.h"
#include "kiln/data/idx.h"
#include "kiln/ops.h"
#include "kiln/package/convert.h"
#include "kiln/package/saved_model.h"

namespace kiln::tools {
namespace fs = std::filesystem;
using package::SavedModel;

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& a) {
  auto* c = app.add_subcommand("convert", "Optimise a model package for inference and lower its precision (fp32|fp16|bf16|int8)");
  c->add_option("--dir", a.dir, "The source package version directory (or its base: the highest version)")->required();
  c->add_option("--output_dir,--output-dir", a.output_dir, "The version directory to write (e.g. models/fmnist/2)")->required();
  c->add_option("--precision", a.precision, "fp32, fp16, bf16 or int8")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8"}))
      ->capture_default_str();
  c->add_option("--calibration_data,--calibration-data", a.calibration_data,
                "int8: FILE.npy (inputs of the signature's single input) or fashion-mnist[:N] (N training images, "
                "default 1000)");
  c->add_option("--validation_data,--validation-data", a.validation_data,
                "fashion-mnist[:N]: print the accuracy of both packages on N test images (default all 10000)");
  c->add_option("--signature", a.signature, "The signature to calibrate, validate and time")->capture_default_str();
  c->add_option("--batch_size,--batch-size", a.batch_size, "Batch size of the latency comparison")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  c->add_flag("--overwrite", a.overwrite, "Replace --output_dir if it exists");
  return c;
}

namespace {

// "fashion-mnist" or "fashion-mnist:N" -> N (default_n when absent); -1 if not that.
int64_t fashion_mnist_count(const std::string& spec, int64_t default_n) {
  const std::string key = "fashion-mnist";
  if (spec.rfind(key, 0) != 0) return -1;
  if (spec.size() == key.size()) return default_n;
  if (spec[key.size()] != ':') return -1;
  try {
    const int64_t n = std::stoll(spec.substr(key.size() + 1));
    if (n > 0) return n;
  } catch (...) {
  }
  throw InvalidArgumentError("'" + spec + "': expected fashion-mnist:N with N > 0");
}

// Fashion-MNIST images shaped for the signature's input ([-1, 784] or [-1, 28, 28, 1]).
Tensor images_for(const Tensor& u8, int64_t n, const package::TensorInfo& in) {
  n = std::min(n, u8.dim(0));
  Tensor x = ops::cast(ops::slice(u8, {0, 0, 0}, {n, 28, 28}), DType::kF32) * (1.0 / 255.0);
  std::vector<int64_t> shape = in.spec.shape;
  if (shape.empty()) throw InvalidArgumentError("input '" + in.name + "' is a scalar, not images");
  shape[0] = n;
  int64_t per = 1;
  for (size_t d = 1; d < shape.size(); ++d) per *= shape[d];
  if (per != 784 || in.spec.dtype != DType::kF32)
    throw InvalidArgumentError("fashion-mnist data needs a f32 input of 784 values per sample; input '" + in.name +
                               "' is " + package::spec_str(in.spec));
  return ops::reshape(x, shape);
}

double accuracy(const SavedModel& m, const std::string& sig, const std::string& input, const Tensor& x,
                const Tensor& labels) {
  int64_t correct = 0;
  for (int64_t b = 0; b < x.dim(0); b += 256) {
    const int64_t n = std::min<int64_t>(256, x.dim(0) - b);
    std::vector<int64_t> begin(static_cast<size_t>(x.rank()), 0), size = x.shape().vec();
    begin[0] = b;
    size[0] = n;
    Tensor out = m.run(sig, std::map<std::string, Tensor>{{input, ops::slice(x, begin, size)}}).begin()->second;
    std::vector<int64_t> pred = ops::argmax(out, -1).to_vector<int64_t>();
    std::vector<int64_t> want = ops::slice(labels, {b}, {n}).to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == want[i];
  }
  return static_cast<double>(correct) / static_cast<double>(x.dim(0));
}

double median_ms(const SavedModel& m, const std::string& sig, const std::string& input, const Tensor& x) {
  std::vector<double> t;
  for (int r = 0; r < 23; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    m.run(sig, std::map<std::string, Tensor>{{input, x}});
    if (r >= 3) t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int64_t dir_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

}  // namespace

int run_convert(const ConvertArgs& a) {
  const std::string src_dir = package::resolve_version_dir(a.dir);
  auto src = SavedModel::load(src_dir);
  const package::Signature& sig = src->signature(a.signature);
  if (sig.inputs.size() != 1 && (!a.calibration_data.empty() || !a.validation_data.empty()))
    throw InvalidArgumentError("--calibration_data/--validation_data need a signature with one input; '" + sig.name +
                               "' has " + std::to_string(sig.inputs.size()));
  std::optional<data::FashionMnist> fm;
  auto fmnist = [&]() -> const data::FashionMnist& {
    if (!fm) fm = data::load_fashion_mnist();
    return *fm;
  };

  package::ConvertOptions opts;
  opts.precision = a.precision;
  opts.overwrite = a.overwrite;
  if (!a.calibration_data.empty()) {
    Tensor x;
    if (int64_t n = fashion_mnist_count(a.calibration_data, 1000); n > 0)
      x = images_for(fmnist().train_images, n, sig.inputs[0]);
    else
      x = read_npy(a.calibration_data);
    for (int64_t b = 0; b < x.dim(0); b += 100) {  // batches of 100
      std::vector<int64_t> begin(static_cast<size_t>(x.rank()), 0), size = x.shape().vec();
      begin[0] = b;
      size[0] = std::min<int64_t>(100, x.dim(0) - b);
      opts.calibration.push_back({{sig.inputs[0].name, ops::slice(x, begin, size)}});
    }
  } else if (a.precision == "int8") {
    throw InvalidArgumentError("--precision int8 needs --calibration_data (FILE.npy or fashion-mnist[:N])");
  }

  const auto report = package::convert_package(src_dir, a.output_dir, opts);
  auto dst = SavedModel::load(a.output_dir);
  std::printf("converted %s -> %s (%s)\n", src_dir.c_str(), a.output_dir.c_str(), a.precision.c_str());
  if (a.precision == "int8")
    std::printf("  int8: %d matmul/conv nodes quantized, %d calibration batches\n", report.nodes_quantized,
                report.calibration_batches);
  if (a.precision == "fp16" || a.precision == "bf16")
    std::printf("  %s: %d weights stored in 16 bits (compute stays f32)\n", a.precision.c_str(), report.weights_lowered);
  std::printf("  package size: %.3f MiB -> %.3f MiB\n", static_cast<double>(dir_bytes(src_dir)) / (1 << 20),
              static_cast<double>(dir_bytes(a.output_dir)) / (1 << 20));
  if (!a.validation_data.empty()) {
    const int64_t n = fashion_mnist_count(a.validation_data, 10000);
    if (n < 0) throw InvalidArgumentError("--validation_data: expected fashion-mnist[:N], got '" + a.validation_data + "'");
    Tensor x = images_for(fmnist().test_images, n, sig.inputs[0]);
    Tensor y = ops::cast(ops::slice(fmnist().test_labels, {0}, {x.dim(0)}), DType::kI64);
    const double before = accuracy(*src, sig.name, sig.inputs[0].name, x, y);
    const double after = accuracy(*dst, sig.name, sig.inputs[0].name, x, y);
    std::printf("  accuracy on %lld test images: %.4f -> %.4f (%+.2f points)\n", static_cast<long long>(x.dim(0)), before,
                after, (after - before) * 100);
  }
  // Latency at --batch_size on the signature's input (open sizes = batch size).
  std::vector<int64_t> shape = sig.inputs[0].spec.shape;
  for (int64_t& d : shape)
    if (d < 0) d = a.batch_size;
  if (sig.inputs.size() == 1 && sig.inputs[0].spec.dtype == DType::kF32) {
    Tensor x = ops::random_uniform(Shape(shape), 0, 1, DType::kF32, 1);
    const double t0 = median_ms(*src, sig.name, sig.inputs[0].name, x);
    const double t1 = median_ms(*dst, sig.name, sig.inputs[0].name, x);
    std::printf("  latency at batch %lld (median of 20): %.3f ms -> %.3f ms (%.2fx)\n",
                static_cast<long long>(a.batch_size), t0, t1, t0 / t1);
  }
  return 0;
}

}  // namespace kiln::tools
