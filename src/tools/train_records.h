#pragma once
// `kiln train --tfrecords DIR`: Fashion-MNIST from TFRecord shards of tf.train.Example
// (as `kiln records fashion-mnist --out DIR` writes them) through the input pipeline.
#include <cstdint>
#include <string>

#include "kiln/data/dataset.h"

namespace kiln::tools {

struct RecordsPipeline {
  std::string pattern;     // e.g. DIR/train-*.tfrecord
  std::string model;       // "mlp": x is [B, 784]; "cnn": [B, 28, 28, 1]
  int64_t batch_size = 128;
  int64_t max_samples = 0;  // 0: all
  bool shuffle = false;
  uint64_t seed = 0;
};

// Batches (x f32 in [0, 1], y i32): read in parallel, shuffled (10k buffer), batched,
// parsed and normalised by parallel map, prefetched; AUTOTUNE throughout.
data::Dataset fashion_mnist_records(const RecordsPipeline& p);

}  // namespace kiln::tools
