#pragma once
// The workers of a multi-worker job and how they find each other (rendezvous), read from
// the environment the way the common launchers set it:
//
//   TF_CONFIG      {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}
//                  (TensorFlow's form, as Kubernetes operators and tf.distribute use it)
//   KILN_WORKERS   "host:port,host:port,..." with KILN_RANK=i (Slurm, plain scripts)
//   mpirun         OpenMPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE; the workers meet
//                  through KILN_COORDINATOR=host:port if set, else through files in a
//                  directory of the job (PMIX_NAMESPACE) under /tmp: one host only
//
// Worker 0 is the chief. The coordinator (worker 0's host:port in the lists) is where
// worker 0 serves the rendezvous store while the workers connect; the collectives then
// run over Gloo's TCP transport on ports the system picks. Each worker's transport binds
// the host of its own list entry (KILN_WORKER_HOST overrides; mpirun without lists:
// 127.0.0.1 for the file store, else the machine's hostname).
#include <string>

namespace kiln::distribute {

struct ClusterSpec {
  int rank = 0;
  int size = 1;
  std::string coordinator;  // host:port of worker 0's rendezvous store; "" with a file store
  std::string store_dir;    // the file store's directory (mpirun without KILN_COORDINATOR)
  std::string host;         // the address this worker's transport binds
  std::string source;       // "TF_CONFIG", "KILN_WORKERS", "mpirun" or "" (one worker)

  // From the environment (first of TF_CONFIG, KILN_WORKERS, OpenMPI's variables; else one
  // worker). A malformed value is an InvalidArgumentError naming the variable.
  static ClusterSpec from_environment();
  bool is_chief() const { return rank == 0; }
};

}  // namespace kiln::distribute
