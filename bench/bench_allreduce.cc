// kiln's multi-worker all-reduce against OpenMPI's MPI_Allreduce, in the same processes:
//   mpirun --allow-run-as-root -np 2 build/default/bin/bench_allreduce [rounds]
// kiln's path is what `kiln train --strategy multi_worker` uses under mpirun
// (WorkerGroup::connect, auto: MPI through the libkiln_mpi plugin) and, beside it, its Gloo
// group (every other launcher). Sizes from 4 KiB to 256 MiB of f32 (zeros, in memory
// from kiln's allocator for all three); each size alternates the three, rounds x 10 calls
// (4 from 64 MiB); rank 0 prints medians of the time a call (kiln's include
// its copies into and out of its flat buffer) and the bus bandwidth as nccl-tests defines
// it for all-reduce: bytes x 2 (n - 1) / n / time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "distribute/gloo_worker_group.h"
#include "distribute/worker_group.h"
#include "kiln/distribute/cluster.h"

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  using namespace kiln::distribute;
  const ClusterSpec cluster = ClusterSpec::from_environment();
  std::unique_ptr<WorkerGroup> kiln = WorkerGroup::connect(cluster, std::chrono::seconds(60));
  GlooWorkerGroup gloo(cluster, std::chrono::seconds(60));
  using clock = std::chrono::steady_clock;
  if (rank == 0) {
    std::printf("all-reduce (sum, f32) over %d processes on this machine: microseconds a call and bus bandwidth "
                "(GB/s), medians of %d x 10 calls; kiln's collectives: %s\n",
                size, rounds, kiln->backend().c_str());
    std::printf("| bytes | OpenMPI us | kiln us | Gloo us | OpenMPI GB/s | kiln GB/s | Gloo GB/s | kiln / OpenMPI bandwidth "
                "| Gloo / OpenMPI bandwidth |\n|---|---|---|---|---|---|---|---|---|\n");
  }
  for (int64_t bytes = 4096; bytes <= (int64_t{256} << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    std::vector<double> mpi_t, kiln_t, gloo_t;
    // The same memory for every contender (kiln's allocator), zeros (no overflow).
    kiln::Tensor raw = kiln::Tensor::zeros({n});
    float* buf = raw.data<float>();
    std::vector<kiln::Tensor> t = {kiln::Tensor::zeros({n})};
    const int calls = bytes >= (int64_t{64} << 20) ? 4 : 10;
    auto timed = [&](std::vector<double>& into, auto&& op) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = clock::now();
      op();
      into.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
    };
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < calls; ++i) {
        auto mpi = [&] {
          timed(mpi_t, [&] { MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
        };
        if (i % 2 == 0) mpi();  // (the order alternates)
        timed(kiln_t, [&] { kiln->all_reduce_sum(t); });
        if (i % 2 == 1) mpi();
        timed(gloo_t, [&] { gloo.all_reduce_sum(t); });
      }
    if (rank == 0) {
      const double m = median(mpi_t), k = median(kiln_t), g = median(gloo_t);
      const double factor = 2.0 * (size - 1) / size * static_cast<double>(bytes) / 1e3;  // bytes/us -> GB/s
      std::printf("| %lld | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", static_cast<long long>(bytes), m,
                  k, g, factor / m, factor / k, factor / g, m / k, m / g);
    }
  }
  MPI_Finalize();
  return 0;
}
