#include "kiln/data/dataset.h"

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include <unistd.h>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::TempDir;

// The i64 scalar values of component `c` of every element.
std::vector<int64_t> ints(const Dataset& ds, size_t c = 0) {
  std::vector<int64_t> v;
  for (const Element& e : ds.iterator()) {
    const Tensor& t = e.tensor(c);
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<int64_t>(t.get_double(i)));
  }
  return v;
}

std::vector<int64_t> iota(int64_t a, int64_t b, int64_t step = 1) {
  std::vector<int64_t> v;
  for (int64_t i = a; step > 0 ? i < b : i > b; i += step) v.push_back(i);
  return v;
}

Element plus(const Element& e, int64_t k) { return {Value(Tensor::scalar<int64_t>(e.tensor(0).item<int64_t>() + k))}; }

TEST(Value, StringTensorAndDescriptions) {
  StringTensor s(Shape{2}, {"a", "bc"});
  Value v(s);
  EXPECT_TRUE(v.is_string());
  EXPECT_EQ(v.desc(), "string[2]");
  EXPECT_EQ(v.nbytes(), 3 + 2 * sizeof(std::string));
  EXPECT_KILN_ERROR(v.tensor(), kInvalidArgument, "expected a numeric tensor, got string[2]");
  EXPECT_KILN_ERROR(StringTensor(Shape{3}, {"a"}), kInvalidArgument, "needs 3 values, got 1");
  Element named({"image", "label"}, {Value(Tensor::zeros({2, 2})), Value("cat")});
  EXPECT_EQ(named.desc(), "{image: f32[2, 2], label: string[]}");
  EXPECT_EQ(named["label"].strings().item(), "cat");
  EXPECT_KILN_ERROR(named["labl"], kNotFound, "it has: image, label");
  EXPECT_KILN_ERROR(named[5], kOutOfRange, "component 5");
  EXPECT_KILN_ERROR(Element({"a", "a"}, {Value("x"), Value("y")}), kInvalidArgument, "duplicate component name 'a'");
}

TEST(Value, SpecMerge) {
  TypeSpec a = TypeSpec::of(Value(Tensor::zeros({3, 4})));
  TypeSpec b = TypeSpec::of(Value(Tensor::zeros({5, 4})));
  EXPECT_EQ(a.merge(b).str(), "f32[-1, 4]");
  EXPECT_EQ(a.merge(TypeSpec::of(Value(Tensor::zeros({4})))).str(), "f32[?]");
  EXPECT_TRUE(a.merge(b).matches(Value(Tensor::zeros({9, 4}))));
  EXPECT_FALSE(a.merge(b).matches(Value(Tensor::zeros({9, 5}))));
  EXPECT_KILN_ERROR(a.merge(TypeSpec::string({3, 4})), kInvalidArgument, "component types differ");
}

TEST(Dataset, RangeAndCardinality) {
  EXPECT_EQ(ints(Dataset::range(5)), iota(0, 5));
  EXPECT_EQ(ints(Dataset::range(10, 0, -3)), (std::vector<int64_t>{10, 7, 4, 1}));
  EXPECT_EQ(Dataset::range(10, 0, -3).cardinality(), 4);
  EXPECT_EQ(Dataset::range(3, 3).cardinality(), 0);
  EXPECT_EQ(Dataset::range(7).repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::range(7).filter([](const Element&) { return true; }).cardinality(), kUnknownCardinality);
  EXPECT_EQ(Dataset::range(10).batch(3).cardinality(), 4);
  EXPECT_EQ(Dataset::range(10).batch(3, true).cardinality(), 3);
  EXPECT_EQ(Dataset::range(10).shard(3, 0).cardinality(), 4);
  EXPECT_EQ(Dataset::range(10).shard(3, 2).cardinality(), 3);
  EXPECT_EQ(Dataset::range(10).skip(4).take(3).cardinality(), 3);
  EXPECT_EQ(Dataset::range(10).take(-1).cardinality(), 10);
  EXPECT_KILN_ERROR(Dataset::range(0, 5, 0), kInvalidArgument, "step must not be 0");
}

TEST(Dataset, TensorSlicesNamedAndViews) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = Tensor::from_vector<int64_t>({7, 8, 9}, {3});
  auto ds = Dataset::from_tensor_slices(Element({"x", "y"}, {x, y}));
  EXPECT_EQ(ds.element_spec().str(), "{x: f32[2], y: i64[]}");
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (const Element& e : ds.iterator()) {
    for (float f : e.tensor("x").to_vector<float>()) xs.push_back(f);
    ys.push_back(e.tensor("y").item<int64_t>());
  }
  EXPECT_EQ(xs, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ys, (std::vector<int64_t>{7, 8, 9}));
  EXPECT_KILN_ERROR(Dataset::from_tensor_slices({x, Tensor::zeros({4})}), kInvalidArgument,
                    "components differ in dimension 0");
  EXPECT_KILN_ERROR(Dataset::from_tensor_slices({Tensor::scalar<float>(1)}), kInvalidArgument, "rank >= 1");
  // Strings slice too.
  auto s = Dataset::from_tensor_slices({StringTensor::vector({"a", "b"})});
  std::vector<std::string> got;
  for (const Element& e : s.iterator()) got.push_back(e[0].strings().item());
  EXPECT_EQ(got, (std::vector<std::string>{"a", "b"}));
}

TEST(Dataset, MapFilterTakeSkipShardZip) {
  auto ds = Dataset::range(20).map([](const Element& e) { return plus(e, 100); });
  EXPECT_EQ(ints(ds.take(3)), (std::vector<int64_t>{100, 101, 102}));
  EXPECT_EQ(ints(ds.skip(17)), (std::vector<int64_t>{117, 118, 119}));
  EXPECT_EQ(ints(ds.skip(-1)), std::vector<int64_t>{});
  auto even = Dataset::range(10).filter([](const Element& e) { return e.tensor(0).item<int64_t>() % 2 == 0; });
  EXPECT_EQ(ints(even), iota(0, 10, 2));
  EXPECT_EQ(ints(Dataset::range(10).shard(3, 1)), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_KILN_ERROR(Dataset::range(10).shard(3, 3), kInvalidArgument, "index must be in [0, 3)");
  auto z = Dataset::zip({Dataset::range(5), Dataset::range(100, 103)});
  EXPECT_EQ(z.cardinality(), 3);
  EXPECT_EQ(ints(z, 0), iota(0, 3));
  EXPECT_EQ(ints(z, 1), iota(100, 103));
}

TEST(Dataset, RepeatReshufflesEachPassDeterministically) {
  auto ds = Dataset::range(50).shuffle(50, 7);
  std::vector<int64_t> a = ints(ds), b = ints(ds);
  EXPECT_NE(a, b) << "reshuffle_each_iteration: passes differ";
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(0, 50));
  EXPECT_NE(a, iota(0, 50));
  // Same seed, new dataset: the same sequence of orders.
  auto ds2 = Dataset::range(50).shuffle(50, 7);
  EXPECT_EQ(ints(ds2), a);
  EXPECT_EQ(ints(ds2), b);
  // Without reshuffle every pass is the same.
  auto fixed = Dataset::range(50).shuffle(50, 7, false);
  EXPECT_EQ(ints(fixed), ints(fixed));
  // repeat() re-iterates the input, so each epoch gets a new order.
  auto rep = ints(Dataset::range(10).shuffle(10, 3).repeat(3));
  ASSERT_EQ(rep.size(), 30u);
  std::vector<int64_t> e0(rep.begin(), rep.begin() + 10), e1(rep.begin() + 10, rep.begin() + 20);
  EXPECT_NE(e0, e1);
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e1, iota(0, 10));
}

TEST(Dataset, NumberedPassesAreReproducible) {
  auto ds = Dataset::range(40).shuffle(40, 3);
  auto p0 = ints(ds), p1 = ints(ds);  // counted passes 0 and 1
  // iterator(pass) gives pass `pass` whatever ran before, on any Dataset object.
  auto fresh = Dataset::range(40).shuffle(40, 3);
  auto order = [](const Dataset& d, uint64_t pass) {
    std::vector<int64_t> v;
    for (const Element& e : d.iterator(pass)) v.push_back(e.tensor(0).item<int64_t>());
    return v;
  };
  EXPECT_EQ(order(fresh, 1), p1);
  EXPECT_EQ(order(fresh, 0), p0);
  EXPECT_EQ(order(fresh, 1), p1);
  // Repetitions inside a numbered pass still differ from one another, deterministically.
  auto rep = Dataset::range(10).shuffle(10, 3).repeat(2);
  auto a = order(rep, 5), b = order(rep, 5);
  EXPECT_EQ(a, b);
  EXPECT_NE(std::vector<int64_t>(a.begin(), a.begin() + 10), std::vector<int64_t>(a.begin() + 10, a.end()));
  // with_options keeps the pass.
  EXPECT_EQ(order(fresh.with_options({.cpu_budget = 1}), 1), p1);
}

TEST(Dataset, ShuffleSmallBufferIsLocal) {
  // With buffer 1 nothing moves; with buffer 2 an element moves at most... forward by
  // any amount but backward by at most 1.
  EXPECT_EQ(ints(Dataset::range(20).shuffle(1, 5)), iota(0, 20));
  auto v = ints(Dataset::range(200).shuffle(2, 5));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_LE(v[i], static_cast<int64_t>(i) + 1);
}

TEST(Dataset, BatchStacksAndChecksShapes) {
  Tensor x = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2});
  auto ds = Dataset::from_tensor_slices({x}).batch(2);
  std::vector<Shape> shapes;
  std::vector<float> all;
  for (const Element& e : ds.iterator()) {
    shapes.push_back(e.tensor(0).shape());
    for (float f : e.tensor(0).to_vector<float>()) all.push_back(f);
  }
  EXPECT_EQ(shapes, (std::vector<Shape>{{2, 2}, {2, 2}, {1, 2}}));
  EXPECT_EQ(all, x.to_vector<float>());
  EXPECT_EQ(ds.element_spec().str(), "(f32[-1, 2])");
  EXPECT_EQ(Dataset::from_tensor_slices({x}).batch(2, true).element_spec().str(), "(f32[2, 2])");
  EXPECT_EQ(ints(Dataset::from_tensor_slices({x}).batch(2, true).map([](const Element& e) {
              return Element{Value(Tensor::scalar<int64_t>(e.tensor(0).dim(0)))};
            })),
            (std::vector<int64_t>{2, 2}));
  // Ragged elements: batch names the component and points to padded_batch.
  auto ragged = Dataset::range(1, 4).map([](const Element& e) {
    return Element{Value(Tensor::zeros({e.tensor(0).item<int64_t>()}))};
  });
  auto it = ragged.batch(3).iterator();
  EXPECT_KILN_ERROR(it.next(), kInvalidArgument, "f32[1] and f32[2] (use padded_batch)");
  EXPECT_FALSE(it.next().has_value()) << "an iterator is finished after an error";
}

TEST(Dataset, PaddedBatchAndUnbatch) {
  // Element i: i64 vector [1..i] and a string.
  auto ds = Dataset::range(1, 5).map([](const Element& e) {
    int64_t n = e.tensor(0).item<int64_t>();
    std::vector<int64_t> v;
    for (int64_t i = 1; i <= n; ++i) v.push_back(i);
    return Element{Value(Tensor::from_vector<int64_t>(v, {n})), Value(StringTensor::vector({std::to_string(n)}))};
  });
  auto it = ds.padded_batch(3, {}, {-1}).iterator();
  auto b0 = it.next();
  ASSERT_TRUE(b0);
  EXPECT_EQ(b0->tensor(0).shape(), Shape({3, 3}));
  EXPECT_EQ(b0->tensor(0).to_vector<int64_t>(), (std::vector<int64_t>{1, -1, -1, 1, 2, -1, 1, 2, 3}));
  EXPECT_EQ((*b0)[1].strings().values, (std::vector<std::string>{"1", "2", "3"}));
  auto b1 = it.next();
  ASSERT_TRUE(b1);
  EXPECT_EQ(b1->tensor(0).shape(), Shape({1, 4}));
  EXPECT_FALSE(it.next());
  // Fixed padded shape.
  auto fixed = ds.padded_batch(2, {{6}, {}}).iterator().next();
  EXPECT_EQ(fixed->tensor(0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0}));
  auto too_small = ds.padded_batch(4, {{2}, {}}).iterator();
  EXPECT_KILN_ERROR(too_small.next(), kInvalidArgument, "longer than its padded size 2");
  // 2-D padding puts each element in the leading corner.
  auto mats = Dataset::range(1, 3).map([](const Element& e) {
    int64_t n = e.tensor(0).item<int64_t>();
    return Element{Value(Tensor::from_vector<float>(std::vector<float>(static_cast<size_t>(n * n), float(n)), {n, n}))};
  });
  auto m = mats.padded_batch(2).iterator().next();
  EXPECT_EQ(m->tensor(0).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 2, 2, 2, 2}));
  // unbatch inverts batch.
  EXPECT_EQ(ints(Dataset::range(7).batch(3).unbatch()), iota(0, 7));
  EXPECT_EQ(Dataset::range(7).batch(3).unbatch().element_spec().str(), "(i64[])");
}

TEST(Dataset, ParallelMapKeepsOrderAndRunsConcurrently) {
  std::atomic<int> running{0}, peak{0};
  auto slow = [&](const Element& e) {
    int now = ++running;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(e.tensor(0).item<int64_t>() % 3 == 0 ? 6 : 1));
    --running;
    return plus(e, 0);
  };
  auto ds = Dataset::range(60).map(slow, {.num_parallel_calls = 4});
  EXPECT_EQ(ints(ds), iota(0, 60));
  EXPECT_GE(peak.load(), 2) << "calls overlapped";
  EXPECT_LE(peak.load(), 4) << "at most num_parallel_calls in flight";
  // Nondeterministic: same multiset.
  auto nd = ints(Dataset::range(60).map(slow, {.num_parallel_calls = 4, .deterministic = false}));
  std::sort(nd.begin(), nd.end());
  EXPECT_EQ(nd, iota(0, 60));
  // AUTOTUNE within a CPU budget of 3.
  peak = 0;
  auto at = Dataset::range(40).map(slow, {.num_parallel_calls = kAutotune}).with_options({.cpu_budget = 3});
  EXPECT_EQ(ints(at), iota(0, 40));
  EXPECT_LE(peak.load(), 3);
}

TEST(Dataset, MapErrorSurfacesWithIndexAndCause) {
  for (int64_t parallel : {int64_t{0}, int64_t{3}}) {
    auto ds = Dataset::range(10).map(
        [](const Element& e) {
          if (e.tensor(0).item<int64_t>() == 6) throw DataLossError("bad pixel");
          return e;
        },
        {.num_parallel_calls = parallel});
    auto it = ds.iterator();
    std::vector<int64_t> got;
    try {
      while (auto e = it.next()) got.push_back(e->tensor(0).item<int64_t>());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
      EXPECT_NE(std::string(e.what()).find("map: element 6: bad pixel"), std::string::npos) << e.what();
    }
    EXPECT_EQ(got, iota(0, 6)) << "parallel=" << parallel << ": everything before the failing element arrives";
    EXPECT_FALSE(it.next());
  }
  // A plain std::exception keeps its message.
  auto std_err = Dataset::range(3).map([](const Element&) -> Element { throw std::runtime_error("boom"); });
  EXPECT_KILN_ERROR(std_err.iterator().next(), kInvalidArgument, "map: element 0: boom");
  // output_spec is checked.
  auto wrong = Dataset::range(3).map([](const Element& e) { return e; },
                                     {.output_spec = ElementSpec{{}, {TypeSpec::tensor(DType::kF32)}}});
  EXPECT_KILN_ERROR(wrong.iterator().next(), kInvalidArgument, "does not match output_spec (f32[])");
}

TEST(Dataset, PrefetchRunsAheadAndStopsOnDestruction) {
  std::atomic<int> produced{0};
  auto ds = Dataset::range(1000).map([&](const Element& e) {
    ++produced;
    return e;
  });
  {
    auto it = ds.prefetch(8).iterator();
    ASSERT_TRUE(it.next());
    for (int i = 0; i < 5000 && produced.load() < 9; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(produced.load(), 9) << "1 consumed + 8 buffered, no more";
  }  // destroying the iterator joins the thread
  int after = produced.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(produced.load(), after);
  EXPECT_EQ(ints(Dataset::range(100).prefetch(kAutotune)), iota(0, 100));
  EXPECT_EQ(ints(Dataset::range(100).prefetch(0)), iota(0, 100));
  // Errors cross the thread.
  auto bad = Dataset::range(5).map([](const Element& e) -> Element {
                                 if (e.tensor(0).item<int64_t>() == 3) throw NotFoundError("gone");
                                 return e;
                               }).prefetch(2);
  auto it = bad.iterator();
  int n = 0;
  EXPECT_KILN_ERROR(([&] { while (it.next()) ++n; })(), kNotFound, "map: element 3: gone");
  EXPECT_EQ(n, 3);
}

TEST(Dataset, AutotunedPrefetchGrowsWhenConsumerWaits) {
  // A slow producer and a fast consumer: the buffer has to grow past 1 so that the
  // consumer waits less; just check it completes in order and respects a tiny budget.
  auto ds = Dataset::range(50)
                .map([](const Element& e) {
                  std::this_thread::sleep_for(std::chrono::microseconds(200));
                  return Element{Value(Tensor::zeros({256}))};  // 1 KiB
                })
                .prefetch(kAutotune)
                .with_options({.cpu_budget = 2, .ram_budget_bytes = 4096});
  int n = 0;
  for (const Element& e : ds.iterator()) n += e.tensor(0).numel() == 256;
  EXPECT_EQ(n, 50);
}

TEST(Dataset, CancelWakesABlockedConsumer) {
  std::atomic<bool> release{false};
  auto ds = Dataset::from_generator({}, [&] {
              return PullFn([&](Element* out) {
                while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                *out = Element{Value(Tensor::scalar<int64_t>(1))};
                return true;
              });
            }).prefetch(1);
  auto it = ds.iterator();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    it.cancel();
    release = true;
  });
  EXPECT_FALSE(it.next()) << "a cancelled iterator ends";
  t.join();
  EXPECT_TRUE(it.cancelled());
}

TEST(Dataset, IteratorIsSafeToShareBetweenThreads) {
  auto it = Dataset::range(4000).map([](const Element& e) { return e; }, {.num_parallel_calls = 2}).prefetch(4).iterator();
  std::mutex mu;
  std::vector<int64_t> all;
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&] {
      while (auto e = it.next()) {
        std::lock_guard<std::mutex> lk(mu);
        all.push_back(e->tensor(0).item<int64_t>());
      }
    });
  for (auto& t : ts) t.join();
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, iota(0, 4000));
}

TEST(Dataset, InterleaveOrders) {
  // Input i -> [10i, 10i+1, 10i+2] (i=2 has 4 elements). Expected orders follow
  // tf.data (interleave_dataset_op.cc): an exhausted slot moves the cycle on.
  auto fn = [](const Element& e) {
    int64_t i = e.tensor(0).item<int64_t>();
    return Dataset::range(10 * i, 10 * i + (i == 2 ? 4 : 3));
  };
  EXPECT_EQ(ints(Dataset::range(3).interleave(fn, {.cycle_length = 2, .block_length = 1})),
            (std::vector<int64_t>{0, 10, 1, 11, 2, 12, 20, 21, 22, 23}));
  EXPECT_EQ(ints(Dataset::range(3).interleave(fn, {.cycle_length = 2, .block_length = 2})),
            (std::vector<int64_t>{0, 1, 10, 11, 2, 12, 20, 21, 22, 23}));
  EXPECT_EQ(ints(Dataset::range(3).interleave(fn, {.cycle_length = 1})), (std::vector<int64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22, 23}));
  // Parallel, deterministic: same order as sequential.
  EXPECT_EQ(ints(Dataset::range(3).interleave(fn, {.cycle_length = 2, .block_length = 2, .num_parallel_calls = 2})),
            (std::vector<int64_t>{0, 1, 10, 11, 2, 12, 20, 21, 22, 23}));
  auto nd = ints(Dataset::range(3).interleave(
      fn, {.cycle_length = 3, .block_length = 1, .num_parallel_calls = kAutotune, .deterministic = false}));
  std::sort(nd.begin(), nd.end());
  EXPECT_EQ(nd, (std::vector<int64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22, 23}));
  auto bad = Dataset::range(3).interleave([](const Element& e) -> Dataset {
    if (e.tensor(0).item<int64_t>() == 1) throw NotFoundError("no file");
    return Dataset::range(2);
  });
  EXPECT_KILN_ERROR(ints(bad), kNotFound, "interleave: input element 1: no file");
}

TEST(Dataset, CacheInMemoryReadsInputOnce) {
  std::atomic<int> calls{0};
  auto ds = Dataset::range(10)
                .map([&](const Element& e) {
                  ++calls;
                  return e;
                })
                .cache();
  EXPECT_EQ(ints(ds), iota(0, 10));
  EXPECT_EQ(ints(ds), iota(0, 10));
  EXPECT_EQ(calls.load(), 10);
  // A pass that stops early caches nothing.
  std::atomic<int> calls2{0};
  auto ds2 = Dataset::range(10).map([&](const Element& e) { ++calls2; return e; }).cache();
  EXPECT_EQ(ints(ds2.take(3)), iota(0, 3));
  EXPECT_EQ(ints(ds2), iota(0, 10));
  EXPECT_EQ(ints(ds2), iota(0, 10));
  EXPECT_EQ(calls2.load(), 13);
}

TEST(Dataset, CacheToFileIsReusedByALaterRun) {
  TempDir dir("cache");
  std::string base = dir.file("train");
  std::atomic<int> calls{0};
  auto make = [&] {
    return Dataset::range(6)
        .map([&](const Element& e) {
          ++calls;
          int64_t i = e.tensor(0).item<int64_t>();
          return Element({"x", "s"}, {Value(Tensor::from_vector<float>({float(i), float(-i)}, {2})),
                                      Value(StringTensor::vector({"r" + std::to_string(i)}))});
        })
        .cache(base);
  };
  auto collect = [](const Dataset& ds) {
    std::vector<std::string> v;
    for (const Element& e : ds.iterator()) {
      auto x = e.tensor("x").to_vector<float>();
      v.push_back(std::to_string(x[0]) + "/" + std::to_string(x[1]) + "/" + e["s"].strings().item());
    }
    return v;
  };
  auto first = collect(make());
  EXPECT_EQ(calls.load(), 6);
  EXPECT_EQ(first.size(), 6u);
  // "A later run": a new Dataset object over the same file does not call the input.
  auto second = collect(make());
  EXPECT_EQ(calls.load(), 6);
  EXPECT_EQ(second, first);
  // Corruption is detected and named.
  std::string bytes = read_file(base + ".kcache");
  bytes[bytes.size() - 3] ^= 0x40;
  kiln::testing::write_bytes(base + ".kcache", bytes);
  EXPECT_KILN_ERROR(collect(make()), kDataLoss, "train.kcache is corrupt");
  bytes[bytes.size() - 3] ^= 0x40;  // repaired
  kiln::testing::write_bytes(base + ".kcache", bytes.substr(0, bytes.size() - 5));
  EXPECT_KILN_ERROR(collect(make()), kDataLoss, "past the end of the file at byte");  // the last element
  std::string huge = bytes;
  size_t first_element = 8 + 4 + (4 + 1) + (4 + 1);  // magic, name count, names "x" and "s"
  huge[first_element + 3] = '\x7f';                    // the element length's top byte
  kiln::testing::write_bytes(base + ".kcache", huge);
  EXPECT_KILN_ERROR(collect(make()), kDataLoss, "past the end of the file");
  kiln::testing::write_bytes(base + ".kcache", "garbage");
  EXPECT_KILN_ERROR(collect(make()), kDataLoss, "bad magic");
  kiln::testing::write_bytes(base + ".kcache", bytes);
  EXPECT_EQ(collect(make()), first) << "the repaired file reads again";
  // An interrupted first pass leaves no cache file behind.
  std::string other = dir.file("partial");
  auto partial = Dataset::range(10).cache(other);
  EXPECT_EQ(ints(partial.take(4)), iota(0, 4));
  EXPECT_NE(::access((other + ".kcache").c_str(), F_OK), 0);
}

TEST(Dataset, ListFilesAndGeneratorSpecCheck) {
  TempDir dir("files");
  for (const char* n : {"b.txt", "a.txt", "c.bin"}) kiln::testing::write_bytes(dir.file(n), "x");
  std::vector<std::string> names;
  for (const Element& e : Dataset::list_files({dir.file("*.txt")}).iterator()) names.push_back(e[0].strings().item());
  EXPECT_EQ(names, (std::vector<std::string>{dir.file("a.txt"), dir.file("b.txt")}));
  EXPECT_KILN_ERROR(Dataset::list_files({dir.file("*.png")}), kNotFound, "no file matches");
  auto shuffled = Dataset::list_files({dir.file("*")}, true, 11);
  EXPECT_EQ(shuffled.cardinality(), 3);
  auto gen = Dataset::from_generator(ElementSpec{{}, {TypeSpec::tensor(DType::kF32, {2})}}, [] {
    auto n = std::make_shared<int>(0);
    return PullFn([n](Element* out) {
      if (*n == 2) return false;
      *out = Element{Value(Tensor::zeros({*n == 0 ? 2 : 3}))};
      ++*n;
      return true;
    });
  });
  auto it = gen.iterator();
  EXPECT_TRUE(it.next());
  EXPECT_KILN_ERROR(it.next(), kInvalidArgument, "element 1 is (f32[3]), which does not match the declared spec");
}

TEST(Dataset, DescribeShowsThePipeline) {
  auto ds = Dataset::range(100).shuffle(10, 1).batch(8, true).prefetch(kAutotune);
  std::string d = ds.describe();
  EXPECT_NE(d.find("Range"), std::string::npos) << d;
  EXPECT_NE(d.find("Batch(batch_size=8, drop_remainder=true)  -> (i64[8])  [12]"), std::string::npos) << d;
  EXPECT_NE(d.find("Prefetch(buffer_size=AUTOTUNE)"), std::string::npos) << d;
  EXPECT_LT(d.find("Range"), d.find("Prefetch"));
}

}  // namespace
}  // namespace kiln::data
