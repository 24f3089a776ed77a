#pragma once
// A small HTTP/1.1 server on Boost.Beast: keep-alive, pipelined requests (answered in
// order), a body limit (413), a header limit (431), header and body timeouts (slow
// clients are cut off), malformed requests answered 400. Handlers are asynchronous:
// they answer through a Responder, from any thread, exactly once, or open a stream
// (chunked transfer encoding: Server-Sent Events) and write it piece by piece.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kiln::serving {

// A response written in pieces (HTTP/1.1 chunked transfer encoding; HTTP/1.0: the
// connection closes at the end). Writes never block: they are queued and sent by the
// connection's I/O thread. A client that goes away, or falls more than
// HttpOptions::max_stream_backlog_bytes behind, is disconnected; write() then returns
// false and the producer should stop. Any thread; end() once (the destructor ends it).
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  virtual bool write(std::string data) = 0;
  virtual void end() = 0;
  virtual bool closed() const = 0;
};

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // path + query, as sent
  std::string body;
  std::string timeout_header;  // X-Request-Timeout-Ms, when sent
  // Set when the client closes the connection before the answer is written.
  std::shared_ptr<std::atomic<bool>> cancelled;
  // Answers with a stream instead of the Responder: writes the status line and headers
  // (content type, Cache-Control: no-cache, extra headers) and returns the stream;
  // nullptr when the request was answered already.
  std::function<std::shared_ptr<HttpStream>(int status, std::string content_type)> open_stream;
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int s, std::string type, std::string b) : status(s), content_type(std::move(type)), body(std::move(b)) {}
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After ...)
};

using Responder = std::function<void(HttpResponse)>;

// The value of `key` in a query string ("a=1&b=2"); empty when absent.
std::string_view query_param(std::string_view query, std::string_view key);
// A request's deadline: header X-Request-Timeout-Ms, else query parameter timeout_ms,
// counted from `start`; none (time_point::max()) when neither is given or it is beyond a
// day. InvalidArgumentError when the value is not a positive number of milliseconds.
std::chrono::steady_clock::time_point request_deadline(const HttpRequest& req, std::chrono::steady_clock::time_point start);
using HttpHandler = std::function<void(HttpRequest&&, Responder)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8501;        // 0: any free port (port() tells which)
  int threads = 0;        // I/O threads; 0: the number of cores
  int64_t max_body_bytes = 64 << 20;
  int64_t max_header_bytes = 16 << 10;
  std::chrono::milliseconds header_timeout{10000};  // also the keep-alive idle limit
  std::chrono::milliseconds body_timeout{30000};  // also how long one streamed write may wait for the client
  int64_t max_stream_backlog_bytes = 8 << 20;
};

class HttpServer {
 public:
  HttpServer(HttpOptions opts, HttpHandler handler);
  ~HttpServer();  // stop(0)
  // Binds and starts the I/O threads; throws UnavailableError naming the
  // address when the port cannot be bound.
  void start();
  int port() const { return port_; }
  // Stops accepting, waits up to `grace` for requests in flight to be answered, closes.
  void stop(std::chrono::milliseconds grace);
  int64_t in_flight() const { return in_flight_.load(); }

  struct Impl;  // defined in http_server.cc (its sessions use it)

 private:
  std::shared_ptr<Impl> impl_;  // sessions share it
  int port_ = 0;
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace kiln::serving
