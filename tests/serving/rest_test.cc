// The REST API end to end over loopback: predict (row and columnar), classify,
// regress, status, metadata, health, metrics; bad requests each get their code and
// message while the server keeps serving; keep-alive, pipelining, slow and truncated
// clients; deadlines.
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <simdjson.h>
#include <thread>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/version.h"
#include "kiln/serving/server.h"
#include "serving_test_util.h"

namespace kiln::serving {
namespace {
using kiln::testing::TempDir;
using testing::http_request;

class Rest : public ::testing::Test {
 protected:
  void start(ServerOptions o = {}) {
    testing::export_test_model(dir_.path(), 1, 3);
    o.model_name = "mlp";
    o.model_base_path = dir_.path();
    o.rest_api_port = 0;
    o.port = -1;
    o.rest_api_num_threads = 2;
    o.file_system_poll_wait_seconds = 0;
    o.quiet = true;
    server_ = std::make_unique<Server>(o);
    server_->start();
    port_ = server_->rest_port();
  }
  // Batching that waits 300 ms for a batch to fill: a request stays queued long enough
  // to pass its deadline or lose its client.
  void start_batched_slow() {
    std::string file = batching_dir_.file("batching.txt");
    kiln::testing::write_bytes(file, "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 300000 }\n");
    ServerOptions o;
    o.enable_batching = true;
    o.batching_parameters_file = file;
    start(o);
  }
  testing::HttpResult post(const std::string& target, const std::string& body, const std::string& headers = "") {
    return http_request(port_, "POST", target, body, headers);
  }
  testing::HttpResult get(const std::string& target) { return http_request(port_, "GET", target); }
  std::vector<double> predictions(const std::string& body) {
    simdjson::dom::parser p;
    std::vector<double> out;
    for (auto row : p.parse(body)["predictions"].get_array())
      for (auto v : row.get_array()) out.push_back(double(v));
    return out;
  }
  TempDir dir_{"rest"};
  TempDir batching_dir_{"rest"};  // outlives the server (declared before it)
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

const char* kTwoRows = R"({"instances": [[0.1, 0.2, 0.3, 0.4], [-1, 0.5, 0, 2]]})";

TEST_F(Rest, PredictRowAndColumnarMatchTheModel) {
  start();
  auto r = post("/v1/models/mlp:predict", kTwoRows);
  ASSERT_EQ(r.status, 200) << r.body;
  Tensor x = Tensor::from_vector<float>({0.1f, 0.2f, 0.3f, 0.4f, -1, 0.5f, 0, 2}, Shape{2, 4});
  auto want = testing::test_model_probs(x, 3).to_vector<float>();
  auto got = predictions(r.body);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
  auto c = post("/v1/models/mlp/versions/1:predict", R"({"inputs": {"x": [[0.1, 0.2, 0.3, 0.4], [-1, 0.5, 0, 2]]}})");
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_NE(c.body.find("\"outputs\""), std::string::npos) << c.body;
}

TEST_F(Rest, ClassifyRegressStatusMetadata) {
  start();
  auto c = post("/v1/models/mlp:classify",
                R"({"signature_name": "classify", "examples": [{"x": [0.1, 0.2, 0.3, 0.4]}, {"x": [1, 2, 3, 4]}]})");
  ASSERT_EQ(c.status, 200) << c.body;
  simdjson::dom::parser p;
  auto results = p.parse(c.body)["results"].get_array();
  ASSERT_EQ(results.size(), 2u);
  double sum = 0;
  for (auto cls : results.at(0).get_array()) sum += double(cls.get_array().at(1));
  EXPECT_NEAR(sum, 1.0, 1e-5);
  auto r = post("/v1/models/mlp:regress", R"({"signature_name": "regress", "examples": [{"x": [0.1, 0.2, 0.3, 0.4]}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto wrong = post("/v1/models/mlp:classify", R"({"examples": [{"x": [0.1, 0.2, 0.3, 0.4]}]})");
  EXPECT_EQ(wrong.status, 400);
  EXPECT_NE(wrong.body.find("not a classify one"), std::string::npos) << wrong.body;

  auto s = get("/v1/models/mlp");
  ASSERT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("AVAILABLE"), std::string::npos) << s.body;
  auto m = get("/v1/models/mlp/metadata");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("DT_FLOAT"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("tensorflow/serving/regress"), std::string::npos);
}

TEST_F(Rest, BadRequestsGetTheirCodesAndTheServerKeepsServing) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  start(o);
  struct Case {
    std::string target, body;
    int status;
    std::string message;
  };
  std::vector<Case> cases = {
      {"/v1/models/mlp:predict", "{\"instances\": [[1, 2,", 400, ""},
      {"/v1/models/mlp:predict", R"({"instances": [[1, 2, 3]]})", 400, "4"},
      {"/v1/models/mlp:predict", R"({"instances": [["a", 2, 3, 4]]})", 400, ""},
      {"/v1/models/nope:predict", kTwoRows, 404, "nope"},
      {"/v1/models/mlp/versions/9:predict", kTwoRows, 404, "version 9"},
      {"/v1/models/mlp/labels/beta:predict", kTwoRows, 400, "Unrecognized servable version label: 'beta'"},
      {"/v1/models/mlp:predict", R"({"signature_name": "zzz", "instances": [[1, 2, 3, 4]]})", 400,
       "zzz\\\" not found (model 'mlp'"},
      {"/v1/models/mlp:explode", kTwoRows, 400, "Malformed request"},
      {"/v2/whatever", "", 404, "Malformed request"},
      {"/v1/models/mlp:predict", std::string(5000, ' '), 413, "exceeds the limit"},
  };
  for (auto& c : cases) {
    auto r = post(c.target, c.body);
    EXPECT_EQ(r.status, c.status) << c.target << " " << c.body.substr(0, 40) << " -> " << r.body;
    EXPECT_NE(r.body.find("\"error\""), std::string::npos) << r.body;
    EXPECT_NE(r.body.find(c.message), std::string::npos) << r.body;
  }
  EXPECT_EQ(http_request(port_, "GET", "/v1/models/mlp:predict").status, 400);
  EXPECT_EQ(post("/v1/models/mlp:predict", kTwoRows).status, 200);
}

TEST_F(Rest, HealthReadinessAndMetrics) {
  start();
  EXPECT_EQ(get("/healthz").status, 200);
  EXPECT_EQ(get("/readyz").status, 200);
  ASSERT_EQ(post("/v1/models/mlp:predict", kTwoRows).status, 200);
  post("/v1/models/mlp:predict", "{");
  for (const char* path : {"/metrics", "/monitoring/prometheus/metrics"}) {
    auto m = get(path);
    ASSERT_EQ(m.status, 200);
    EXPECT_NE(m.body.find(R"(kiln_requests_total{model="mlp",version="1",api="rest",method="predict",code="OK"} 1)"),
              std::string::npos)
        << m.body.substr(0, 3000);
    EXPECT_NE(m.body.find("code=\"INVALID_ARGUMENT\""), std::string::npos);
    EXPECT_NE(m.body.find("kiln_request_latency_seconds_bucket"), std::string::npos);
    EXPECT_NE(m.body.find("process_resident_memory_bytes"), std::string::npos);
    EXPECT_NE(m.body.find("kiln_allocator_bytes_in_use{device=\"cpu:0\"}"), std::string::npos);
    EXPECT_NE(m.body.find(std::string("kiln_build_info{version=\"") + KILN_VERSION_STRING + "\",cpu_isa=\"" +
                          cpu_isa_name(cpu_isa()) + "\",cpu_isa_detected=\"" + cpu_isa_name(detected_cpu_isa()) +
                          "\"} 1"),
              std::string::npos);
    EXPECT_NE(m.body.find("kiln_model_load_seconds{model=\"mlp\",version=\"1\"}"), std::string::npos);
  }
}

TEST(RestReady, NotReadyWithoutVersions) {
  TempDir dir("rest");
  ServerOptions o;
  o.model_base_path = dir.path();
  o.rest_api_port = 0;
  o.port = -1;
  o.file_system_poll_wait_seconds = 0;
  o.quiet = true;
  Server s(o);
  s.start();
  auto r = http_request(s.rest_port(), "GET", "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("default"), std::string::npos) << r.body;
  EXPECT_EQ(http_request(s.rest_port(), "POST", "/v1/models/default:predict", kTwoRows).status, 503);
  EXPECT_EQ(http_request(s.rest_port(), "GET", "/healthz").status, 200);
}

namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string request_text(const std::string& body) {
  return "POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST_F(Rest, KeepAliveAndPipelinedRequestsAnswerInOrder) {
  start();
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
  // Three requests in one write: a good one, a bad one, a good one.
  std::string all = request_text(kTwoRows) + request_text("{") + request_text(kTwoRows);
  net::write(sock, net::buffer(all));
  std::string got;
  char buf[4096];
  boost::system::error_code ec;
  while (std::count(got.begin(), got.end(), '}') < 3 || got.find("HTTP/1.1 200", got.rfind("HTTP/1.1 400")) == std::string::npos) {
    size_t n = sock.read_some(net::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
  }
  size_t a = got.find("HTTP/1.1 200"), b = got.find("HTTP/1.1 400"), c = got.find("HTTP/1.1 200", b);
  ASSERT_NE(a, std::string::npos) << got;
  ASSERT_NE(b, std::string::npos) << got;
  ASSERT_NE(c, std::string::npos) << got;
  EXPECT_LT(a, b);
}

TEST_F(Rest, SlowAndTruncatedClientsAreCutOffWhileOthersAreServed) {
  ServerOptions o;
  o.rest_api_timeout_in_ms = 300;
  start(o);
  net::io_context ioc;
  // A client that sends half a header and stalls.
  tcp::socket slow(ioc);
  slow.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
  net::write(slow, net::buffer(std::string("POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\n")));
  // A client that promises 1000 bytes, sends 10 and closes.
  {
    tcp::socket trunc(ioc);
    trunc.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
    net::write(trunc, net::buffer(std::string(
                          "POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"instanc")));
  }
  EXPECT_EQ(post("/v1/models/mlp:predict", kTwoRows).status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  char c;
  boost::system::error_code ec;
  slow.read_some(net::buffer(&c, 1), ec);
  EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
  EXPECT_EQ(post("/v1/models/mlp:predict", kTwoRows).status, 200);
}

TEST_F(Rest, DeadlinesAnswer504WithoutRunning) {
  start_batched_slow();
  auto r = post("/v1/models/mlp:predict", kTwoRows, "X-Request-Timeout-Ms: 30\r\n");
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_NE(r.body.find("deadline"), std::string::npos) << r.body;
  auto q = post("/v1/models/mlp:predict?timeout_ms=abc", kTwoRows);
  EXPECT_EQ(q.status, 400) << q.body;
  EXPECT_EQ(post("/v1/models/mlp:predict?timeout_ms=5000", kTwoRows).status, 200);
}


TEST_F(Rest, ClientsThatLeaveAreCancelledAndNotRun) {
  start_batched_slow();
  {
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
    net::write(sock, net::buffer(request_text(kTwoRows)));
  }  // closed while the request waits for its batch
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto m = get("/metrics");
  EXPECT_NE(m.body.find(R"(kiln_requests_total{model="mlp",version="1",api="rest",method="predict",code="CANCELLED"} 1)"),
            std::string::npos)
      << m.body.substr(0, 2000);
  EXPECT_EQ(m.body.find("kiln_compute_seconds_count{model=\"mlp\"}"), std::string::npos) << "the model ran";
  EXPECT_EQ(post("/v1/models/mlp:predict", kTwoRows).status, 200);
}

}  // namespace
}  // namespace kiln::serving
