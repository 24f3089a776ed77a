// The batch scheduler: batched answers equal unbatched ones for many concurrent
// clients; full queues, deadlines, oversized requests, padding and unloading.
#include <atomic>
#include <future>
#include <thread>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/serving/batching.h"
#include "test_util.h"

namespace kiln::serving {
namespace {

struct Answer {
  Status status;
  TensorMap out;
  BatchInfo info;
};

std::future<Answer> submit(BatchQueue& q, TensorMap in, Clock::time_point deadline = Clock::time_point::max()) {
  auto p = std::make_shared<std::promise<Answer>>();
  BatchTask t;
  t.inputs = std::move(in);
  t.deadline = deadline;
  t.done = [p](const Status& s, TensorMap out, const BatchInfo& i) { p->set_value({s, std::move(out), i}); };
  q.submit(std::move(t));
  return p->get_future();
}

// A row-wise function: y[r] = 2 * x[r] + sum(x[r]) (exactly representable for the inputs used).
TensorMap rowwise(const TensorMap& in) {
  const Tensor& x = in.at("x");
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const int64_t n = x.dim(0), k = x.dim(1);
  for (int64_t r = 0; r < n; ++r) {
    float s = 0;
    for (int64_t j = 0; j < k; ++j) s += x.data<float>()[r * k + j];
    for (int64_t j = 0; j < k; ++j) y.data<float>()[r * k + j] = 2 * x.data<float>()[r * k + j] + s;
  }
  return {{"y", y}};
}

Tensor rows_of(int64_t n, int64_t k, float base) {
  std::vector<float> v(static_cast<size_t>(n * k));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  return Tensor::from_vector<float>(v, Shape{n, k});
}

TEST(Batching, ConcatAndSliceRows) {
  Tensor a = rows_of(2, 3, 0), b = rows_of(1, 3, 100);
  Tensor c = concat_rows({&a, &b}, 5);
  ASSERT_EQ(c.shape(), Shape({5, 3}));
  EXPECT_EQ(c.data<float>()[6], 100.f);
  EXPECT_EQ(c.data<float>()[9], 0.f);  // padding repeats the first row
  EXPECT_EQ(c.data<float>()[14], 2.f);
  Tensor s = slice_rows(c, 2, 3);
  EXPECT_EQ(s.to_vector<float>(), std::vector<float>({100, 101, 102}));
  Tensor bad = rows_of(1, 4, 0);
  EXPECT_KILN_ERROR(concat_rows({&a, &bad}, 0), kInvalidArgument, "does not stack");
  EXPECT_KILN_ERROR(slice_rows(c, 4, 6), kInvalidArgument, "rows [4, 6)");
}

TEST(Batching, ManyConcurrentClientsGetTheirOwnRowsExactly) {
  BatchScheduler sched(2);
  BatchingOptions o;
  o.max_batch_size = 16;
  o.batch_timeout_micros = 2000;
  o.max_enqueued_batches = 1000;
  std::atomic<int> batches{0};
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) { ++batches; return rowwise(in); }, o);
  constexpr int kThreads = 16, kPerThread = 25;
  std::atomic<int> bad{0}, merged{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int64_t rows = 1 + (t + i) % 4;
        Tensor x = rows_of(rows, 3, static_cast<float>(t * 1000 + i * 10));
        Answer a = submit(*q, {{"x", x}}).get();
        Tensor want = rowwise({{"x", x}}).at("y");
        if (!a.status.ok() || a.out.at("y").to_vector<float>() != want.to_vector<float>()) ++bad;
        if (a.info.batch_size > rows) ++merged;
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(merged.load(), 0) << "no request shared a batch";
  EXPECT_LT(batches.load(), kThreads * kPerThread);
}

TEST(Batching, FullQueueAnswersResourceExhaustedAtOnce) {
  BatchScheduler sched(1);
  BatchingOptions o;
  o.max_batch_size = 2;
  o.batch_timeout_micros = 0;
  o.max_enqueued_batches = 1;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> running{false};
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) {
    running = true;
    gate.wait();
    return rowwise(in);
  }, o);
  auto first = submit(*q, {{"x", rows_of(2, 3, 0)}});
  while (!running) std::this_thread::yield();
  auto second = submit(*q, {{"x", rows_of(2, 3, 0)}});  // fills the one queued batch
  auto third = submit(*q, {{"x", rows_of(1, 3, 0)}});
  ASSERT_EQ(third.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  Answer a = third.get();
  EXPECT_EQ(a.status.code, Code::kResourceExhausted);
  EXPECT_NE(a.status.message.find("queue"), std::string::npos);
  release.set_value();
  EXPECT_TRUE(first.get().status.ok());
  EXPECT_TRUE(second.get().status.ok());
}

TEST(Batching, ExpiredRequestsAreAnsweredAndNotRun) {
  BatchScheduler sched(1);
  BatchingOptions o;
  o.batch_timeout_micros = 0;
  std::atomic<int64_t> rows_run{0};
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) {
    rows_run += in.at("x").dim(0);
    return rowwise(in);
  }, o);
  Answer a = submit(*q, {{"x", rows_of(3, 3, 0)}}, Clock::now() - std::chrono::milliseconds(1)).get();
  EXPECT_EQ(a.status.code, Code::kDeadlineExceeded);
  EXPECT_NE(a.status.message.find("not run"), std::string::npos);
  EXPECT_EQ(rows_run.load(), 0);
  EXPECT_TRUE(submit(*q, {{"x", rows_of(1, 3, 0)}}, Clock::now() + std::chrono::seconds(10)).get().status.ok());
  EXPECT_EQ(rows_run.load(), 1);
}

TEST(Batching, LargeRequestsAreSplitAndAnsweredWhole) {
  BatchScheduler sched(2);
  BatchingOptions o;
  o.max_batch_size = 4;
  o.batch_timeout_micros = 500;
  std::mutex mu;
  std::vector<int64_t> batch_rows;
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) {
    std::lock_guard<std::mutex> lock(mu);
    batch_rows.push_back(in.at("x").dim(0));
    return rowwise(in);
  }, o);
  Tensor x = rows_of(11, 3, 1);
  Answer a = submit(*q, {{"x", x}}).get();
  ASSERT_TRUE(a.status.ok()) << a.status.message;
  EXPECT_EQ(a.out.at("y").to_vector<float>(), rowwise({{"x", x}}).at("y").to_vector<float>());
  for (int64_t r : batch_rows) EXPECT_LE(r, 4);
  // Inconsistent batch sizes are refused.
  Answer b = submit(*q, {{"x", rows_of(2, 3, 0)}, {"z", rows_of(3, 3, 0)}}).get();
  EXPECT_EQ(b.status.code, Code::kInvalidArgument);
  // A split request needs room for all its pieces.
  BatchingOptions small = o;
  small.max_enqueued_batches = 2;
  auto q2 = sched.add_queue("m/1/t", rowwise, small);
  Answer c = submit(*q2, {{"x", rows_of(12, 3, 0)}}).get();
  EXPECT_EQ(c.status.code, Code::kResourceExhausted);
  // A request that can never fit is refused before it is split (10^12 empty rows).
  Answer d = submit(*q, {{"x", Tensor::empty(Shape{1'000'000'000'000, 0}, DType::kF32)}}).get();
  EXPECT_EQ(d.status.code, Code::kResourceExhausted);
}

TEST(Batching, PadsToAllowedBatchSizes) {
  BatchScheduler sched(1);
  BatchingOptions o;
  o.max_batch_size = 8;
  o.allowed_batch_sizes = {4, 8};
  std::atomic<int64_t> seen{0};
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) {
    seen = in.at("x").dim(0);
    return rowwise(in);
  }, o);
  Tensor x = rows_of(3, 3, 1);
  Answer a = submit(*q, {{"x", x}}).get();
  ASSERT_TRUE(a.status.ok()) << a.status.message;
  EXPECT_EQ(seen.load(), 4);
  EXPECT_EQ(a.info.batch_size, 4);
  EXPECT_EQ(a.out.at("y").to_vector<float>(), rowwise({{"x", x}}).at("y").to_vector<float>());
}

TEST(Batching, PadsVariableLengthInputsWithZeros) {
  BatchScheduler sched(1);
  BatchingOptions o;
  o.max_batch_size = 8;
  o.batch_timeout_micros = 200000;
  o.pad_variable_length_inputs = true;
  std::vector<int64_t> shape_seen;
  std::mutex mu;
  auto q = sched.add_queue("m/1/s", [&](const TensorMap& in) {
    std::lock_guard<std::mutex> lock(mu);
    shape_seen = in.at("x").shape().vec();
    return TensorMap{{"y", in.at("x")}};
  }, o);
  auto a = submit(*q, {{"x", rows_of(1, 2, 1)}});
  auto b = submit(*q, {{"x", rows_of(1, 3, 5)}});
  Answer ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.status.ok() && rb.status.ok());
  EXPECT_EQ(shape_seen, std::vector<int64_t>({2, 3}));
  EXPECT_EQ(ra.out.at("y").to_vector<float>(), std::vector<float>({1, 2, 0}));
  EXPECT_EQ(rb.out.at("y").to_vector<float>(), std::vector<float>({5, 6, 7}));
}

TEST(Batching, ClosingFailsWhatIsQueuedWithUnavailable) {
  BatchScheduler sched(1);
  BatchingOptions o;
  o.batch_timeout_micros = 10'000'000;  // nothing runs before close
  o.max_batch_size = 100;
  auto q = sched.add_queue("m/1/s", rowwise, o);
  auto a = submit(*q, {{"x", rows_of(1, 3, 0)}});
  q->close();
  EXPECT_EQ(a.get().status.code, Code::kUnavailable);
  EXPECT_EQ(submit(*q, {{"x", rows_of(1, 3, 0)}}).get().status.code, Code::kUnavailable);
}

TEST(Batching, OptionsAreValidated) {
  BatchingOptions o;
  o.max_batch_size = 0;
  EXPECT_KILN_ERROR(o.validate(), kInvalidArgument, "max_batch_size must be positive");
  o.max_batch_size = 8;
  o.allowed_batch_sizes = {2, 4};
  EXPECT_KILN_ERROR(o.validate(), kInvalidArgument, "must equal max_batch_size");
  o.allowed_batch_sizes = {4, 2, 8};
  EXPECT_KILN_ERROR(o.validate(), kInvalidArgument, "increasing");
}

}  // namespace
}  // namespace kiln::serving
