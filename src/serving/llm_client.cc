#include "kiln/serving/llm_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include <chrono>
#include <limits>

#include "kiln/core/error.h"

namespace kiln::serving {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using kiln::detail::str_cat;

namespace {

ErrorCode code_of_status(unsigned status) {
  switch (status) {
    case 400: return ErrorCode::kInvalidArgument;
    case 404: return ErrorCode::kNotFound;
    case 413:
    case 429: return ErrorCode::kResourceExhausted;
    case 499: return ErrorCode::kCancelled;
    case 501: return ErrorCode::kUnimplemented;
    case 503: return ErrorCode::kUnavailable;
    case 504: return ErrorCode::kDeadlineExceeded;
    default: return ErrorCode::kInternal;
  }
}

// {"error": {"message": ...}} or {"error": "..."}: the message, else the body itself.
std::string error_message(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(body).get(doc) == simdjson::SUCCESS) {
    std::string_view s;
    if (doc["error"]["message"].get(s) == simdjson::SUCCESS || doc["error"].get(s) == simdjson::SUCCESS) return std::string(s);
  }
  return body.substr(0, 500);
}

}  // namespace

LlmClientResult llm_stream(const std::string& url, const std::string& path, const std::string& body,
                           const std::function<void(std::string_view)>& on_text) {
  std::string_view rest = url;
  if (rest.substr(0, 7) == "http://") rest.remove_prefix(7);
  else if (rest.find("://") != std::string_view::npos)
    throw InvalidArgumentError("--server: only http:// URLs are supported, got '" + url + "'");
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  const std::string host(rest.substr(0, colon)), port(colon == std::string_view::npos ? "80" : rest.substr(colon + 1));
  if (host.empty()) throw InvalidArgumentError("--server: no host in '" + url + "'");

  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  net::io_context ioc;
  tcp::socket sock(ioc);
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(host, port, ec);
  if (!ec) net::connect(sock, endpoints, ec);
  if (ec) throw UnavailableError(str_cat("cannot reach ", url, ": ", ec.message()));
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, host);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  req.body() = body;
  req.prepare_payload();
  http::write(sock, req, ec);
  if (ec) throw UnavailableError(str_cat("sending to ", url, ": ", ec.message()));

  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // streams are long; errors are small
  http::read_header(sock, buf, parser, ec);
  if (ec) throw UnavailableError(str_cat("reading the answer of ", url, ": ", ec.message()));
  if (parser.get().result_int() != 200) {
    http::read(sock, buf, parser, ec);
    throw_error(code_of_status(parser.get().result_int()),
                str_cat(url, path, " answered ", parser.get().result_int(), ": ", error_message(parser.get().body())));
  }

  LlmClientResult r;
  std::string pending;
  simdjson::dom::parser json;
  auto event = [&](std::string_view data) {
    if (data == "[DONE]") return;
    simdjson::dom::element ev;
    if (json.parse(data.data(), data.size()).get(ev) != simdjson::SUCCESS)
      throw DataLossError(str_cat(url, " sent an event that is not JSON: ", data.substr(0, 200)));
    simdjson::dom::element err;
    if (ev["error"].get(err) == simdjson::SUCCESS) throw InternalError(str_cat(url, ": ", error_message(std::string(data))));
    simdjson::dom::array choices;
    if (ev["choices"].get(choices) == simdjson::SUCCESS && choices.size() > 0) {
      simdjson::dom::element c = choices.at(0).value_unsafe();
      std::string_view text, finish;
      if (c["text"].get(text) == simdjson::SUCCESS || c["delta"]["content"].get(text) == simdjson::SUCCESS) {
        if (!text.empty()) {
          if (r.text.empty()) r.first_text_seconds = since();
          r.text += text;
          if (on_text) on_text(text);
        }
      }
      if (c["finish_reason"].get(finish) == simdjson::SUCCESS) r.finish_reason = std::string(finish);
    }
    simdjson::dom::object usage;
    if (ev["usage"].get(usage) == simdjson::SUCCESS) {
      int64_t v = 0;
      if (usage["prompt_tokens"].get(v) == simdjson::SUCCESS) r.prompt_tokens = v;
      if (usage["completion_tokens"].get(v) == simdjson::SUCCESS) r.completion_tokens = v;
      if (usage["prompt_tokens_details"]["cached_tokens"].get(v) == simdjson::SUCCESS) r.cached_tokens = v;
    }
  };
  auto feed = [&](std::string_view bytes) {
    pending.append(bytes);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string_view block(pending.data(), end);
      size_t pos = 0;
      while (pos <= block.size()) {
        size_t nl = block.find('\n', pos);
        if (nl == std::string_view::npos) nl = block.size();
        std::string_view line = block.substr(pos, nl - pos);
        if (line.substr(0, 5) == "data:") {
          line.remove_prefix(5);
          if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
          event(line);
        }
        pos = nl + 1;
      }
      pending.erase(0, end + 2);
    }
  };
  if (parser.chunked()) {
    auto on_chunk = [&](uint64_t, beast::string_view data, beast::error_code&) -> size_t {
      feed(std::string_view(data.data(), data.size()));
      return data.size();
    };
    parser.on_chunk_body(on_chunk);  // kept by reference: lives until the read ends
    http::read(sock, buf, parser, ec);
  } else {
    http::read(sock, buf, parser, ec);
    if (!ec || ec == http::error::end_of_stream) feed(parser.get().body());
  }
  if (ec && ec != http::error::end_of_stream) throw UnavailableError(str_cat("reading the stream of ", url, ": ", ec.message()));
  r.seconds = since();
  return r;
}

}  // namespace kiln::serving
