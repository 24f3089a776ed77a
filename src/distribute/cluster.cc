#include "kiln/distribute/cluster.h"

#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/core/error.h"

namespace kiln::distribute {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

int parse_index(const std::string& v, const char* what, int size) {
  char* end = nullptr;
  const long i = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || i < 0 || (size > 0 && i >= size))
    throw InvalidArgumentError(detail::str_cat(what, "='", v, "': want a worker index in [0, ", size, ")"));
  return static_cast<int>(i);
}

// "host:port" -> host; throws naming `what`.
std::string host_of(const std::string& addr, const std::string& what) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    throw InvalidArgumentError(what + ": '" + addr + "' is not host:port");
  const std::string port = addr.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || p < 1 || p > 65535) throw InvalidArgumentError(what + ": '" + addr + "' has no valid port");
  std::string host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

ClusterSpec from_list(const std::vector<std::string>& workers, int rank, const std::string& what) {
  if (workers.empty()) throw InvalidArgumentError(what + ": no workers");
  ClusterSpec c;
  c.size = static_cast<int>(workers.size());
  c.rank = rank;
  for (const std::string& w : workers) host_of(w, what);
  c.coordinator = workers[0];
  c.host = host_of(workers[static_cast<size_t>(rank)], what);
  return c;
}

}  // namespace

ClusterSpec ClusterSpec::from_environment() {
  ClusterSpec c;
  if (const std::string tf = env("TF_CONFIG"); !tf.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(tf);
    } catch (const std::exception& e) {
      throw InvalidArgumentError(std::string("TF_CONFIG is not JSON: ") + e.what());
    }
    const auto& cluster = j.contains("cluster") ? j["cluster"] : nlohmann::json();
    const auto& task = j.contains("task") ? j["task"] : nlohmann::json();
    if (!cluster.is_object() || !cluster.contains("worker") || !cluster["worker"].is_array() || !task.is_object() ||
        !task.contains("index") || !task["index"].is_number_integer())
      throw InvalidArgumentError("TF_CONFIG: want {\"cluster\": {\"worker\": [\"host:port\", ...]}, \"task\": {\"type\": "
                                 "\"worker\", \"index\": i}}");
    if (task.contains("type") && task["type"] != "worker" && task["type"] != "chief")
      throw InvalidArgumentError("TF_CONFIG: task type " + task["type"].dump() + " (kiln's workers are type worker)");
    std::vector<std::string> workers;
    // A "chief" entry (TensorFlow's separate chief task) is worker 0 here.
    if (cluster.contains("chief") && cluster["chief"].is_array())
      for (const auto& w : cluster["chief"]) workers.push_back(w.get<std::string>());
    const size_t chiefs = workers.size();
    for (const auto& w : cluster["worker"]) {
      if (!w.is_string()) throw InvalidArgumentError("TF_CONFIG: cluster.worker entries are \"host:port\" strings");
      workers.push_back(w.get<std::string>());
    }
    const long index = task["index"].get<long>();
    const bool is_chief = task.contains("type") && task["type"] == "chief";
    const long rank = is_chief ? index : index + static_cast<long>(chiefs);
    if (index < 0 || rank >= static_cast<long>(workers.size()))
      throw InvalidArgumentError(detail::str_cat("TF_CONFIG: task index ", index, " but ", workers.size(), " workers"));
    c = from_list(workers, static_cast<int>(rank), "TF_CONFIG");
    c.source = "TF_CONFIG";
  } else if (const std::string list = env("KILN_WORKERS"); !list.empty()) {
    std::vector<std::string> workers;
    for (size_t b = 0; b <= list.size();) {
      size_t e = list.find(',', b);
      if (e == std::string::npos) e = list.size();
      if (e > b) workers.push_back(list.substr(b, e - b));
      b = e + 1;
    }
    const std::string rank = env("KILN_RANK");
    if (rank.empty()) throw InvalidArgumentError("KILN_WORKERS is set but KILN_RANK is not (this worker's index)");
    c = from_list(workers, parse_index(rank, "KILN_RANK", static_cast<int>(workers.size())), "KILN_WORKERS");
    c.source = "KILN_WORKERS";
  } else if (const std::string size = env("OMPI_COMM_WORLD_SIZE"); !size.empty()) {
    c.size = parse_index(size, "OMPI_COMM_WORLD_SIZE", 0);
    if (c.size < 1) throw InvalidArgumentError("OMPI_COMM_WORLD_SIZE=" + size + ": want >= 1");
    c.rank = parse_index(env("OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK", c.size);
    c.source = "mpirun";
    if (const std::string coord = env("KILN_COORDINATOR"); !coord.empty()) {
      host_of(coord, "KILN_COORDINATOR");
      c.coordinator = coord;
      char name[256] = {};
      c.host = ::gethostname(name, sizeof name - 1) == 0 ? name : "127.0.0.1";
    } else {
      std::string job = env("PMIX_NAMESPACE");
      if (job.empty()) job = env("OMPI_MCA_orte_jobfam_session_dir");
      if (job.empty()) throw InvalidArgumentError("mpirun: neither KILN_COORDINATOR nor PMIX_NAMESPACE is set");
      for (char& ch : job)
        if (ch == '/' || ch == ' ') ch = '_';
      c.store_dir = "/tmp/kiln-rendezvous-" + job;
      c.host = "127.0.0.1";
    }
  }
  if (const std::string h = env("KILN_WORKER_HOST"); !h.empty()) c.host = h;
  return c;
}

}  // namespace kiln::distribute
