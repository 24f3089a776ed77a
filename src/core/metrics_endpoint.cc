// GET /metrics over a plain socket (kiln/core/metrics_endpoint.h).
#include "kiln/core/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln {
namespace {

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;  // the client went away
    off += static_cast<size_t>(n);
  }
}

std::string response(int code, const char* reason, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(const Metrics& metrics, const std::string& host, int port)
    : metrics_(metrics), host_(host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (port < 0 || port > 65535 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw UnavailableError("metrics endpoint: cannot listen on '" + host + ":" + std::to_string(port) +
                           "' (an IPv4 address and a port 0-65535)");
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw UnavailableError("metrics endpoint: cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_ = true;
  ::shutdown(fd_, SHUT_RDWR);  // wakes the poll
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void MetricsEndpoint::serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    if (stop_) break;
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    // The request line and headers, within 2 s and 8 KiB.
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 2000) <= 0) break;
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    if (req.find("\r\n") != std::string::npos) {
      const std::string line = req.substr(0, req.find("\r\n"));
      const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
      const std::string method = line.substr(0, sp1);
      std::string path = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
      path = path.substr(0, path.find('?'));
      if (method != "GET") send_all(c, response(405, "Method Not Allowed", "text/plain", "GET only\n"));
      else if (path == "/metrics")
        send_all(c, response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics_.render()));
      else if (path == "/healthz") send_all(c, response(200, "OK", "text/plain", "ok\n"));
      else send_all(c, response(404, "Not Found", "text/plain", "not found: " + path + " (try /metrics)\n"));
    }
    ::close(c);
  }
}

}  // namespace kiln
