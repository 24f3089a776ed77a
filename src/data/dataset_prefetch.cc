// prefetch: a background thread runs the input ahead of the consumer.
//
// AUTOTUNE starts with a buffer of one element and grows it by one each time the
// consumer finds it empty (it had to wait), as long as the pipeline's buffered bytes
// stay within the RAM budget; a fixed size is used as given.
#include <deque>
#include <thread>

#include "dataset_internal.h"

namespace kiln::data {

struct PrefetchIterator::Impl {
  Impl(std::unique_ptr<IteratorImpl> in, int64_t buffer, const IterContext& c)
      : input(std::move(in)), autotune(buffer == kAutotune), limit(autotune ? 1 : buffer), ctx(c) {
    cancel_handle = ctx.state->on_cancel([this] {
      std::lock_guard<std::mutex> lk(mu);
      cv.notify_all();
    });
    thread = std::thread([this] {
      init_pipeline_thread("kiln-prefetch");
      run();
    });
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
    ctx.state->unregister(cancel_handle);
    for (const auto& e : buf) ctx.state->buffered_bytes -= static_cast<int64_t>(e.nbytes());
  }

  bool stopping() const { return stop || ctx.cancelled(); }

  void run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stopping() || static_cast<int64_t>(buf.size()) < limit; });
        if (stopping()) return;
      }
      Element e;
      bool got = false;
      std::exception_ptr err;
      try {
        got = input->next(&e);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu);
      if (err) {
        error = std::move(err);  // no reference left in this thread (see dataset_map.cc)
        ended = true;
      } else if (!got) {
        ended = true;
      } else {
        int64_t bytes = static_cast<int64_t>(e.nbytes());
        ctx.state->buffered_bytes += bytes;
        last_bytes = bytes;
        buf.push_back(std::move(e));
      }
      cv.notify_all();
      if (ended) return;
    }
  }

  bool next(Element* out) {
    std::unique_lock<std::mutex> lk(mu);
    if (buf.empty() && !ended && !ctx.cancelled()) {
      // The consumer waits: with AUTOTUNE, allow one more element ahead if the budget
      // has room for it.
      if (autotune && limit < kMaxAutotune &&
          ctx.state->buffered_bytes.load() + last_bytes * (limit + 1) <= ctx.ram_budget_bytes) {
        ++limit;
        cv.notify_all();
      }
      cv.wait(lk, [&] { return !buf.empty() || ended || ctx.cancelled(); });
    }
    if (ctx.cancelled()) return false;
    if (!buf.empty()) {
      *out = std::move(buf.front());
      buf.pop_front();
      ctx.state->buffered_bytes -= static_cast<int64_t>(out->nbytes());
      cv.notify_all();
      return true;
    }
    if (error) {
      auto e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
    return false;
  }

  bool ready() {
    std::lock_guard<std::mutex> lk(mu);
    return !buf.empty() || ended || ctx.cancelled();
  }

  static constexpr int64_t kMaxAutotune = 1024;
  std::unique_ptr<IteratorImpl> input;
  bool autotune;
  int64_t limit;
  IterContext ctx;
  int64_t cancel_handle = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Element> buf;
  bool ended = false;
  bool stop = false;
  std::exception_ptr error;
  int64_t last_bytes = 0;
  std::thread thread;
};

PrefetchIterator::PrefetchIterator(std::unique_ptr<IteratorImpl> input, int64_t buffer, const IterContext& ctx)
    : impl_(std::make_unique<Impl>(std::move(input), buffer, ctx)) {}
PrefetchIterator::~PrefetchIterator() = default;
bool PrefetchIterator::next(Element* out) { return impl_->next(out); }
bool PrefetchIterator::ready() { return impl_->ready(); }

namespace {

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr input, int64_t buffer)
      : DatasetNode("Prefetch", input->spec(), input->cardinality(), {input}), buffer_(buffer) {}
  std::string params() const override {
    return buffer_ == kAutotune ? "buffer_size=AUTOTUNE" : detail::str_cat("buffer_size=", buffer_);
  }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    auto in = inputs()[0]->make(ctx);
    if (buffer_ == 0) return in;
    return std::make_unique<PrefetchIterator>(std::move(in), buffer_, ctx);
  }

 private:
  int64_t buffer_;
};

}  // namespace

NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size) {
  KILN_CHECK_ARG(buffer_size >= 0 || buffer_size == kAutotune, "prefetch: buffer_size must be >= 0 or kAutotune, got ",
                 buffer_size);
  return std::make_shared<PrefetchNode>(std::move(input), buffer_size);
}

}  // namespace kiln::data
