#pragma once
// TensorFlow Serving's REST API on top of HttpServer (docs/serving-api.md):
//   POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict | :classify | :regress
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            model status
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signatures
//   GET  /healthz (live), /readyz (every model has an available version)
//   GET  /metrics and the monitoring path (Prometheus text)
// Deadlines: header X-Request-Timeout-Ms or query parameter timeout_ms (504 when
// exceeded; the request is dropped, not run).
#include <string>

#include "http_server.h"
#include "service.h"

namespace kiln::serving {

struct RestOptions {
  std::string metrics_path = "/monitoring/prometheus/metrics";
  bool metrics_enabled = true;
};

// The handler to give HttpServer. `svc` must outlive the server.
HttpHandler make_rest_handler(Service& svc, RestOptions opts);

}  // namespace kiln::serving
