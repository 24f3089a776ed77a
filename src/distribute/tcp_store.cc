#include "distribute/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/core/error.h"

namespace kiln::distribute {
namespace {

using clock = std::chrono::steady_clock;

void split_addr(const std::string& addr, std::string* host, std::string* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) throw InvalidArgumentError("rendezvous: '" + addr + "' is not host:port");
  *host = addr.substr(0, colon);
  *port = addr.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[') *host = host->substr(1, host->size() - 2);
}

// Waits until fd is readable (or writable), at most until `deadline`; false on timeout.
bool wait_fd(int fd, short events, clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on EOF, error or the deadline.
bool recv_all(int fd, void* data, size_t n, clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

constexpr auto kForever = std::chrono::hours(24 * 365);
constexpr uint32_t kMaxValue = 16u << 20;  // rendezvous values are transport addresses: small

}  // namespace

// ---- server (worker 0) ----------------------------------------------------------------

class TcpStore::Server {
 public:
  explicit Server(const std::string& port) {
    addrinfo hints{};
    hints.ai_family = AF_INET6;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    // Dual-stack (IPv6 socket accepting IPv4 too), else IPv4.
    for (int family : {AF_INET6, AF_INET}) {
      hints.ai_family = family;
      if (::getaddrinfo(nullptr, port.c_str(), &hints, &res) != 0) continue;
      const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
      if (fd >= 0) {
        const int one = 1, zero = 0;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
          listen_fd_ = fd;
        } else {
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
      if (listen_fd_ >= 0) break;
    }
    if (listen_fd_ < 0)
      throw UnavailableError("rendezvous: worker 0 cannot listen on port " + port + ": " + std::strerror(errno));
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    accept_thread_.join();
    for (auto& t : workers_) t.join();
    ::close(listen_fd_);
  }

 private:
  void accept_loop() {
    while (!stop_) {
      if (!wait_fd(listen_fd_, POLLIN, clock::now() + std::chrono::milliseconds(200))) continue;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) {
        ::close(fd);
        break;
      }
      conns_.push_back(fd);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  // One client's requests until it hangs up (malformed requests end the connection).
  void serve(int fd) {
    for (;;) {
      char op;
      uint32_t klen, dlen;
      if (!recv_all(fd, &op, 1, clock::now() + kForever) || !recv_all(fd, &klen, 4, clock::now() + kForever) ||
          klen > 4096)
        break;
      std::string key(klen, '\0');
      if (!recv_all(fd, key.data(), klen, clock::now() + kForever) || !recv_all(fd, &dlen, 4, clock::now() + kForever))
        break;
      if (op == 'S') {
        if (dlen > kMaxValue) break;
        std::vector<char> data(dlen);
        if (!recv_all(fd, data.data(), dlen, clock::now() + kForever)) break;
        {
          std::lock_guard<std::mutex> lock(mu_);
          values_[key] = std::move(data);
        }
        cv_.notify_all();
        if (!send_all(fd, "K", 1)) break;
      } else if (op == 'G') {  // dlen: the timeout in milliseconds
        std::vector<char> value;
        bool found;
        {
          std::unique_lock<std::mutex> lock(mu_);
          found = cv_.wait_for(lock, std::chrono::milliseconds(dlen), [&] { return stop_ || values_.count(key); }) &&
                  values_.count(key);
          if (found) value = values_[key];
        }
        const uint32_t n = static_cast<uint32_t>(value.size());
        if (!send_all(fd, found ? "K" : "T", 1) || !send_all(fd, &n, 4) || !send_all(fd, value.data(), n)) break;
      } else {
        break;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end(); ++it)
      if (*it == fd) {
        conns_.erase(it);
        break;
      }
    ::close(fd);
  }

  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> values_;
  std::vector<int> conns_;
  std::vector<std::thread> workers_;
  std::thread accept_thread_;
};

// ---- client ---------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& coordinator, bool serve, std::chrono::milliseconds timeout)
    : coordinator_(coordinator), timeout_(timeout) {
  std::string host, port;
  split_addr(coordinator, &host, &port);
  if (serve) server_ = std::make_unique<Server>(port);
  const auto deadline = clock::now() + timeout;
  std::string last_error = "no attempt";
  while (fd_ < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (clock::now() >= deadline)
      throw DeadlineExceededError(detail::str_cat("rendezvous: cannot reach worker 0 at ", coordinator, " within ",
                                                  timeout.count() / 1000.0, " s (", last_error, ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::vector<char> TcpStore::request(char op, const std::string& key, const std::vector<char>& data,
                                    std::chrono::milliseconds timeout) {
  const uint32_t klen = static_cast<uint32_t>(key.size());
  const uint32_t dlen = op == 'S' ? static_cast<uint32_t>(data.size()) : static_cast<uint32_t>(timeout.count());
  const auto deadline = clock::now() + timeout + std::chrono::seconds(5);
  bool ok = send_all(fd_, &op, 1) && send_all(fd_, &klen, 4) && send_all(fd_, key.data(), klen) &&
            send_all(fd_, &dlen, 4) && (op != 'S' || send_all(fd_, data.data(), data.size()));
  char status = 0;
  uint32_t n = 0;
  std::vector<char> value;
  ok = ok && recv_all(fd_, &status, 1, deadline);
  if (ok && op == 'G') {
    ok = recv_all(fd_, &n, 4, deadline) && n <= kMaxValue;
    value.resize(n);
    ok = ok && recv_all(fd_, value.data(), n, deadline);
  }
  if (!ok) throw UnavailableError("rendezvous: lost the connection to worker 0 at " + coordinator_);
  if (status == 'T') {
    // Gloo's full-mesh rendezvous keys each worker's addresses by its rank.
    const bool rank_key = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
    throw DeadlineExceededError(detail::str_cat(
        "rendezvous: ", rank_key ? "worker " + key : "'" + key + "'", " did not reach the rendezvous at ", coordinator_,
        " within ", timeout.count() / 1000.0, " s (not started, or started with another worker list)"));
  }
  return value;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) { request('S', key, data, timeout_); }

std::vector<char> TcpStore::get(const std::string& key) { return request('G', key, {}, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  for (const std::string& k : keys) request('G', k, {}, timeout);
}

}  // namespace kiln::distribute
