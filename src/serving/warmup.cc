#include "warmup.h"

#include <cstring>
#include <filesystem>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "service.h"
#include "package/tf_tensor_proto.h"
#include "tensorflow_serving/apis/prediction_log.pb.h"

namespace fs = std::filesystem;

namespace kiln::serving {

namespace {

uint64_t le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void replay(const Servable& s, const tensorflow::serving::PredictionLog& log) {
  using L = tensorflow::serving::PredictionLog;
  switch (log.log_type_case()) {
    case L::kPredictLog: {
      const auto& req = log.predict_log().request();
      const auto& sig = Service::signature(s, req.model_spec().signature_name());
      TensorMap inputs;
      for (auto& [name, proto] : req.inputs()) inputs.emplace(name, tf::tensor_from_proto(proto, "input '" + name + "'"));
      s.predict_sync(sig.name, std::move(inputs));
      return;
    }
    case L::kClassifyLog:
    case L::kRegressLog: {
      const bool classify = log.log_type_case() == L::kClassifyLog;
      const auto& spec = classify ? log.classify_log().request().model_spec() : log.regress_log().request().model_spec();
      const auto& input = classify ? log.classify_log().request().input() : log.regress_log().request().input();
      const auto& sig = Service::signature(s, spec.signature_name(),
                                           classify ? package::kClassifyMethod : package::kRegressMethod);
      const Service::Examples ex = Service::examples_of(input);
      s.predict_sync(sig.name, Service::examples_to_inputs(sig, ex.examples, ex.context ? &*ex.context : nullptr));
      return;
    }
    default:
      throw UnimplementedError("warm-up: only predict, classify and regress logs are supported");
  }
}

}  // namespace

int run_warmup(const Servable& s) {
  const fs::path path = fs::path(s.model().dir()) / package::kAssetsExtraDir / kWarmupFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return 0;
  const std::string data = read_file(path.string());
  const std::string where = "warm-up file " + path.string();
  size_t off = 0;
  int n = 0;
  while (off < data.size()) {
    if (n >= kMaxWarmupRecords)
      throw InvalidArgumentError(where + ": more than " + std::to_string(kMaxWarmupRecords) + " records");
    if (data.size() - off < 12) throw DataLossError(where + ": truncated record header at offset " + std::to_string(off));
    const uint64_t len = le64(data.data() + off);
    if (crc32c_mask(crc32c(data.data() + off, 8)) != le32(data.data() + off + 8))
      throw DataLossError(where + ": record at offset " + std::to_string(off) + ": length CRC mismatch");
    if (len > data.size() - off - 12 || data.size() - off - 12 - len < 4)
      throw DataLossError(where + ": record at offset " + std::to_string(off) + " is truncated");
    const char* payload = data.data() + off + 12;
    if (crc32c_mask(crc32c(payload, len)) != le32(payload + len))
      throw DataLossError(where + ": record at offset " + std::to_string(off) + ": data CRC mismatch");
    tensorflow::serving::PredictionLog log;
    if (!log.ParseFromArray(payload, static_cast<int>(len)))
      throw DataLossError(where + ": record " + std::to_string(n) + " is not a PredictionLog");
    try {
      replay(s, log);
    } catch (const std::exception& e) {
      auto st = status_of(e);
      throw_if_error({st.code, where + ": request " + std::to_string(n) + " failed: " + st.message});
    }
    off += 12 + len + 4;
    ++n;
  }
  return n;
}

}  // namespace kiln::serving
