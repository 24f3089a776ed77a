#pragma once
// Test packages and a blocking HTTP client for the serving tests.
#include <string>

#include "kiln/core/tensor.h"
#include "test_util.h"

namespace kiln::serving::testing {

// Exports a small MLP package (x: f32[-1, 4] -> probs: f32[-1, 3]) with signatures
// serving_default (predict), classify (scores, classes: i64[-1, 3] class ids), regress
// (outputs: f32[-1]) as <base>/<version>. `seed` changes the weights: versions differ.
std::string export_test_model(const std::string& base, int64_t version, uint64_t seed = 1);
// What the test model computes for x [N, 4] (eager reference).
Tensor test_model_probs(const Tensor& x, uint64_t seed = 1);

struct HttpResult {
  int status = 0;
  std::string body;
};
// One request on a fresh connection to 127.0.0.1:port.
HttpResult http_request(int port, const std::string& method, const std::string& target, const std::string& body = "",
                        const std::string& extra_headers = "");

}  // namespace kiln::serving::testing
