// ClusterSpec from the launchers' environment variables; WorkerGroup (Gloo) over
// loopback, its workers threads of one process.
#include <thread>

#include "distribute/gloo_worker_group.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/strategy.h"
#include "loopback.h"
#include "scoped_env.h"
#include "test_util.h"

namespace kiln::distribute {
namespace {

using kiln::testing::free_port;
using kiln::testing::ScopedEnv;

// No launcher variables but the ones a test sets.
struct CleanEnv {
  ScopedEnv a{"TF_CONFIG", nullptr}, b{"KILN_WORKERS", nullptr}, c{"KILN_RANK", nullptr},
      d{"OMPI_COMM_WORLD_SIZE", nullptr}, e{"OMPI_COMM_WORLD_RANK", nullptr}, f{"KILN_COORDINATOR", nullptr},
      g{"PMIX_NAMESPACE", nullptr}, h{"KILN_WORKER_HOST", nullptr};
};

TEST(ClusterSpec, OneWorkerWithoutLauncher) {
  CleanEnv env;
  ClusterSpec c = ClusterSpec::from_environment();
  EXPECT_EQ(c.size, 1);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.source, "");
  EXPECT_TRUE(c.is_chief());
}

TEST(ClusterSpec, KilnWorkers) {
  CleanEnv env;
  ScopedEnv w("KILN_WORKERS", "10.0.0.1:2222,10.0.0.2:2222,[::1]:3333");
  ScopedEnv r("KILN_RANK", "2");
  ClusterSpec c = ClusterSpec::from_environment();
  EXPECT_EQ(c.size, 3);
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.coordinator, "10.0.0.1:2222");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.source, "KILN_WORKERS");
  ScopedEnv h("KILN_WORKER_HOST", "eth1.local");
  EXPECT_EQ(ClusterSpec::from_environment().host, "eth1.local");
}

TEST(ClusterSpec, TfConfig) {
  CleanEnv env;
  ScopedEnv t("TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})");
  ClusterSpec c = ClusterSpec::from_environment();
  EXPECT_EQ(c.size, 2);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.coordinator, "a:1");
  EXPECT_EQ(c.host, "b");
  EXPECT_EQ(c.source, "TF_CONFIG");
  // TensorFlow's separate chief task is worker 0.
  ScopedEnv t2("TF_CONFIG", R"({"cluster": {"chief": ["c:9"], "worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})");
  c = ClusterSpec::from_environment();
  EXPECT_EQ(c.size, 3);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.coordinator, "c:9");
}

TEST(ClusterSpec, Mpirun) {
  CleanEnv env;
  ScopedEnv s("OMPI_COMM_WORLD_SIZE", "4"), r("OMPI_COMM_WORLD_RANK", "3"), j("PMIX_NAMESPACE", "prterun-x/1");
  ClusterSpec c = ClusterSpec::from_environment();
  EXPECT_EQ(c.size, 4);
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.source, "mpirun");
  EXPECT_EQ(c.store_dir, "/tmp/kiln-rendezvous-prterun-x_1");
  ScopedEnv k("KILN_COORDINATOR", "head:7000");
  c = ClusterSpec::from_environment();
  EXPECT_EQ(c.coordinator, "head:7000");
  EXPECT_TRUE(c.store_dir.empty());
}

TEST(ClusterSpec, MalformedVariablesNameThemselves) {
  CleanEnv env;
  {
    ScopedEnv t("TF_CONFIG", "{not json");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "TF_CONFIG is not JSON");
  }
  {
    ScopedEnv t("TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 5}})");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "task index 5 but 1 workers");
  }
  {
    ScopedEnv t("TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"index": 0}})");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "TF_CONFIG: want");
  }
  {
    ScopedEnv w("KILN_WORKERS", "a:1,b:2");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "KILN_RANK is not");
    ScopedEnv r("KILN_RANK", "2");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "KILN_RANK='2'");
  }
  {
    ScopedEnv w("KILN_WORKERS", "a:1,b"), r("KILN_RANK", "0");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "'b' is not host:port");
  }
  {
    ScopedEnv w("KILN_WORKERS", "a:1,b:99999"), r("KILN_RANK", "0");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "no valid port");
  }
  {
    ScopedEnv s("OMPI_COMM_WORLD_SIZE", "2"), r("OMPI_COMM_WORLD_RANK", "1");
    EXPECT_KILN_ERROR(ClusterSpec::from_environment(), kInvalidArgument, "PMIX_NAMESPACE");
  }
}


// Worker `rank` of `size` meeting at `coordinator` on 127.0.0.1.
ClusterSpec loopback(int rank, int size, const std::string& coordinator) {
  ClusterSpec c;
  c.rank = rank;
  c.size = size;
  c.coordinator = coordinator;
  c.host = "127.0.0.1";
  return c;
}

// Workers as threads: each makes its own WorkerGroup over loopback.
TEST(WorkerGroup, CollectivesAcrossThreeWorkers) {
  const int port = free_port();
  const std::string coord = "127.0.0.1:" + std::to_string(port);
  std::vector<std::vector<float>> sums(3);
  std::vector<std::vector<std::string>> gathered(3);
  std::vector<double> bcast(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      GlooWorkerGroup g(loopback(r, 3, coord), std::chrono::seconds(20));
      std::vector<Tensor> t = {Tensor::from_vector<float>({1.0f * r, 2.0f}, {2}),
                               Tensor::from_vector<double>({r == 2 ? 7.0 : 0.0}, {1})};
      g.all_reduce_sum(t);
      sums[static_cast<size_t>(r)] = t[0].to_vector<float>();
      sums[static_cast<size_t>(r)].push_back(static_cast<float>(t[1].item<double>()));
      std::vector<Tensor> b = {Tensor::scalar<double>(r == 1 ? 42.0 : -1.0)};
      g.broadcast(b, 1);
      bcast[static_cast<size_t>(r)] = b[0].item<double>();
      gathered[static_cast<size_t>(r)] = g.all_gather(std::string(static_cast<size_t>(r) + 1, 'a' + static_cast<char>(r)));
      g.barrier();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sums[static_cast<size_t>(r)], (std::vector<float>{3, 6, 7}));
    EXPECT_EQ(bcast[static_cast<size_t>(r)], 42.0);
    EXPECT_EQ(gathered[static_cast<size_t>(r)], (std::vector<std::string>{"a", "bb", "ccc"}));
  }
}

// A worker whose group goes away (its process died: the sockets close) is named by rank
// in the others' errors, which come at once, not after the timeout.
TEST(WorkerGroup, TheLostWorkerIsNamed) {
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      try {
        auto g = std::make_unique<GlooWorkerGroup>(loopback(r, 3, coord), std::chrono::seconds(5));
        g->barrier();          // every group is made
        if (r == 2) return;  // leaves: its sockets close
        std::vector<Tensor> t = {Tensor::from_vector<float>({1.0f, 2.0f}, {2})};
        // Worker 2 takes part in every step of halving-doubling on 3 workers.
        for (int i = 0; i < 1000; ++i) g->all_reduce_sum(t);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  // Worker 0 or 1 may see worker 2's end first or the other survivor's; one of them
  // names worker 2, both name a worker (whichever end of a connection Gloo's message
  // prints: a listening address or an accepted connection's outgoing port), and no one
  // blames itself.
  EXPECT_TRUE(errors[0].find("worker 2 died, hangs or lost the network") != std::string::npos ||
              errors[1].find("worker 2 died, hangs or lost the network") != std::string::npos)
      << errors[0] << "\n" << errors[1];
  EXPECT_EQ(errors[2], "");
  EXPECT_EQ(errors[0].find("another worker"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1].find("another worker"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[0].find("worker 0 died"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1].find("worker 1 died"), std::string::npos) << errors[1];
}

// MPI collectives where mpirun did not launch the job: refused with the reason; kAuto
// falls back to Gloo (one worker here: nothing to connect).
TEST(WorkerGroup, MpiNeedsMpirun) {
  ClusterSpec c;
  c.size = 2;
  c.coordinator = "127.0.0.1:1";
  c.source = "KILN_WORKERS";
  EXPECT_KILN_ERROR(WorkerGroup::connect(c, std::chrono::seconds(1), Collectives::kMpi), kFailedPrecondition,
                    "MPI collectives: the job was not launched by mpirun (KILN_WORKERS)");
  ClusterSpec one;
  EXPECT_EQ(WorkerGroup::connect(one, std::chrono::seconds(1), Collectives::kAuto)->backend(), "gloo");
}

TEST(WorkerGroup, AMissingWorkerIsADeadlineNotAHang) {
  ClusterSpec c = loopback(0, 2, "127.0.0.1:" + std::to_string(free_port()));
  EXPECT_KILN_ERROR(GlooWorkerGroup(c, std::chrono::milliseconds(800)), kDeadlineExceeded,
                    "worker 1 did not reach the rendezvous");
  ClusterSpec w1 = c;
  w1.rank = 1;  // worker 0 never serves the store
  EXPECT_KILN_ERROR(GlooWorkerGroup(w1, std::chrono::milliseconds(500)), kDeadlineExceeded, "cannot reach worker 0");
}

}  // namespace
}  // namespace kiln::distribute
