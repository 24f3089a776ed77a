// tf.train.Example decoding: kiln's hand-written parser (ExampleParser::parse_batch,
// parse, decode_example) against libprotobuf's generated tensorflow::Example
// (ParseFromString, then the features copied into batch outputs, as a pipeline
// would). Prints best-of-7 times for 5000 Fashion-MNIST-like records.
//   build/release/bin/bench_example
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kiln/data/example.h"
#include "tensorflow/example.pb.h"

using namespace kiln;
using namespace kiln::data;

namespace {

template <typename Fn>
double best_ms(Fn&& fn) {
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  const int n = 5000;
  std::mt19937_64 rng(7);
  std::vector<std::string> bytes_records, float_records;
  for (int i = 0; i < n; ++i) {
    std::string image(784, '\0');
    for (char& c : image) c = static_cast<char>(rng());
    int64_t label = static_cast<int64_t>(rng() % 10);
    bytes_records.push_back(
        encode_example({{"image", Feature::of_bytes({image})}, {"label", Feature::of_ints({label})}}));
    std::vector<float> pixels(image.begin(), image.end());
    float_records.push_back(
        encode_example({{"image", Feature::of_floats(pixels)}, {"label", Feature::of_ints({label})}}));
  }
  for (int variant = 0; variant < 2; ++variant) {
    const auto& records = variant == 0 ? bytes_records : float_records;
    std::vector<std::string_view> views(records.begin(), records.end());
    ExampleSpec spec{{"label", FixedLenFeature{Feature::kInt64, {}}}};
    if (variant == 0)
      spec["image"] = FixedLenFeature{Feature::kBytes, {}};
    else
      spec["image"] = FixedLenFeature{Feature::kFloat, {784}};
    ExampleParser parser(spec);
    const size_t kBatch = 256;  // a typical batch: outputs stay in cache, as in a pipeline
    double batch = best_ms([&] {
      for (size_t i = 0; i < views.size(); i += kBatch)
        parser.parse_batch(std::span<const std::string_view>(views).subspan(i, std::min(kBatch, views.size() - i)));
    });
    double single = best_ms([&] {
      for (auto v : views) parser.parse(v);
    });
    double full = best_ms([&] {
      for (auto v : views) decode_example(v);
    });
    // libprotobuf: parse each record, then copy the two features into batch outputs.
    double proto = best_ms([&] {
      for (int start = 0; start < n; start += static_cast<int>(kBatch)) {
        const int64_t b = std::min<int64_t>(kBatch, n - start);
        std::vector<std::string> images;
        Tensor pixels = Tensor::empty(Shape{b, 784}, DType::kF32);
        Tensor labels = Tensor::empty(Shape{b}, DType::kI64);
        if (variant == 0) images.resize(b);
        for (int64_t j = 0; j < b; ++j) {
          const int64_t i = start + j;
          tensorflow::Example ex;
          if (!ex.ParseFromString(records[i])) std::abort();
          const auto& map = ex.features().feature();
          const auto& im = map.at("image");
          if (variant == 0) {
            images[j] = im.bytes_list().value(0);
          } else {
            if (im.float_list().value_size() != 784) std::abort();
            std::memcpy(pixels.data<float>() + 784 * j, im.float_list().value().data(), 784 * 4);
          }
          labels.data<int64_t>()[j] = map.at("label").int64_list().value(0);
        }
      }
    });
    std::printf(
        "%s image + int64 label, %d records: kiln parse_batch(256) %.2f ms (%.0f ns/record), kiln parse x%d %.2f ms, "
        "kiln decode_example %.2f ms, libprotobuf ParseFromString+copy into batches of 256 %.2f ms -> %.1fx\n",
        variant == 0 ? "784-byte bytes_list" : "784-float float_list", n, batch, 1e6 * batch / n, n, single, full,
        proto, proto / batch);
  }
  return 0;
}
