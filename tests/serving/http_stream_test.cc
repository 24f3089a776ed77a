// Streamed HTTP responses (HttpStream: chunked transfer encoding, the Server-Sent Events
// of the LLM API) over loopback: pieces written from another thread arrive whole and in
// order and the connection then serves its next request; HTTP/1.0 gets a plain body and
// a close; a client that leaves, or stops reading past the backlog limit, turns write()
// false without holding the producer, and the server keeps serving.
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "serving/http_server.h"
#include "serving_test_util.h"

namespace kiln::serving {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

// GET /stream?n=N streams N pieces "data: i\n\n" from a thread of its own; anything
// else is a plain answer. Records what the producer saw.
struct StreamServer {
  std::atomic<int> written{0}, refused{0};
  std::atomic<bool> producer_done{false};
  std::vector<std::thread> producers;
  std::unique_ptr<HttpServer> server;

  explicit StreamServer(int64_t backlog = 8 << 20, int pieces_bytes = 0) {
    HttpOptions o;
    o.port = 0;
    o.threads = 2;
    o.max_stream_backlog_bytes = backlog;
    server = std::make_unique<HttpServer>(o, [this, pieces_bytes](HttpRequest&& req, Responder respond) {
      if (req.target.rfind("/stream", 0) != 0) return respond(HttpResponse(200, "text/plain", "plain"));
      const int n = std::stoi(req.target.substr(req.target.find('=') + 1));
      std::shared_ptr<HttpStream> s = req.open_stream(200, "text/event-stream");
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(req.open_stream(200, "text/event-stream"), nullptr);  // once
      producers.emplace_back([this, s, n, pieces_bytes] {
        for (int i = 0; i < n; ++i) {
          std::string piece = "data: " + std::to_string(i) + std::string(static_cast<size_t>(pieces_bytes), 'x') + "\n\n";
          if (s->write(std::move(piece))) ++written;
          else ++refused;
        }
        s->end();
        producer_done = true;
      });
    });
    server->start();
  }
  ~StreamServer() {
    for (auto& t : producers) t.join();
    server->stop(std::chrono::milliseconds(2000));
  }
};

std::string expected_pieces(int n) {
  std::string all;
  for (int i = 0; i < n; ++i) all += "data: " + std::to_string(i) + "\n\n";
  return all;
}

TEST(HttpStream, PiecesFromAnotherThreadArriveInOrderThenKeepAliveContinues) {
  StreamServer srv;
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(srv.server->port())));
  net::write(sock, net::buffer(std::string("GET /stream?n=300 HTTP/1.1\r\nHost: x\r\n\r\n")));
  boost::beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(sock, buf, res);
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res[http::field::content_type], "text/event-stream");
  EXPECT_TRUE(res.chunked());
  EXPECT_EQ(res.body(), expected_pieces(300));
  // The same connection answers its next request.
  net::write(sock, net::buffer(std::string("GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")));
  http::response<http::string_body> next;
  http::read(sock, buf, next);
  EXPECT_EQ(next.body(), "plain");
  EXPECT_EQ(srv.written.load(), 300);
}

TEST(HttpStream, Http10GetsAPlainBodyAndAClose) {
  StreamServer srv;
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(srv.server->port())));
  net::write(sock, net::buffer(std::string("GET /stream?n=50 HTTP/1.0\r\n\r\n")));
  std::string got;
  boost::system::error_code ec;
  net::read(sock, net::dynamic_buffer(got), ec);  // until the server closes
  EXPECT_EQ(ec, net::error::eof);
  ASSERT_NE(got.find("\r\n\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.0 200");
  EXPECT_EQ(got.substr(got.find("\r\n\r\n") + 4), expected_pieces(50));
}

TEST(HttpStream, AClientThatLeavesOrStopsReadingIsDroppedAndOthersAreServed) {
  StreamServer srv(/*backlog=*/256 << 10, /*pieces_bytes=*/1000);
  const int port = srv.server->port();
  {
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    // Never reads: 20 MB cannot fit the socket buffers and the 256 KiB backlog.
    net::write(sock, net::buffer(std::string("GET /stream?n=20000 HTTP/1.1\r\nHost: x\r\n\r\n")));
    for (int i = 0; i < 200 && !srv.producer_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    EXPECT_TRUE(srv.producer_done.load()) << "the producer was held by a client that does not read";
    EXPECT_GT(srv.refused.load(), 0);
    EXPECT_EQ(testing::http_request(port, "GET", "/plain").body, "plain");
  }
  for (int i = 0; i < 200 && srv.server->in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(srv.server->in_flight(), 0);
}

}  // namespace
}  // namespace kiln::serving
