// Streaming metrics against hand-computed values.
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/train/metrics.h"
#include "test_util.h"

namespace kiln::train {
namespace {
using kiln::testing::make;

Tensor f32(std::vector<float> v, Shape s) { return make<float>(std::move(v), s); }

TEST(MetricTest, Mean) {
  metrics::Mean m("loss");
  EXPECT_EQ(m.name(), "loss");
  EXPECT_EQ(m.result(), 0);
  m.add(2);
  m.add(4, 3);
  EXPECT_DOUBLE_EQ(m.result(), 14.0 / 4);
  m.update(Tensor(), f32({1, 2, 3}, {3}));  // adds the values, each with weight 1
  EXPECT_DOUBLE_EQ(m.result(), 20.0 / 7);
  m.reset();
  EXPECT_EQ(m.result(), 0);
  EXPECT_EQ(metrics::MeanMetric("x")->name(), "x");
}

TEST(MetricTest, Accuracy) {
  auto m = metrics::Accuracy();
  EXPECT_EQ(m->name(), "accuracy");
  m->update(make<int32_t>({1, 2, 3, 4}, {4}), f32({1, 2, 0, 4}, {4}));
  EXPECT_DOUBLE_EQ(m->result(), 0.75);
  m->update(make<int32_t>({1}, {1}), f32({0}, {1}));
  EXPECT_DOUBLE_EQ(m->result(), 3.0 / 5);
  m->reset();
  EXPECT_EQ(m->result(), 0);
  EXPECT_KILN_ERROR(m->update(f32({1, 2}, {2}), f32({1}, {1})), kInvalidArgument, "does not match");
}

TEST(MetricTest, BinaryAccuracy) {
  Tensor t = f32({1, 0, 1, 0}, {4, 1}), p = f32({0.6f, 0.4f, 0.4f, 0.7f}, {4, 1});
  auto m = metrics::BinaryAccuracy();
  m->update(t, p);  // predicted {1, 0, 0, 1}
  EXPECT_DOUBLE_EQ(m->result(), 0.5);
  auto high = metrics::BinaryAccuracy(0.65);
  high->update(t, p);  // predicted {0, 0, 0, 1}
  EXPECT_DOUBLE_EQ(high->result(), 0.25);
  EXPECT_EQ(m->name(), "binary_accuracy");
}

TEST(MetricTest, CategoricalAccuracy) {
  auto m = metrics::CategoricalAccuracy();
  m->update(f32({0, 1, 0, 1, 0, 0, 0, 0, 1}, {3, 3}),
            f32({0.1f, 0.8f, 0.1f, 0.3f, 0.6f, 0.1f, 0.2f, 0.2f, 0.6f}, {3, 3}));
  EXPECT_DOUBLE_EQ(m->result(), 2.0 / 3);
  EXPECT_EQ(m->name(), "categorical_accuracy");
  EXPECT_KILN_ERROR(m->update(f32({0, 1}, {1, 2}), f32({0, 1, 0}, {1, 3})), kInvalidArgument, "[1, 3]");
}

TEST(MetricTest, SparseCategoricalAccuracy) {
  Tensor p = f32({0.1f, 0.8f, 0.1f, 0.3f, 0.6f, 0.1f, 0.2f, 0.2f, 0.6f}, {3, 3});  // argmax {1, 1, 2}
  for (const Tensor& ids : {make<int32_t>({1, 0, 2}, {3}), make<int64_t>({1, 0, 2}, {3, 1}), f32({1, 0, 2}, {3})}) {
    auto m = metrics::SparseCategoricalAccuracy();
    m->update(ids, p);
    EXPECT_DOUBLE_EQ(m->result(), 2.0 / 3);
  }
  auto m = metrics::SparseCategoricalAccuracy();
  m->update(make<int32_t>({1, 1, 2}, {3}), p);
  m->update(make<int32_t>({0}, {1}), f32({0.1f, 0.8f, 0.1f}, {1, 3}));
  EXPECT_DOUBLE_EQ(m->result(), 3.0 / 4);
  EXPECT_KILN_ERROR(m->update(make<int32_t>({1, 1}, {2}), p), kInvalidArgument, "one class id per row");
}

TEST(MetricTest, TopK) {
  Tensor p = f32({0.1f, 0.5f, 0.4f, 0.3f, 0.6f, 0.1f, 0.5f, 0.3f, 0.2f}, {3, 3});
  auto m = metrics::SparseTopKCategoricalAccuracy(2);
  m->update(make<int32_t>({2, 2, 2}, {3}), p);  // class 2 ranks 2nd, 3rd, 3rd
  EXPECT_DOUBLE_EQ(m->result(), 1.0 / 3);
  auto dense = metrics::TopKCategoricalAccuracy(2);
  dense->update(f32({0, 0, 1, 0, 0, 1, 0, 1, 0}, {3, 3}), p);  // targets 2, 2, 1: in, out, in
  EXPECT_DOUBLE_EQ(dense->result(), 2.0 / 3);
  // Ties at the k-th value count as in (tf.math.in_top_k).
  auto tie = metrics::SparseTopKCategoricalAccuracy(1);
  tie->update(make<int32_t>({2}, {1}), f32({0.2f, 0.4f, 0.4f}, {1, 3}));
  EXPECT_DOUBLE_EQ(tie->result(), 1.0);
  // Default k = 5 with 5 classes: always in.
  auto k5 = metrics::SparseTopKCategoricalAccuracy();
  k5->update(make<int32_t>({4}, {1}), f32({0.5f, 0.4f, 0.3f, 0.2f, 0.1f}, {1, 5}));
  EXPECT_DOUBLE_EQ(k5->result(), 1.0);
  EXPECT_EQ(dense->name(), "top_k_categorical_accuracy");
  EXPECT_EQ(m->name(), "sparse_top_k_categorical_accuracy");
  EXPECT_KILN_ERROR(metrics::TopKCategoricalAccuracy(0), kInvalidArgument, "k");
}

TEST(MetricTest, AUC) {
  // Exact ROC AUC of these scores is 0.75 (3 of 4 positive/negative pairs ordered);
  // 200 thresholds separate every score, so the trapezoids reproduce it.
  Tensor t = f32({0, 0, 1, 1}, {4}), s = f32({0.1f, 0.4f, 0.35f, 0.8f}, {4});
  auto m = metrics::AUC();
  EXPECT_EQ(m->name(), "auc");
  m->update(t, s);
  EXPECT_NEAR(m->result(), 0.75, 1e-12);
  m->reset();
  m->update(t, f32({0.1f, 0.2f, 0.7f, 0.9f}, {4}));
  EXPECT_NEAR(m->result(), 1.0, 1e-12);
  m->reset();
  m->update(t, f32({0.9f, 0.7f, 0.2f, 0.1f}, {4}));
  EXPECT_NEAR(m->result(), 0.0, 1e-12);

  // 3 thresholds {-eps, 0.5, 1+eps}: ROC points (1,1), (0.5,0.5), (0,0) for scores
  // {0.1, 0.6 | 0.4, 0.8} (negatives | positives): (0.5 * 1.5 + 0.5 * 0.5) / 2 = 0.5,
  // streamed over two updates.
  auto coarse = metrics::AUC(3);
  coarse->update(f32({0, 1}, {2}), f32({0.1f, 0.4f}, {2}));
  coarse->update(f32({0, 1}, {2}), f32({0.6f, 0.8f}, {2}));
  EXPECT_NEAR(coarse->result(), 0.5, 1e-12);

  EXPECT_EQ(metrics::AUC()->result(), 0);  // no data
  EXPECT_KILN_ERROR(m->update(t, f32({0.1f, 0.2f, 1.5f, 0.3f}, {4})), kInvalidArgument, "[0, 1]");
  EXPECT_KILN_ERROR(metrics::AUC(1), kInvalidArgument, "num_thresholds");
}

TEST(MetricTest, ErrorMetrics) {
  Tensor t = f32({0, 1, 2, 3}, {2, 2}), p = f32({1, 1, 2, 1}, {2, 2});
  auto mse = metrics::MeanSquaredErrorMetric(), mae = metrics::MeanAbsoluteErrorMetric();
  mse->update(t, p);
  mae->update(t, p);
  EXPECT_DOUBLE_EQ(mse->result(), 5.0 / 4);
  EXPECT_DOUBLE_EQ(mae->result(), 3.0 / 4);
  mse->update(f32({0}, {1, 1}), f32({3}, {1, 1}));
  EXPECT_DOUBLE_EQ(mse->result(), 14.0 / 5);
  EXPECT_EQ(mse->name(), "mean_squared_error");
  EXPECT_EQ(mae->name(), "mean_absolute_error");
}

TEST(MetricTest, GetByName) {
  EXPECT_EQ(metrics::get("accuracy")->name(), "accuracy");
  EXPECT_EQ(metrics::get("acc")->name(), "accuracy");
  EXPECT_EQ(metrics::get("binary_accuracy")->name(), "binary_accuracy");
  EXPECT_EQ(metrics::get("categorical_accuracy")->name(), "categorical_accuracy");
  EXPECT_EQ(metrics::get("sparse_categorical_accuracy")->name(), "sparse_categorical_accuracy");
  EXPECT_EQ(metrics::get("top_k_categorical_accuracy")->name(), "top_k_categorical_accuracy");
  EXPECT_EQ(metrics::get("auc")->name(), "auc");
  EXPECT_EQ(metrics::get("mse")->name(), "mean_squared_error");
  EXPECT_EQ(metrics::get("mae")->name(), "mean_absolute_error");
  EXPECT_KILN_ERROR(metrics::get("f1"), kInvalidArgument, "f1");
}

}  // namespace
}  // namespace kiln::train
