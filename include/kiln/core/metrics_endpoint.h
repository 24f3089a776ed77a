#pragma once
// A minimal HTTP endpoint for Prometheus to scrape a process that has no server of its
// own (`kiln train --metrics_port`): GET /metrics answers Metrics::render() in the text
// exposition format, GET /healthz "ok", anything else 404 (a method other than GET:
// 405). One thread accepts and answers connections one at a time; a client that does
// not send its request within 2 s is dropped. The model server does not use it (its
// REST port serves /metrics).
//
//   Metrics m;
//   register_process_metrics(m);
//   MetricsEndpoint ep(m, "127.0.0.1", 9101);   // port 0: any free port, see port()
//
// Errors: a host that does not parse or a port in use is UnavailableError naming it.
// Thread-safety: the Metrics object must outlive the endpoint; the destructor stops the
// thread and closes the socket.
#include <atomic>
#include <string>
#include <thread>

#include "kiln/core/metrics.h"

namespace kiln {

class MetricsEndpoint {
 public:
  MetricsEndpoint(const Metrics& metrics, const std::string& host, int port);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  void serve();
  const Metrics& metrics_;
  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kiln
