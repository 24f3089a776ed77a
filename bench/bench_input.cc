// Input pipeline throughput: TFRecord read + tf.train.Example parse + batch over
// Fashion-MNIST shards, and the share of a training step spent waiting for input.
//
//   bench_input write DIR [--shards N]        writes DIR/train-0000i-of-0000N.tfrecord
//   bench_input read DIR [--threads T] [--runs R] [--batch B]
//   bench_input fit DIR [--epochs E] [--prefetch 0|1]  input_wait without / with prefetch (default both)
// The tf.data peer is bench/input_pipeline_tf.py; bench/input_compare.sh runs both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/decode_raw.h"
#include "kiln/data/example.h"
#include "kiln/data/idx.h"
#include "kiln/data/tfrecord_dataset.h"
#include "kiln/kiln.h"
#include "kiln/train.h"

using namespace kiln;
using namespace kiln::data;

namespace {

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 0; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int write_shards(const std::string& dir, int shards) {
  FashionMnist d = load_fashion_mnist();
  const int64_t n = d.train_images.dim(0);
  const uint8_t* px = d.train_images.data<uint8_t>();
  const uint8_t* lb = d.train_labels.data<uint8_t>();
  std::string rec;
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "/train-%05d-of-%05d.tfrecord", s, shards);
    TFRecordWriter w(dir + name, {.atomic = true});
    for (int64_t i = s; i < n; i += shards) {
      Features f;
      f["image"] = Feature::of_bytes({std::string(reinterpret_cast<const char*>(px + i * 784), 784)});
      f["label"] = Feature::of_ints({lb[i]});
      rec.clear();
      encode_example(f, &rec);
      w.write(rec);
    }
    w.close();
  }
  std::printf("wrote %lld examples in %d shards to %s\n", static_cast<long long>(n), shards, dir.c_str());
  return 0;
}

// Batches of {"image": u8 [B, 28, 28], "label": i64 [B]} from the shards.
Dataset pipeline(const std::string& dir, int threads, int batch, std::shared_ptr<TFRecordStats> stats) {
  ExampleSpec spec{{"image", FixedLenFeature(Feature::kBytes, {})}, {"label", FixedLenFeature(Feature::kInt64, {})}};
  ExampleParser parser(spec);
  auto parse = [parser](const Element& b) {
    Element ex = parser.parse_batch(b[0].strings());
    return Element({"image", "label"}, {decode_raw(ex["image"].strings(), DType::kU8, {28, 28}), ex["label"]});
  };
  return tfrecord_dataset({dir + "/train-*.tfrecord"}, {.num_parallel_reads = threads, .stats = stats})
      .batch(batch)
      .map(parse, {.num_parallel_calls = threads})
      .prefetch(kAutotune)
      .with_options({.cpu_budget = threads});
}

int read_bench(const std::string& dir, int threads, int runs, int batch) {
  std::vector<double> secs;
  uint64_t records = 0, bytes = 0;
  int64_t checksum = 0;
  for (int r = 0; r < runs; ++r) {
    auto stats = std::make_shared<TFRecordStats>();
    Dataset ds = pipeline(dir, threads, batch, stats);
    auto t0 = std::chrono::steady_clock::now();
    int64_t sum = 0, seen = 0;
    for (const Element& e : ds.iterator()) {
      const Tensor& l = e.tensor("label");
      sum += static_cast<int64_t>(l.get_double(0));
      seen += l.numel();
    }
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    records = stats->records;
    bytes = stats->bytes;
    checksum = seen;
    (void)sum;
  }
  double m = median(secs);
  std::printf("kiln read+parse+batch: threads=%d batch=%d records=%llu median %.3f s over %d runs: %.0f records/s, %.1f MB/s\n",
              threads, batch, static_cast<unsigned long long>(records), m, runs, static_cast<double>(records) / m,
              static_cast<double>(bytes) / m / 1e6);
  std::printf("RESULT kiln records_per_s=%.0f mb_per_s=%.2f seen=%lld\n", static_cast<double>(records) / m,
              static_cast<double>(bytes) / m / 1e6, static_cast<long long>(checksum));
  return 0;
}

// Trains the MLP one epoch over a TFRecord pipeline whose parse is made slower than
// the step would hide without prefetch: reports input_wait with and without it.
int fit_bench(const std::string& dir, int epochs, int threads, int only) {
  for (bool prefetch : {false, true}) {
    if (only >= 0 && prefetch != (only == 1)) continue;
    set_seed(1);
    using namespace kiln::train;
    auto m = std::make_shared<Sequential>(
        std::vector<LayerPtr>{layers::Flatten(), layers::Dense(256, "relu"), layers::Dense(10)}, Shape{28, 28});
    m->compile({optimizers::Adam(), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
    ExampleSpec spec{{"image", FixedLenFeature(Feature::kBytes, {})}, {"label", FixedLenFeature(Feature::kInt64, {})}};
    ExampleParser parser(spec);
    auto to_batch = [parser](const Element& b) {
      Element ex = parser.parse_batch(b[0].strings());
      Tensor u8 = decode_raw(ex["image"].strings(), DType::kU8, {28, 28});
      return Element{Value(ops::mul(u8.to(DType::kF32), Tensor::scalar<float>(1.0f / 255))), ex["label"]};
    };
    Dataset ds = tfrecord_dataset({dir + "/train-*.tfrecord"}, {.num_parallel_reads = prefetch ? threads : 1})
                     .shuffle(4096, 7)
                     .batch(128)
                     .map(to_batch, {.num_parallel_calls = prefetch ? threads : 0});
    if (prefetch) ds = ds.prefetch(kAutotune);
    History h = m->fit(ds.with_options({.cpu_budget = threads}), {.epochs = epochs, .verbose = 2});
    std::vector<double> w = h.at("input_wait");
    std::printf("RESULT fit prefetch=%s input_wait=%.2f%% (last epoch) samples_per_s=%.0f\n", prefetch ? "on" : "off",
                100 * w.back(), h.at("samples_per_sec").back());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_input write|read|fit DIR [--shards N] [--threads T] [--runs R] [--batch B] [--epochs E]\n");
    return 2;
  }
  std::string mode = argv[1], dir = argv[2];
  try {
    if (mode == "write") return write_shards(dir, arg_int(argc, argv, "--shards", 8));
    if (mode == "read")
      return read_bench(dir, arg_int(argc, argv, "--threads", 2), arg_int(argc, argv, "--runs", 5),
                        arg_int(argc, argv, "--batch", 256));
    if (mode == "fit")
      return fit_bench(dir, arg_int(argc, argv, "--epochs", 2), arg_int(argc, argv, "--threads", 2),
                       arg_int(argc, argv, "--prefetch", -1));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
