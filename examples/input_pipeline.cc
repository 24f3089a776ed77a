// An input pipeline from public headers only: Fashion-MNIST (Debian's package) written
// as TFRecord shards of tf.train.Example, then read back through kiln::data the way a
// tf.data user would (parallel reads, shuffle, batch, parallel parse, prefetch) and fed
// to Model::fit. Prints the pipeline, the epoch's input wait and the test accuracy.
//
//   build/default/examples/input_pipeline [samples]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "kiln/data/dataset.h"
#include "kiln/data/decode_raw.h"
#include "kiln/data/example.h"
#include "kiln/data/idx.h"
#include "kiln/data/tfrecord_dataset.h"
#include "kiln/kiln.h"
#include "kiln/train.h"

using namespace kiln;
using namespace kiln::data;
using namespace kiln::train;

// images u8 [N, 28, 28], labels u8 [N] -> `shards` files DIR/NAME-i.tfrecord of Examples.
void write_shards(const Tensor& images, const Tensor& labels, int64_t n, const std::string& prefix, int shards) {
  for (int s = 0; s < shards; ++s) {
    TFRecordWriter w(prefix + "-" + std::to_string(s) + ".tfrecord", {.atomic = true});
    for (int64_t i = s; i < n; i += shards) {
      const char* px = reinterpret_cast<const char*>(images.data<uint8_t>() + i * 784);
      w.write(encode_example({{"image", Feature::of_bytes({std::string(px, 784)})},
                              {"label", Feature::of_ints({labels.data<uint8_t>()[i]})}}));
    }
    w.close();
  }
}

// Batches (x f32 [B, 784] in [0, 1], y i32 [B]) from the shards matching `pattern`.
Dataset pipeline(const std::string& pattern, bool shuffle) {
  ExampleParser parser(
      {{"image", FixedLenFeature(Feature::kBytes, {})}, {"label", FixedLenFeature(Feature::kInt64, {})}});
  auto to_xy = [parser](const Element& batch) {
    Element ex = parser.parse_batch(batch[0].strings());
    Tensor x = ops::cast(decode_raw(ex["image"].strings(), DType::kU8, {784}), DType::kF32) * (1.0 / 255.0);
    return Element{Value(x), Value(ops::cast(ex.tensor("label"), DType::kI32))};
  };
  Dataset ds = tfrecord_dataset({pattern}, {.num_parallel_reads = kAutotune});
  if (shuffle) ds = ds.shuffle(4096, /*seed=*/7);
  return ds.batch(128).map(to_xy, {.num_parallel_calls = kAutotune}).prefetch(kAutotune);
}

int main(int argc, char** argv) {
  const int64_t samples = argc > 1 ? std::atoll(argv[1]) : 60000;
  try {
    FashionMnist fm = load_fashion_mnist();
    auto dir = std::filesystem::temp_directory_path() / ("kiln_input_pipeline." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const int64_t n_train = std::min(samples, fm.train_images.dim(0));
    const int64_t n_test = std::min(samples, fm.test_images.dim(0));
    write_shards(fm.train_images, fm.train_labels, n_train, (dir / "train").string(), 4);
    write_shards(fm.test_images, fm.test_labels, n_test, (dir / "test").string(), 2);

    Dataset train = pipeline((dir / "train-*.tfrecord").string(), true);
    Dataset test = pipeline((dir / "test-*.tfrecord").string(), false);
    std::cout << train.describe();

    set_seed(1);
    auto model = std::make_shared<Sequential>(
        std::vector<LayerPtr>{layers::Dense(128, "relu"), layers::Dense(10)}, Shape{784});
    model->compile({optimizers::Adam(), {losses::SparseCategoricalCrossentropy(/*from_logits=*/true)}, {"accuracy"}});
    History h = model->fit(train, {.epochs = 2, .verbose = 2});
    Logs t = model->evaluate(test);
    std::printf("input wait %.1f%% of the last epoch, test accuracy %.4f\n", 100 * h.at("input_wait").back(),
                t["accuracy"]);
    std::filesystem::remove_all(dir);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
