#include "distribute/worker_group.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "core/runtime_dir.h"
#include "distribute/gloo_worker_group.h"
#include "kiln/core/error.h"

namespace kiln::distribute {

WorkerGroup::WorkerGroup(const ClusterSpec& cluster) : rank_(cluster.rank), size_(cluster.size) {
  if (cluster.size < 1 || cluster.rank < 0 || cluster.rank >= cluster.size)
    throw InvalidArgumentError(detail::str_cat("WorkerGroup: rank ", cluster.rank, " of ", cluster.size));
}

WorkerGroup::~WorkerGroup() = default;

int64_t WorkerGroup::elements_of(const std::vector<Tensor>& tensors, DType dt) {
  int64_t n = 0;
  for (const Tensor& t : tensors)
    if (t.dtype() == dt) n += t.numel();
  return n;
}

void WorkerGroup::pack(const std::vector<Tensor>& tensors, DType dt, char* flat) {
  for (const Tensor& t : tensors)
    if (t.dtype() == dt) {
      std::memcpy(flat, t.raw_data(), t.nbytes());
      flat += t.nbytes();
    }
}

void WorkerGroup::unpack(const char* flat, DType dt, std::vector<Tensor>& tensors) {
  for (Tensor& t : tensors)
    if (t.dtype() == dt) {
      std::memcpy(t.raw_data(), flat, t.nbytes());
      flat += t.nbytes();
    }
}

char* WorkerGroup::contiguous(std::vector<Tensor>& tensors, DType dt) {
  char* first = nullptr;
  char* next = nullptr;
  for (Tensor& t : tensors) {
    if (t.dtype() != dt) continue;
    char* p = static_cast<char*>(t.raw_data());
    if (!first) first = p;
    else if (p != next) return nullptr;
    next = p + t.nbytes();
  }
  return first;
}

namespace {

// The MPI plugin (src/distribute_mpi/), next to the runtime: its connect function, or
// null with the reason. Loaded once; the handle stays open.
using MpiConnect = WorkerGroup* (*)(const ClusterSpec* cluster, int64_t timeout_ms, std::string* error);
MpiConnect mpi_plugin(std::string* why) {
  static std::once_flag once;
  static MpiConnect fn = nullptr;
  static std::string reason;
  std::call_once(once, [] {
#ifdef KILN_MPI_PLUGIN
    const std::string path = detail::runtime_dir() + KILN_MPI_PLUGIN;
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);  // (MPI's own plugins need its symbols global)
    if (!lib) {
      const char* err = dlerror();
      reason = "the MPI plugin could not be loaded: " + std::string(err ? err : path);
      return;
    }
    fn = reinterpret_cast<MpiConnect>(dlsym(lib, "kiln_mpi_connect"));
    if (!fn) reason = path + " has no kiln_mpi_connect";
#else
    reason = "kiln was built without MPI (no MPI development files found)";
#endif
  });
  if (!fn) *why = reason;
  return fn;
}

}  // namespace

std::unique_ptr<WorkerGroup> WorkerGroup::connect(const ClusterSpec& cluster, std::chrono::milliseconds timeout,
                                                  Collectives backend) {
  if (backend != Collectives::kGloo && cluster.size > 1) {
    std::string why;
    if (cluster.source != "mpirun") {
      why = "the job was not launched by mpirun (" +
            (cluster.source.empty() ? std::string("no launcher") : cluster.source) + ")";
    } else if (MpiConnect fn = mpi_plugin(&why)) {
      std::string error;
      std::unique_ptr<WorkerGroup> g(fn(&cluster, timeout.count(), &error));
      if (!g) throw UnavailableError("MPI collectives: " + error);
      return g;
    }
    if (backend == Collectives::kMpi) throw FailedPreconditionError("MPI collectives: " + why);
  }
  return std::make_unique<GlooWorkerGroup>(cluster, timeout);
}

}  // namespace kiln::distribute
