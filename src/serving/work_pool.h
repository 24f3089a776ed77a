#pragma once
// A fixed pool of threads running queued jobs in order: the server runs unbatched model
// calls here, so that slow inferences never occupy the REST I/O threads (health checks,
// metrics and new connections stay responsive under load).
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::serving {

class WorkPool {
 public:
  explicit WorkPool(int threads);
  ~WorkPool();  // runs what is queued, then joins
  void submit(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln::serving
