#include "http_server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/version.hpp>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>

#include "json_codec.h"
#include "kiln/serving/status.h"

namespace kiln::serving {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpOptions opts;
  HttpHandler handler;
  std::atomic<int64_t>* in_flight;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  // Keeps the I/O threads running while answers are still to come from batch threads
  // (an idle loop would return from run() once the acceptor closes).
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::condition_variable idle;
  std::set<std::weak_ptr<Session>, std::owner_less<std::weak_ptr<Session>>> sessions;
  bool stopped = false;

  Impl(HttpOptions o, HttpHandler h, std::atomic<int64_t>* f)
      : opts(std::move(o)), handler(std::move(h)), in_flight(f), ioc(std::max(1, opts.threads)) {}
  void accept();
  void done_one() {
    if (in_flight->fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      idle.notify_all();
    }
  }
};

namespace {

HttpResponse error_response(int status, std::string_view message) {
  return HttpResponse{status, "application/json", json::encode_error(message)};
}

}  // namespace

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<HttpServer::Impl> srv) : stream_(std::move(socket)), srv_(std::move(srv)) {}
  void start() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::read, shared_from_this()));
  }
  void close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.close();
    });
  }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(srv_->opts.max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(srv_->opts.max_header_bytes));
    stream_.expires_after(srv_->opts.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  // Errors while reading: answer what can be answered, then close.
  bool read_failed(beast::error_code ec) {
    if (!ec) return false;
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      shutdown();
      return true;
    }
    if (ec == http::error::body_limit) {
      respond_and_close(error_response(413, "request body exceeds the limit of " +
                                                std::to_string(srv_->opts.max_body_bytes) + " bytes"));
    } else if (ec == http::error::header_limit) {
      respond_and_close(error_response(431, "request header exceeds the limit of " +
                                                std::to_string(srv_->opts.max_header_bytes) + " bytes"));
    } else if (ec == http::error::partial_message) {
      shutdown();  // the client went away mid-request
    } else {
      respond_and_close(error_response(400, "malformed HTTP request: " + ec.message()));
    }
    return true;
  }

  void on_header(beast::error_code ec, size_t) {
    if (read_failed(ec)) return;
    // A declared body over the limit is refused before it is read.
    stream_.expires_after(srv_->opts.body_timeout);
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (read_failed(ec)) return;
    auto req = parser_->release();
    parser_.reset();
    stream_.expires_never();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    chunked_ = version_ >= 11;
    HttpRequest hr;
    hr.method = std::string(req.method_string());
    hr.target = std::string(req.target());
    hr.body = std::move(req.body());
    auto t = req.find("X-Request-Timeout-Ms");
    if (t != req.end()) hr.timeout_header = std::string(t->value());
    srv_->in_flight->fetch_add(1);
    auto answered = std::make_shared<std::atomic<bool>>(false);
    hr.cancelled = std::make_shared<std::atomic<bool>>(false);
    watch_for_close(answered, hr.cancelled);
    Responder respond = [self = shared_from_this(), answered](HttpResponse r) {
      if (answered->exchange(true)) return;
      net::post(self->stream_.get_executor(), [self, r = std::move(r)]() mutable { self->write(std::move(r), true); });
    };
    hr.open_stream = [self = shared_from_this(), answered](int status, std::string content_type) -> std::shared_ptr<HttpStream> {
      if (answered->exchange(true)) return nullptr;
      return self->open_stream(status, std::move(content_type));
    };
    try {
      srv_->handler(std::move(hr), respond);
    } catch (...) {
      auto st = status_of_current_exception();
      respond(error_response(http_status(st.code), st.message));
    }
  }

  // While a request waits for its answer, a readable socket with nothing to read means
  // the client closed it: flag the request (queued work is then dropped, 499). Pipelined
  // bytes leave the flag alone; a stale wait is ignored once the answer went out.
  void watch_for_close(std::shared_ptr<std::atomic<bool>> answered, std::shared_ptr<std::atomic<bool>> cancelled) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), answered,
                                                         cancelled](beast::error_code ec) {
      if (ec || answered->load()) return;
      char c;
      ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) cancelled->store(true);
    });
  }

  class Stream : public HttpStream {
   public:
    explicit Stream(std::shared_ptr<Session> s) : s_(std::move(s)) {}
    ~Stream() override { end(); }
    bool write(std::string data) override { return !ended_.load() && s_->stream_write(std::move(data)); }
    void end() override {
      if (!ended_.exchange(true)) s_->stream_end();
    }
    bool closed() const override { return s_->stream_closed_.load(); }

   private:
    std::shared_ptr<Session> s_;
    std::atomic<bool> ended_{false};
  };

  std::shared_ptr<HttpStream> open_stream(int status, std::string content_type) {
    net::post(stream_.get_executor(), [self = shared_from_this(), status, content_type = std::move(content_type)] {
      if (!self->chunked_) self->keep_alive_ = false;
      std::string head = std::string(self->chunked_ ? "HTTP/1.1 " : "HTTP/1.0 ") + std::to_string(status) + " " +
                         std::string(http::obsolete_reason(static_cast<http::status>(status))) +
                         "\r\nServer: kiln\r\nContent-Type: " + content_type + "\r\nCache-Control: no-cache\r\n" +
                         (self->chunked_ ? "Transfer-Encoding: chunked\r\n" : "") +
                         (self->keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
      self->stream_backlog_ += static_cast<int64_t>(head.size());
      self->out_.push_back(std::move(head));
      self->pump();
    });
    return std::make_shared<Stream>(shared_from_this());
  }

  bool stream_write(std::string data) {
    if (stream_closed_.load()) return false;
    if (data.empty()) return true;
    if (chunked_) {
      char size[24];
      const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      data.insert(0, size, static_cast<size_t>(n));
      data += "\r\n";
    }
    if (stream_backlog_.fetch_add(static_cast<int64_t>(data.size())) + static_cast<int64_t>(data.size()) >
        srv_->opts.max_stream_backlog_bytes) {
      // The client reads too slowly: drop it rather than hold the producer or memory.
      stream_closed_.store(true);
      net::post(stream_.get_executor(), [self = shared_from_this()] { self->stream_failed(); });
      return false;
    }
    net::post(stream_.get_executor(), [self = shared_from_this(), data = std::move(data)]() mutable {
      self->out_.push_back(std::move(data));
      self->pump();
    });
    return true;
  }

  void stream_end() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->out_.push_back(self->chunked_ ? "0\r\n\r\n" : "");
      self->end_queued_ = true;
      self->pump();
    });
  }

  // Writes the queued pieces one at a time (on the session's strand).
  void pump() {
    if (writing_ || out_.empty()) return;
    if (stream_closed_.load() && !stream_done_) return stream_failed();
    if (end_queued_ && out_.size() == 1) {
      // The last piece: the response is complete once it is written.
      if (out_.front().empty()) {
        out_.clear();
        return stream_finished();
      }
    }
    writing_ = true;
    stream_.expires_after(srv_->opts.body_timeout);
    net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->writing_ = false;
      self->stream_backlog_ -= static_cast<int64_t>(n);
      if (ec) {
        self->stream_closed_.store(true);
        return self->stream_failed();
      }
      self->out_.pop_front();
      if (self->end_queued_ && self->out_.empty()) return self->stream_finished();
      self->pump();
    });
  }

  void stream_finished() {
    if (stream_done_) return;
    stream_done_ = true;
    srv_->done_one();
    reset_stream();
    if (!keep_alive_) return shutdown();
    read();
  }

  // The client is gone or too slow: drop what is queued and the connection. A write in
  // progress finishes first (its buffer is the queue's front).
  void stream_failed() {
    stream_closed_.store(true);
    if (writing_) return;
    out_.clear();
    if (stream_done_) return;
    stream_done_ = true;
    srv_->done_one();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  }

  void reset_stream() {
    out_.clear();
    end_queued_ = false;
    stream_backlog_ = 0;
    stream_done_ = false;
  }

  void respond_and_close(HttpResponse r) {
    keep_alive_ = false;
    write(std::move(r), false);
  }

  void write(HttpResponse r, bool counted) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), version_ ? version_ : 11);
    res->set(http::field::server, "kiln");
    res->set(http::field::content_type, r.content_type);
    for (auto& [name, value] : r.headers) res->set(name, value);
    res->keep_alive(keep_alive_);
    res->body() = std::move(r.body);
    res->prepare_payload();
    stream_.expires_after(srv_->opts.body_timeout);
    http::async_write(stream_, *res, [self = shared_from_this(), res, counted](beast::error_code ec, size_t) {
      if (counted) self->srv_->done_one();
      if (ec || !self->keep_alive_ || !res->keep_alive()) return self->shutdown();
      self->read();
    });
  }

  void shutdown() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpServer::Impl> srv_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  // Streamed responses (strand, except the atomics).
  std::deque<std::string> out_;
  bool writing_ = false, end_queued_ = false, stream_done_ = false, chunked_ = true;
  std::atomic<bool> stream_closed_{false};
  std::atomic<int64_t> stream_backlog_{0};
};

std::string_view query_param(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    auto amp = query.find('&');
    auto kv = query.substr(0, amp);
    auto eq = kv.find('=');
    if (kv.substr(0, eq) == key) return eq == std::string_view::npos ? std::string_view{} : kv.substr(eq + 1);
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
  return {};
}

std::chrono::steady_clock::time_point request_deadline(const HttpRequest& req, std::chrono::steady_clock::time_point start) {
  const std::string_view target = req.target;
  const size_t q = target.find('?');
  const std::string_view tms = !req.timeout_header.empty() ? std::string_view(req.timeout_header)
                               : q == std::string_view::npos ? std::string_view{}
                                                             : query_param(target.substr(q + 1), "timeout_ms");
  if (tms.empty()) return std::chrono::steady_clock::time_point::max();
  int64_t ms = 0;
  const auto r = std::from_chars(tms.data(), tms.data() + tms.size(), ms);
  if (r.ec != std::errc() || r.ptr != tms.data() + tms.size() || ms <= 0)
    throw InvalidArgumentError("the request timeout must be a positive number of milliseconds, got '" + std::string(tms) + "'");
  // Beyond a day is no deadline (and keeps the nanosecond arithmetic from overflowing).
  if (ms > 86'400'000) return std::chrono::steady_clock::time_point::max();
  return start + std::chrono::milliseconds(ms);
}

void HttpServer::Impl::accept() {
  acceptor->async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
    } else {
      socket.set_option(tcp::no_delay(true), ec);
      auto s = std::make_shared<Session>(std::move(socket), self);
      {
        std::lock_guard<std::mutex> lock(self->mu);
        if (self->stopped) return;
        for (auto it = self->sessions.begin(); it != self->sessions.end();)
          it = it->expired() ? self->sessions.erase(it) : std::next(it);
        self->sessions.insert(s);
      }
      s->start();
    }
    if (self->acceptor && self->acceptor->is_open()) self->accept();
  });
}

HttpServer::HttpServer(HttpOptions opts, HttpHandler handler) {
  if (opts.threads <= 0) opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  impl_ = std::make_shared<Impl>(std::move(opts), std::move(handler), &in_flight_);
}

HttpServer::~HttpServer() {
  stop(std::chrono::milliseconds(0));
  // Answers posted after the threads stopped (e.g. batches failed at unload) hold their
  // sessions: run them once so that every session is released.
  for (int i = 0; i < 2; ++i) {  // the second pass runs the reads that closing cancelled
    impl_->ioc.restart();
    impl_->ioc.poll();
  }
}

void HttpServer::start() {
  auto& im = *impl_;
  beast::error_code ec;
  auto addr = net::ip::make_address(im.opts.host, ec);
  if (ec) throw InvalidArgumentError("bad listen address '" + im.opts.host + "': " + ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(im.opts.port));
  im.acceptor.emplace(net::make_strand(im.ioc));  // accept handlers and close() never overlap
  im.acceptor->open(ep.protocol(), ec);
  if (!ec) im.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor->bind(ep, ec);
  if (!ec) im.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw UnavailableError("cannot listen on " + im.opts.host + ":" + std::to_string(im.opts.port) +
                                                " (REST): " + ec.message());
  port_ = im.acceptor->local_endpoint().port();
  im.work.emplace(im.ioc.get_executor());
  im.accept();
  for (int i = 0; i < im.opts.threads; ++i) im.threads.emplace_back([&im] { im.ioc.run(); });
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  auto& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (im.stopped) return;
    im.stopped = true;
  }
  if (im.acceptor) {
    net::post(im.acceptor->get_executor(), [&im] {
      beast::error_code ec;
      im.acceptor->close(ec);
    });
  }
  {
    std::unique_lock<std::mutex> lock(im.mu);
    im.idle.wait_for(lock, grace, [&] { return in_flight_.load() == 0; });
    for (auto& w : im.sessions)
      if (auto s = w.lock()) s->close();
    im.sessions.clear();
  }
  im.work.reset();
  im.ioc.stop();
  for (auto& t : im.threads) t.join();
  im.threads.clear();
}

}  // namespace kiln::serving
