#include "train_records.h"

#include "kiln/data/decode_raw.h"
#include "kiln/data/example.h"
#include "kiln/data/tfrecord_dataset.h"
#include "kiln/ops.h"

namespace kiln::tools {

data::Dataset fashion_mnist_records(const RecordsPipeline& p) {
  using namespace kiln::data;
  ExampleParser parser(
      {{"image", FixedLenFeature(Feature::kBytes, {})}, {"label", FixedLenFeature(Feature::kInt64, {})}});
  const bool mlp = p.model == "mlp";
  auto to_batch = [parser, mlp](const Element& b) {
    Element ex = parser.parse_batch(b[0].strings());
    const int64_t n = ex["label"].shape()[0];
    Tensor x = ops::cast(decode_raw(ex["image"].strings(), DType::kU8, {28, 28}), DType::kF32) * (1.0 / 255.0);
    x = mlp ? ops::reshape(x, {n, 784}) : ops::reshape(x, {n, 28, 28, 1});
    return Element{Value(x), Value(ops::cast(ex.tensor("label"), DType::kI32))};
  };
  Dataset ds = tfrecord_dataset({p.pattern}, {.num_parallel_reads = kAutotune});
  if (p.max_samples > 0) ds = ds.take(p.max_samples);
  if (p.shuffle) ds = ds.shuffle(10000, p.seed == 0 ? 1 : p.seed);
  const std::vector<int64_t> x_dims = mlp ? std::vector<int64_t>{-1, 784} : std::vector<int64_t>{-1, 28, 28, 1};
  ElementSpec out{{}, {TypeSpec::tensor(DType::kF32, x_dims),
                       TypeSpec::tensor(DType::kI32, {-1})}};
  return ds.batch(p.batch_size)
      .map(to_batch, {.num_parallel_calls = kAutotune, .output_spec = out})
      .prefetch(kAutotune);
}

}  // namespace kiln::tools
