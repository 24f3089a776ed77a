#pragma once
// A replica's communication thread: runs the jobs posted to it one after the other, in
// the order they were posted (PendingAllReduce's buckets, while the replica's own
// thread goes on with the backward pass). Jobs catch their own errors.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace kiln::distribute {

class CommThread {
 public:
  CommThread();
  // Runs the jobs still queued, then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;
  void post(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace kiln::distribute
