// Prometheus metrics (kiln/core/metrics.h): the text exposition format, and the
// scrape endpoint of processes without a server (kiln/core/metrics_endpoint.h).
#include "kiln/core/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "kiln/core/metrics_endpoint.h"
#include "kiln/core/process_metrics.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(Metrics, RendersTheTextExpositionFormat) {
  Metrics m;
  m.counter("t_requests_total", "Requests", {"model", "code"}).at({"a\"b", "OK"}).inc(3);
  m.gauge("t_queue", "Queued rows", {}).at({}).set(2.5);
  auto& h = m.histogram("t_latency_seconds", "Latency", {"model"}, {0.1, 1});
  h.at({"x"}).observe(0.05);
  h.at({"x"}).observe(0.5);
  h.at({"x"}).observe(7);
  const std::string text = m.render();
  for (const char* line : {"# HELP t_requests_total Requests", "# TYPE t_requests_total counter",
                           "t_requests_total{model=\"a\\\"b\",code=\"OK\"} 3", "# TYPE t_queue gauge", "t_queue 2.5",
                           "# TYPE t_latency_seconds histogram", "t_latency_seconds_bucket{model=\"x\",le=\"0.1\"} 1",
                           "t_latency_seconds_bucket{model=\"x\",le=\"1\"} 2",
                           "t_latency_seconds_bucket{model=\"x\",le=\"+Inf\"} 3", "t_latency_seconds_sum{model=\"x\"} 7.55",
                           "t_latency_seconds_count{model=\"x\"} 3"})
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << "no '" << line << "' in\n" << text;
}

// One HTTP/1.1 exchange on 127.0.0.1:port; the whole response.
std::string http(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(MetricsEndpoint, AnswersScrapesAndNothingElse) {
  Metrics m;
  register_process_metrics(m);
  m.counter("t_steps_total", "Steps", {}).at({}).inc(41);
  MetricsEndpoint ep(m, "127.0.0.1", 0);
  ASSERT_GT(ep.port(), 0);
  const std::string ok = http(ep.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("\nt_steps_total 41\n"), std::string::npos) << ok;
  EXPECT_NE(ok.find("\nkiln_build_info{version="), std::string::npos) << ok;
  EXPECT_NE(ok.find("\nprocess_resident_memory_bytes "), std::string::npos) << ok;
  EXPECT_NE(ok.find("kiln_allocator_bytes_in_use{device=\"cpu:0\"}"), std::string::npos) << ok;
  EXPECT_EQ(http(ep.port(), "GET /healthz HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_EQ(http(ep.port(), "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(http(ep.port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  // A client that sends nothing is dropped; the next one is answered.
  std::thread silent([&] { EXPECT_EQ(http(ep.port(), ""), ""); });
  EXPECT_EQ(http(ep.port(), "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 OK", 0), 0u);
  silent.join();
  // The port is taken while it listens; a bad host is refused.
  EXPECT_KILN_ERROR(MetricsEndpoint(m, "127.0.0.1", ep.port()), kUnavailable, "cannot listen on 127.0.0.1:");
  EXPECT_KILN_ERROR(MetricsEndpoint(m, "not-an-address", 0), kUnavailable, "not-an-address");
}

}  // namespace
}  // namespace kiln
