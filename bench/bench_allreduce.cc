// Gloo (kiln's multi-worker collectives, src/distribute/worker_group.cc) against OpenMPI's
// MPI_Allreduce, in the same processes, on the gradient sizes of the built-in models:
//   mpirun --allow-run-as-root -np 2 build/default/bin/bench_allreduce [rounds]
// Each size alternates the two 20 times per round; rank 0 prints medians (microseconds a
// call, including kiln's copies into and out of its flat buffer) and gloo / mpi.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "distribute/gloo_worker_group.h"
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
  kiln::distribute::GlooWorkerGroup group(kiln::distribute::ClusterSpec::from_environment(), std::chrono::seconds(60));
  using clock = std::chrono::steady_clock;
  // 64 KiB; the mlp's gradients (235,146 floats); the cnn's (421,642); 16 MiB.
  const std::vector<std::pair<const char*, int64_t>> sizes = {
      {"64 KiB", 16384}, {"mlp grads", 235146}, {"cnn grads", 421642}, {"16 MiB", 4194304}};
  if (rank == 0) {
    std::printf("all-reduce (sum, f32) over %d processes on this machine, microseconds a call, medians of %d rounds\n",
                size, rounds);
    std::printf("| buffer | floats | OpenMPI | Gloo (kiln) | Gloo / OpenMPI |\n| --- | --- | --- | --- | --- |\n");
  }
  for (const auto& [name, n] : sizes) {
    std::vector<double> mpi_t, gloo_t;
    std::vector<float> buf(static_cast<size_t>(n), 1.0f);
    std::vector<kiln::Tensor> t = {kiln::Tensor::zeros({n})};
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < 20; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = clock::now();
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        mpi_t.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = clock::now();
        group.all_reduce_sum(t);
        gloo_t.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
      }
    if (rank == 0)
      std::printf("| %s | %lld | %.0f | %.0f | %.2f |\n", name, static_cast<long long>(n), median(mpi_t), median(gloo_t),
                  median(gloo_t) / median(mpi_t));
  }
  MPI_Finalize();
  return 0;
}
