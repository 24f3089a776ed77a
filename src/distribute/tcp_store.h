#pragma once
// The rendezvous store of a multi-worker job (a gloo::rendezvous::Store): worker 0 serves
// a key-value map on the coordinator's host:port while the workers exchange their
// transport addresses; every worker (0 included) is a client. Gets block until the key is
// set or the timeout passes (DeadlineExceededError naming the key: a worker that never
// came). Only rendezvous goes through it; the collectives use Gloo's own transport.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace kiln::distribute {

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // `serve`: this is worker 0 (listens on the coordinator's port, on every address).
  // Clients retry connecting until `timeout` (worker 0 may start last).
  TcpStore(const std::string& coordinator, bool serve, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  class Server;
  std::vector<char> request(char op, const std::string& key, const std::vector<char>& data,
                            std::chrono::milliseconds timeout);
  std::string coordinator_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
};

}  // namespace kiln::distribute
