#include "serving_test_util.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "kiln/ops.h"
#include "kiln/package/export.h"

namespace kiln::serving::testing {

namespace {

struct TestMlp {
  Variable w1, b1, w2;
  explicit TestMlp(uint64_t seed)
      : w1(kiln::testing::rand_tensor({4, 8}, DType::kF32, -1, 1, seed), "w1"),
        b1(kiln::testing::rand_tensor({8}, DType::kF32, -1, 1, seed + 100), "b1"),
        w2(kiln::testing::rand_tensor({8, 3}, DType::kF32, -1, 1, seed + 200), "w2") {}
  Tensor probs(const Tensor& x) const {
    Tensor h = ops::relu(ops::add(ops::matmul(x, w1.value()), b1.value()));
    return ops::softmax(ops::matmul(h, w2.value()), -1);
  }
};

}  // namespace

Tensor test_model_probs(const Tensor& x, uint64_t seed) { return TestMlp(seed).probs(x); }

std::string export_test_model(const std::string& base, int64_t version, uint64_t seed) {
  auto m = std::make_shared<TestMlp>(seed);
  using package::ExportSignature;
  ExportSignature predict;
  predict.fn = [m](const std::vector<Tensor>& x) { return std::vector<Tensor>{m->probs(x[0])}; };
  predict.inputs = {{"x", {{-1, 4}, DType::kF32}}};
  predict.output_names = {"probs"};
  ExportSignature classify = predict;
  classify.name = "classify";
  classify.method = package::kClassifyMethod;
  classify.fn = [m](const std::vector<Tensor>& x) {
    Tensor p = m->probs(x[0]);
    return std::vector<Tensor>{p, ops::argmax(p, -1)};
  };
  classify.output_names = {"scores", "classes"};
  ExportSignature regress = predict;
  regress.name = "regress";
  regress.method = package::kRegressMethod;
  regress.fn = [m](const std::vector<Tensor>& x) {
    Tensor w = Tensor::from_vector<float>({1, 2, 3}, Shape{3});
    return std::vector<Tensor>{ops::sum(ops::mul(m->probs(x[0]), w), {-1})};
  };
  regress.output_names = {"outputs"};
  package::ExportOptions opts;
  opts.version = version;
  opts.metadata.model_name = "test_mlp";
  return package::export_package(base, {predict, classify, regress}, opts);
}

HttpResult http_request(int port, const std::string& method, const std::string& target, const std::string& body,
                        const std::string& extra_headers) {
  namespace net = boost::asio;
  using tcp = net::ip::tcp;
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + extra_headers;
  if (method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  net::write(sock, net::buffer(req));
  boost::beast::flat_buffer buf;
  boost::beast::http::response<boost::beast::http::string_body> res;
  boost::beast::error_code ec;
  boost::beast::http::read(sock, buf, res, ec);
  if (ec) return {0, "read error: " + ec.message()};
  return {static_cast<int>(res.result_int()), res.body()};
}

}  // namespace kiln::serving::testing
