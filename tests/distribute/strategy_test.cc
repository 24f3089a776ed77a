// MirroredStrategy on logical CPU devices: replica threads, the in-process all-reduce
// (values, order, errors), batch splitting, mirrored variables.
#include <algorithm>
#include <stdexcept>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/device_config.h"
#include "kiln/distribute/strategy.h"
#include "kiln/ops.h"
#include "gpus.h"
#include "test_util.h"

// `stmt` throws `type` with a message containing `substr`.
#define EXPECT_THROW_MSG(stmt, type, substr)                                                   \
  do {                                                                                         \
    try {                                                                                      \
      stmt;                                                                                    \
      ADD_FAILURE() << "expected " #type " from: " #stmt;                                      \
    } catch (const type& e) {                                                                  \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what();            \
    }                                                                                          \
  } while (0)

namespace kiln::distribute {
namespace {

// Four logical CPU devices for every test of this binary (before any tensor exists).
class LogicalCpus : public ::testing::Environment {
 public:
  void SetUp() override { config::set_logical_device_configuration(Device::cpu(), std::vector<config::LogicalDeviceConfig>(4)); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new LogicalCpus);

Device cpu(int i) { return {DeviceType::kCPU, i}; }

TEST(MirroredStrategy, CreateValidatesDevices) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  EXPECT_EQ(s->num_replicas_in_sync(), 3);
  EXPECT_EQ(s->devices()[2], cpu(2));
  EXPECT_EQ(s->name(), "mirrored");
  EXPECT_EQ(MirroredStrategy::create()->num_replicas_in_sync(), 1);
  EXPECT_THROW_MSG(MirroredStrategy::create("cpu:0,cpu:0"), InvalidArgumentError, "cpu:0 is listed twice");
  EXPECT_THROW(MirroredStrategy::create("cpu:0,cpu:9"), NotFoundError);
  EXPECT_THROW_MSG(MirroredStrategy::create("cpu:0,cuda:0"), InvalidArgumentError, "one kind of device");
  EXPECT_THROW(MirroredStrategy::create("cpu:0,,cpu:1"), InvalidArgumentError);
  EXPECT_THROW(MirroredStrategy::create("gpu:x"), InvalidArgumentError);
}

TEST(MirroredStrategy, RunsEveryReplicaOnItsOwnThread) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2,cpu:3");
  std::vector<int> seen(4, -1);
  std::vector<Device> devices(4);
  s->run([&](ReplicaContext& ctx) {
    seen[static_cast<size_t>(ctx.replica_id())] = ReplicaScope::current();
    devices[static_cast<size_t>(ctx.replica_id())] = ctx.device();
    EXPECT_EQ(ctx.num_replicas(), 4);
    ctx.barrier();  // deadlocks unless all four run at once
  });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(devices[3], cpu(3));
}

TEST(MirroredStrategy, AllReduceAddsWeightedInReplicaOrder) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  const std::vector<double> w = {0.5, 0.25, 2.0};
  std::vector<std::vector<Tensor>> out(3);
  s->run([&](ReplicaContext& ctx) {
    const int r = ctx.replica_id();
    std::vector<Tensor> ts = {
        Tensor::from_vector<float>({1.0f * (r + 1), 1e8f, -3.0f * r, 0.1f}, {4}).to(ctx.device()),
        Tensor::from_vector<double>({r == 1 ? 1e-3 : 7.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}).to(ctx.device())};
    ctx.all_reduce(ts, ReduceOp::kSum, w[static_cast<size_t>(r)]);
    out[static_cast<size_t>(r)] = ts;
  });
  // The reference: the same float operations, replica 0 first.
  std::vector<float> want(4);
  for (int i = 0; i < 4; ++i) {
    float acc = 0;
    for (int r = 0; r < 3; ++r) {
      const float v[4] = {1.0f * (r + 1), 1e8f, -3.0f * r, 0.1f};
      acc = r == 0 ? static_cast<float>(w[0]) * v[i] : acc + static_cast<float>(w[static_cast<size_t>(r)]) * v[i];
    }
    want[static_cast<size_t>(i)] = acc;
  }
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    const auto& ts = out[static_cast<size_t>(r)];
    EXPECT_EQ(ts[0].device(), cpu(r));
    EXPECT_EQ(ts[0].to_vector<float>(), want);
    EXPECT_EQ(ts[1].shape(), Shape({2, 3}));
    EXPECT_DOUBLE_EQ(ts[1].to_vector<double>()[0], 0.5 * 7.0 + 0.25 * 1e-3 + 2.0 * 7.0);
    EXPECT_DOUBLE_EQ(ts[1].to_vector<double>()[5], 0.5 * 6 + 0.25 * 6 + 2.0 * 6);
    EXPECT_TRUE(array_equal(ts[0].to(Device::cpu()), out[0][0].to(Device::cpu())));  // bit-identical everywhere
  }
  // kMean divides by the replicas.
  std::vector<double> means(3);
  s->run([&](ReplicaContext& ctx) {
    std::vector<Tensor> ts = {Tensor::scalar<double>(3.0 * ctx.replica_id()).to(ctx.device())};
    ctx.all_reduce(ts, ReduceOp::kMean);
    means[static_cast<size_t>(ctx.replica_id())] = ts[0].item<double>();
  });
  EXPECT_EQ(means, (std::vector<double>{3.0, 3.0, 3.0}));
}

TEST(MirroredStrategy, MismatchedAllReduceIsAnErrorInEveryReplica) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  auto run_with = [&](auto make) {
    s->run([&](ReplicaContext& ctx) {
      std::vector<Tensor> ts = make(ctx.replica_id());
      ctx.all_reduce(ts);
    });
  };
  EXPECT_THROW_MSG(run_with([](int r) { return std::vector<Tensor>{Tensor::zeros({r == 0 ? 2 : 3})}; }),
                   InvalidArgumentError, "replica 1's tensor 0 is f32[3]");
  EXPECT_THROW_MSG(run_with([](int r) { return std::vector<Tensor>(static_cast<size_t>(r + 1), Tensor::zeros({2})); }),
                   InvalidArgumentError, "replica 1 gave 2 tensors, replica 0 gave 1");
  EXPECT_THROW_MSG(run_with([](int) { return std::vector<Tensor>{Tensor::zeros({2}, DType::kI32)}; }),
                   InvalidArgumentError, "takes f32 and f64");
  // The strategy is usable afterwards.
  double sum = 0;
  s->run([&](ReplicaContext& ctx) {
    std::vector<Tensor> ts = {Tensor::scalar<float>(1.0f)};
    ctx.all_reduce(ts);
    if (ctx.replica_id() == 0) sum = ts[0].item<double>();
  });
  EXPECT_EQ(sum, 2.0);
}

TEST(MirroredStrategy, AFailingReplicaReleasesTheOthers) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  // Replica 2 throws before the collective the others wait in: they are cancelled, and
  // run() rethrows replica 2's own error.
  EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id() == 2) throw std::runtime_error("replica two broke");
    std::vector<Tensor> ts = {Tensor::zeros({4})};
    ctx.all_reduce(ts);
    ADD_FAILURE() << "all_reduce returned without replica 2";
  }),
                   std::runtime_error, "replica two broke");
  // A typed kiln error keeps its type.
  EXPECT_THROW(s->run([&](ReplicaContext& ctx) {
    if (ctx.replica_id() == 0) throw NotFoundError("nothing here");
    ctx.barrier();
  }),
               NotFoundError);
  int ok = 0;
  s->run([&](ReplicaContext& ctx) {
    ctx.barrier();
    if (ctx.replica_id() == 0) ok = 1;
  });
  EXPECT_EQ(ok, 1);
}

// Seven tensors (f32 and f64, 4 to 8000 bytes) given in a different order on each
// replica: the buckets are the same everywhere and the sums are one all-reduce's, bit
// for bit, with and without overlap.
TEST(MirroredStrategy, PendingAllReduceIsOneAllReduceInBuckets) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  const std::vector<int64_t> sizes = {3, 1000, 1, 17, 250, 2, 64};
  auto tensors = [&](int r) {
    std::vector<Tensor> ts;
    for (size_t i = 0; i < sizes.size(); ++i)
      ts.push_back(kiln::testing::rand_tensor({sizes[i]}, i % 3 == 1 ? DType::kF64 : DType::kF32, -1e3, 1e3,
                                              static_cast<uint64_t>(100 * r + i))
                       .to(cpu(r)));
    return ts;
  };
  const std::vector<double> w = {0.25, 0.5, 0.25};
  std::vector<std::vector<Tensor>> want(3);
  s->run([&](ReplicaContext& ctx) {
    std::vector<Tensor> ts = tensors(ctx.replica_id());
    ctx.all_reduce(ts, ReduceOp::kSum, w[static_cast<size_t>(ctx.replica_id())]);
    want[static_cast<size_t>(ctx.replica_id())] = ts;
  });
  // bytes_per_pack 0: one bucket; 4: every tensor its own; 2000: the tensors of sizes
  // [3, 1000] [1, 17, 250] (4 + 68 + 2000 bytes) [2, 64].
  for (const auto overlap : {CommunicationOptions::Overlap::kOn, CommunicationOptions::Overlap::kOff})
    for (const auto& [pack, buckets] : std::vector<std::pair<int64_t, size_t>>{{0, 1}, {4, 7}, {2000, 3}}) {
      SCOPED_TRACE(::testing::Message() << "overlap " << (overlap == CommunicationOptions::Overlap::kOn)
                                        << ", bytes_per_pack " << pack);
      s->set_communication_options({pack, overlap});
      std::vector<std::vector<Tensor>> got(3);
      std::vector<size_t> made(3);
      s->run([&](ReplicaContext& ctx) {
        const int r = ctx.replica_id();
        std::vector<Tensor> ts = tensors(r);
        PendingAllReduce p = ctx.start_all_reduce(ts.size(), ReduceOp::kSum, w[static_cast<size_t>(r)]);
        // Replica 0 in order, 1 backwards, 2 odd indexes first.
        std::vector<size_t> order(ts.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = r == 1 ? order.size() - 1 - i : i;
        if (r == 2) std::stable_partition(order.begin(), order.end(), [](size_t i) { return i % 2 == 1; });
        for (size_t i : order) p.give(i, ts[i]);
        got[static_cast<size_t>(r)] = p.wait();
        made[static_cast<size_t>(r)] = p.num_buckets();
      });
      for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(made[static_cast<size_t>(r)], buckets);
        ASSERT_EQ(got[static_cast<size_t>(r)].size(), sizes.size());
        for (size_t i = 0; i < sizes.size(); ++i) {
          const Tensor& g = got[static_cast<size_t>(r)][i];
          EXPECT_EQ(g.device(), cpu(r));
          EXPECT_TRUE(array_equal(g.to(Device::cpu()), want[0][i].to(Device::cpu()))) << "replica " << r << ", tensor " << i;
        }
      }
    }
  s->set_communication_options({});
}

TEST(MirroredStrategy, PendingAllReduceErrors) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  for (const auto overlap : {CommunicationOptions::Overlap::kOn, CommunicationOptions::Overlap::kOff}) {
    SCOPED_TRACE(overlap == CommunicationOptions::Overlap::kOn);
    s->set_communication_options({4, overlap});
    // Misuse in one replica is an error there; the other's buckets are cancelled.
    EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(2);
      p.give(0, Tensor::zeros({2}));
      if (ctx.replica_id() == 1) p.give(0, Tensor::zeros({2}));
      p.give(1, Tensor::zeros({2}));
      p.wait();
    }),
                     InvalidArgumentError, "tensor 0 given twice");
    EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(2);
      p.give(ctx.replica_id() == 0 ? 5 : 0, Tensor::zeros({2}));
    }),
                     InvalidArgumentError, "tensor 5 of 2");
    EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(3);
      p.give(0, Tensor::zeros({2}));
      if (ctx.replica_id() == 0) p.give(1, Tensor::zeros({2}));
      p.give(2, Tensor::zeros({2}));
      p.wait();
    }),
                     InvalidArgumentError, "tensor 1 of 3 was not given");
    // A replica that throws between its buckets releases the other, which waits in its second.
    EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(3);
      p.give(0, Tensor::zeros({2}));
      if (ctx.replica_id() == 1) throw NotFoundError("replica one lost its gradients");
      p.give(1, Tensor::zeros({2}));
      p.give(2, Tensor::zeros({2}));
      p.wait();
    }),
                     NotFoundError, "lost its gradients");
    // Mismatched shapes: the collective's own error, in every replica.
    EXPECT_THROW_MSG(s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(1);
      p.give(0, Tensor::zeros({ctx.replica_id() + 1}));
      p.wait();
    }),
                     InvalidArgumentError, "replica 1's tensor 0 is f32[2]");
    // Usable afterwards.
    std::vector<double> sums(2);
    s->run([&](ReplicaContext& ctx) {
      PendingAllReduce p = ctx.start_all_reduce(2);
      p.give(1, Tensor::scalar<float>(2.0f));
      p.give(0, Tensor::scalar<float>(1.0f));
      std::vector<Tensor> out = p.wait();
      sums[static_cast<size_t>(ctx.replica_id())] = out[0].item<double>() + 10 * out[1].item<double>();
      EXPECT_THROW(p.wait(), FailedPreconditionError);
    });
    EXPECT_EQ(sums, (std::vector<double>{42.0, 42.0}));
  }
  s->set_communication_options({});
}

TEST(MirroredStrategy, SplitsBatchesByRows) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  EXPECT_EQ(s->shard_rows(7), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(s->shard_rows(1), (std::vector<int64_t>{1, 0, 0}));
  Tensor x = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {7, 2});
  Tensor y = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 6}, {7});
  auto shards = s->split_batch({x, y});
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0][0].to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(shards[1][0].to_vector<float>(), (std::vector<float>{6, 7, 8, 9}));
  EXPECT_EQ(shards[2][1].to_vector<int32_t>(), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(shards[2][0].device(), cpu(2));
  auto tiny = s->split_batch({Tensor::zeros({1, 2})});
  EXPECT_EQ(tiny[1][0].shape(), Shape({0, 2}));
  EXPECT_THROW_MSG(s->split_batch({x, Tensor::zeros({6})}), InvalidArgumentError, "same rows");
  EXPECT_THROW(s->split_batch({}), InvalidArgumentError);
}

TEST(MirroredStrategy, ReduceOnTheHost) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  Tensor a = Tensor::from_vector<float>({1, 2}, {2}), b = Tensor::from_vector<float>({3, 5}, {2}).to(cpu(1));
  EXPECT_EQ(s->reduce(ReduceOp::kSum, {a, b}).to_vector<float>(), (std::vector<float>{4, 7}));
  EXPECT_EQ(s->reduce(ReduceOp::kMean, {a, b}).to_vector<float>(), (std::vector<float>{2, 3.5}));
  EXPECT_THROW(s->reduce(ReduceOp::kSum, {a}), InvalidArgumentError);
  EXPECT_THROW(s->reduce(ReduceOp::kSum, {a, Tensor::zeros({3})}), InvalidArgumentError);
}

TEST(MirroredStrategy, MirroredVariablesResolvePerReplica) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  Variable v(Tensor::from_vector<float>({1, 2}, {2}), "v");
  s->mirror({v});
  EXPECT_EQ(v.num_replicas(), 2);
  EXPECT_EQ(v.replica_value(1).device(), cpu(1));
  EXPECT_FALSE(v.replica_value(0).is_same(v.replica_value(1)));
  s->run([&](ReplicaContext& ctx) {
    const float r = static_cast<float>(ctx.replica_id());
    EXPECT_EQ(v.peek().device(), ctx.device());
    v.assign(Tensor::from_vector<float>({10 + r, 20 + r}, {2}).to(ctx.device()));
  });
  EXPECT_EQ(v.peek().to_vector<float>(), (std::vector<float>{10, 20}));  // copy 0 outside a replica
  EXPECT_EQ(v.replica_value(1).to_vector<float>(), (std::vector<float>{11, 21}));
  {
    ReplicaScope r1(1);
    EXPECT_EQ(v.value().to_vector<float>(), (std::vector<float>{11, 21}));
    ReplicaScope r3(3);
    EXPECT_THROW_MSG(v.peek(), FailedPreconditionError, "replica 3 has none");
  }
  EXPECT_THROW(v.assign_replica(1, Tensor::zeros({3})), InvalidArgumentError);
  EXPECT_THROW(v.replica_value(2), OutOfRangeError);
  s->mirror({v});  // again: every copy from copy 0
  EXPECT_EQ(v.replica_value(1).to_vector<float>(), (std::vector<float>{10, 20}));
  v.mirror({});
  EXPECT_EQ(v.num_replicas(), 1);
  // An unmirrored variable is the same for every replica.
  Variable u(Tensor::scalar<float>(5), "u");
  ReplicaScope r1(1);
  EXPECT_EQ(u.peek().item<float>(), 5.0f);
}

// ops::cross_replica_sum inside run(): the sum over the replicas, forward, and the sum of
// the replicas' upstream gradients, backward (each replica's objective depends on every
// replica's input).
TEST(MirroredStrategy, CrossReplicaSumInsideRun) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  Variable w(Tensor::from_vector<float>({1, 2}, {2}), "w");
  s->mirror({w});
  std::vector<std::vector<float>> ys(2), gs(2);
  s->run([&](ReplicaContext& ctx) {
    const float c = static_cast<float>(ctx.replica_id() + 1);  // replica r holds (r + 1) w
    GradientTape tape;
    const Tensor y = ops::cross_replica_sum(ops::mul(w.value(), ops::scalar(c, DType::kF32)));
    const Tensor loss = ops::sum(ops::mul(y, ops::scalar(10 * c, DType::kF32)));  // upstream 10 (r + 1)
    ys[static_cast<size_t>(ctx.replica_id())] = y.to_vector<float>();
    gs[static_cast<size_t>(ctx.replica_id())] = tape.gradient(loss, {w})[0].to_vector<float>();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ys[static_cast<size_t>(r)], (std::vector<float>{3, 6}));  // w + 2 w
    const float g = (10 + 20) * static_cast<float>(r + 1);            // (sum of upstreams) x (r + 1)
    EXPECT_EQ(gs[static_cast<size_t>(r)], (std::vector<float>{g, g}));
  }
}

// GPU replicas sum over NCCL: weighted, every replica the same result (up to 2 GPUs;
// skipped without one).
TEST(MirroredStrategy, GpuReplicasAllReduceOverNccl) {
  std::string why;
  const std::vector<Device> gpus = kiln::testing::gpus_for_test(2, &why);
  if (gpus.empty()) GTEST_SKIP() << why;
  const int n = static_cast<int>(gpus.size());
  auto s = MirroredStrategy::create(gpus);
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  s->run([&](ReplicaContext& ctx) {
    const float r = static_cast<float>(ctx.replica_id());
    std::vector<Tensor> t = {Tensor::from_vector<float>({1 + r, 10 * (1 + r)}, {2}).to(ctx.device())};
    ctx.all_reduce(t, ReduceOp::kSum, 0.5 + r);  // sum of (0.5 + r) (1 + r) (1, 10)
    EXPECT_EQ(t[0].device(), ctx.device());
    got[static_cast<size_t>(ctx.replica_id())] = t[0].to(Device::cpu()).to_vector<float>();
  });
  float want = 0;
  for (int r = 0; r < n; ++r) want += (0.5f + static_cast<float>(r)) * (1.0f + static_cast<float>(r));
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], (std::vector<float>{want, 10 * want}));
}

TEST(StrategyScope, NestsAndRestores) {
  EXPECT_EQ(StrategyScope::current(), nullptr);
  StrategyPtr a = MirroredStrategy::create("cpu:0,cpu:1"), b = MirroredStrategy::create("cpu:2");
  {
    StrategyScope sa(a);
    EXPECT_EQ(StrategyScope::current(), a);
    {
      StrategyScope sb(b);
      EXPECT_EQ(StrategyScope::current(), b);
    }
    EXPECT_EQ(StrategyScope::current(), a);
  }
  EXPECT_EQ(StrategyScope::current(), nullptr);
}

}  // namespace
}  // namespace kiln::distribute
