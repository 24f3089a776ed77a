#include "rest_api.h"

#include <charconv>

#include "json_codec.h"
#include "kiln/core/error.h"

namespace kiln::serving {

// The dashboard page (dashboard.html, embedded by the build: dashboard_html.cc.in).
extern const char kDashboardHtml[];


namespace {

struct Route {
  std::string model;
  std::optional<int64_t> version;
  std::string label;
  std::string verb;  // predict | classify | regress (POST)
  bool metadata = false;
};

std::string percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v = 0;
  if (s.empty()) return std::nullopt;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata|:verb]
std::optional<Route> parse_route(std::string_view path) {
  constexpr std::string_view kPrefix = "/v1/models/";
  if (path.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view rest = path.substr(kPrefix.size());
  Route r;
  auto colon = rest.rfind(':');
  if (colon != std::string_view::npos && rest.find('/', colon) == std::string_view::npos) {
    r.verb = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
  }
  std::vector<std::string_view> seg;
  while (!rest.empty()) {
    auto p = rest.find('/');
    seg.push_back(rest.substr(0, p));
    if (p == std::string_view::npos) break;
    rest = rest.substr(p + 1);
  }
  if (seg.empty() || seg[0].empty()) return std::nullopt;
  r.model = percent_decode(seg[0]);
  size_t i = 1;
  if (i < seg.size() && (seg[i] == "versions" || seg[i] == "labels")) {
    if (i + 1 >= seg.size()) return std::nullopt;
    if (seg[i] == "versions") {
      r.version = parse_int(seg[i + 1]);
      if (!r.version) return std::nullopt;
    } else {
      r.label = percent_decode(seg[i + 1]);
    }
    i += 2;
  }
  if (i < seg.size()) {
    if (seg[i] != "metadata" || i + 1 != seg.size() || !r.verb.empty()) return std::nullopt;
    r.metadata = true;
  }
  return r;
}

HttpResponse json_error(Code code, std::string_view message) {
  return HttpResponse{http_status(code), "application/json", json::encode_error(message)};
}

class RestApi {
 public:
  RestApi(Service& svc, RestOptions opts) : svc_(svc), opts_(std::move(opts)) {}

  void handle(HttpRequest&& req, Responder respond) {
    const auto start = Clock::now();
    std::string_view target = req.target;
    auto q = target.find('?');
    std::string_view path = target.substr(0, q);

    if (path == "/healthz") return respond({200, "application/json", "{\"status\": \"alive\"}"});
    if (path == "/readyz") {
      if (svc_.manager().ready()) return respond({200, "application/json", "{\"status\": \"ready\"}"});
      std::string waiting;
      for (auto& name : svc_.manager().model_names()) {
        bool ok = false;
        try {
          for (auto& v : svc_.manager().status(name)) ok = ok || v.state == VersionState::kAvailable;
        } catch (...) {
        }
        if (!ok) waiting += (waiting.empty() ? "" : ", ") + name;
      }
      return respond(json_error(Code::kUnavailable, "not ready: no available version of " +
                                                        (waiting.empty() ? std::string("any model (none configured)") : waiting)));
    }
    if (path == "/dashboard" || path == "/dashboard/") {
      if (req.method != "GET") return respond(json_error(Code::kUnimplemented, "dashboard: use GET"));
      return respond({200, "text/html; charset=utf-8", kDashboardHtml});
    }
    if (opts_.metrics_enabled && (path == "/metrics" || path == opts_.metrics_path)) {
      if (req.method != "GET") return respond(json_error(Code::kUnimplemented, "metrics: use GET"));
      return respond({200, "text/plain; version=0.0.4; charset=utf-8", svc_.metrics().render()});
    }
    // As TF Serving: unknown paths are 404; a /v1/ request that does not parse is a
    // malformed request, 400.
    auto route = parse_route(path);
    if (!route)
      return respond({path.substr(0, 4) == "/v1/" ? 400 : 404, "application/json",
                      json::encode_error("Malformed request: " + req.method + " " + std::string(path))});
    Route& r = *route;

    Clock::time_point deadline;
    try {
      deadline = request_deadline(req, start);
    } catch (const InvalidArgumentError& e) {
      return respond(json_error(Code::kInvalidArgument, e.message()));
    }

    if (req.method == "GET") {
      if (!r.verb.empty())
        return respond(json_error(Code::kInvalidArgument, "Malformed request: GET with :" + r.verb + " (use POST)"));
      return r.metadata ? metadata(r, respond) : status(r, respond);
    }
    if (req.method != "POST")
      return respond(json_error(Code::kInvalidArgument, "Malformed request: " + req.method + " " + std::string(path)));
    if (r.verb != "predict" && r.verb != "classify" && r.verb != "regress")
      return respond(json_error(Code::kInvalidArgument,
                                "Malformed request: POST " + std::string(path) +
                                    (r.verb.empty() ? " (expected :predict, :classify or :regress)" : "")));
    infer(r, std::move(req.body), deadline, start, std::move(respond), std::move(req.cancelled));
  }

 private:
  void status(const Route& r, const Responder& respond) {
    try {
      auto all = svc_.manager().status(r.model);
      std::optional<int64_t> want = r.version;
      if (!r.label.empty()) {
        bool found = false;
        for (auto& c : svc_.manager().config())
          if (c.name == r.model) {
            auto it = c.labels.find(r.label);
            if (it != c.labels.end()) {
              want = it->second;
              found = true;
            }
          }
        if (!found) throw InvalidArgumentError("Unrecognized servable version label: '" + r.label + "'");
      }
      if (want) {
        std::vector<VersionStatus> one;
        for (auto& v : all)
          if (v.version == *want) one.push_back(v);
        if (one.empty())
          throw NotFoundError("Could not find version " + std::to_string(*want) + " of model " + r.model);
        all = std::move(one);
      }
      respond({200, "application/json", json::encode_status(all)});
    } catch (...) {
      auto st = status_of_current_exception();
      respond(json_error(st.code, st.message));
    }
  }

  void metadata(const Route& r, const Responder& respond) {
    try {
      auto s = svc_.resolve(ModelSpec{r.model, r.version, r.label, ""});
      respond({200, "application/json", json::encode_metadata(r.model, s->version(), s->model().signatures())});
    } catch (...) {
      auto st = status_of_current_exception();
      respond(json_error(st.code, st.message));
    }
  }

  void infer(const Route& r, std::string body, Clock::time_point deadline, Clock::time_point start,
             Responder respond, std::shared_ptr<std::atomic<bool>> cancelled) {
    std::shared_ptr<const Servable> servable;
    std::string model_label;
    auto fail = [&](const Status& st) {
      svc_.record(model_label, servable ? servable->version() : 0, "rest", r.verb, st.code,
                  std::chrono::duration<double>(Clock::now() - start).count());
      respond(json_error(st.code, st.message));
    };
    try {
      servable = svc_.resolve(ModelSpec{r.model, r.version, r.label, ""});
      model_label = r.model;
      if (r.verb == "predict") {
        auto decoded = json::decode_predict(body, [&](const std::string& name) -> const package::Signature& {
          return Service::signature(*servable, name);
        });
        const package::Signature* sig = &Service::signature(*servable, decoded.signature_name);
        const bool rows = decoded.row_format;
        servable->predict(sig->name, std::move(decoded.inputs), deadline,
                          [this, servable, sig, rows, respond, start, verb = r.verb](
                              const Status& st, TensorMap out, const BatchInfo& info) {
                            finish(*servable, verb, st, info, start, respond, [&] {
                              return json::encode_predict(*sig, out, rows);
                            });
                          },
                          cancelled);
        return;
      }
      auto ex = json::decode_examples(body);
      const bool classify = r.verb == "classify";
      const package::Signature* sig = &Service::signature(
          *servable, ex.signature_name, classify ? package::kClassifyMethod : package::kRegressMethod);
      TensorMap inputs = Service::examples_to_inputs(*sig, ex.examples, ex.has_context ? &ex.context : nullptr);
      servable->predict(sig->name, std::move(inputs), deadline,
                        [this, servable, sig, classify, respond, start, verb = r.verb](
                            const Status& st, TensorMap out, const BatchInfo& info) {
                          finish(*servable, verb, st, info, start, respond, [&] {
                            return classify ? json::encode_classify(Service::to_classes(*sig, out))
                                            : json::encode_regress(Service::to_regressions(*sig, out));
                          });
                        },
                        cancelled);
    } catch (...) {
      fail(status_of_current_exception());
    }
  }

  template <typename Encode>
  void finish(const Servable& s, const std::string& verb, Status st, const BatchInfo& info, Clock::time_point start,
              const Responder& respond, Encode&& encode) {
    HttpResponse res;
    if (st.ok()) {
      try {
        res.body = encode();
      } catch (...) {
        st = status_of_current_exception();
      }
    }
    if (!st.ok()) res = json_error(st.code, st.message);
    svc_.record(s.model_name(), s.version(), "rest", verb, st.code,
                std::chrono::duration<double>(Clock::now() - start).count(), &info);
    respond(std::move(res));
  }

  Service& svc_;
  RestOptions opts_;
};

}  // namespace

HttpHandler make_rest_handler(Service& svc, RestOptions opts) {
  auto api = std::make_shared<RestApi>(svc, std::move(opts));
  return [api](HttpRequest&& req, Responder respond) { api->handle(std::move(req), std::move(respond)); };
}

}  // namespace kiln::serving
