#pragma once
// A fixed pool of threads running queued jobs in the order they were submitted (one at a
// time with one thread): the server runs unbatched model calls here, so that slow
// inferences never occupy the REST I/O threads (health checks, metrics and new
// connections stay responsive under load); a distribution strategy's replica reduces its
// gradient buckets on a pool of one while its backward pass goes on. Jobs catch their
// own errors.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

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

}  // namespace kiln
