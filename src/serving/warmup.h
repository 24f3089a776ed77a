#pragma once
// Warm-up, as TensorFlow Serving does it: a version's
// assets.extra/tf_serving_warmup_requests (a TFRecord file of PredictionLog protos,
// predict/classify/regress logs) is replayed before the version takes traffic. A bad
// file or a failing request fails the version (it never serves). At most 1000 records.
#include <string>

#include "kiln/serving/model_manager.h"

namespace kiln::serving {

inline constexpr const char* kWarmupFile = "tf_serving_warmup_requests";
inline constexpr int kMaxWarmupRecords = 1000;

// Returns the number of requests replayed (0 without a warm-up file).
int run_warmup(const Servable& s);

}  // namespace kiln::serving
