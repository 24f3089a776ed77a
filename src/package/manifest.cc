// manifest.json: the package's format, versions, producer and file checksums.
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "package_internal.h"

namespace kiln::package::internal {
using Json = nlohmann::ordered_json;

std::string manifest_json(const Manifest& m) {
  Json j;
  j["format"] = m.format;
  j["format_version"] = m.format_version;
  j["min_consumer_version"] = m.min_consumer_version;
  j["producer"] = m.producer;
  Json files = Json::array();
  for (const ManifestFile& f : m.files) files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  j["files"] = files;
  return j.dump(2) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& source) {
  auto bad = [&](const std::string& why) -> DataLossError { return DataLossError(source + " is corrupted: " + why); };
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad("not valid JSON");
  if (!j.is_object()) throw bad("not a JSON object");
  auto field = [&](const char* name, Json::value_t type) -> const Json& {
    auto it = j.find(name);
    if (it == j.end()) throw bad(std::string("no '") + name + "' field");
    const bool ok = it->type() == type ||
                    (type == Json::value_t::number_integer && it->type() == Json::value_t::number_unsigned);
    if (!ok) throw bad(std::string("'") + name + "' has the wrong type: " + it->dump());
    return *it;
  };
  Manifest m;
  m.format = field("format", Json::value_t::string).get<std::string>();
  m.format_version = field("format_version", Json::value_t::number_integer).get<int>();
  m.min_consumer_version = field("min_consumer_version", Json::value_t::number_integer).get<int>();
  m.producer = field("producer", Json::value_t::string).get<std::string>();
  for (const Json& f : field("files", Json::value_t::array)) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string())
      throw bad("a 'files' entry needs path (string), bytes (non-negative integer), sha256 (string): " + f.dump());
    ManifestFile mf{f["path"].get<std::string>(), f["bytes"].get<int64_t>(), f["sha256"].get<std::string>()};
    if (mf.bytes < 0) throw bad("file " + mf.path + " has a negative size");
    if (mf.sha256.size() != 64 || mf.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw bad("file " + mf.path + ": sha256 must be 64 lowercase hex digits");
    // Paths stay inside the version directory: relative, no '..', no empty parts.
    bool ok = !mf.path.empty() && mf.path[0] != '/' && mf.path.find('\\') == std::string::npos;
    for (size_t b = 0; ok && b <= mf.path.size();) {
      size_t e = mf.path.find('/', b);
      if (e == std::string::npos) e = mf.path.size();
      std::string_view part(mf.path.data() + b, e - b);
      ok = !part.empty() && part != "." && part != "..";
      b = e + 1;
    }
    if (!ok) throw bad("file path '" + mf.path + "' is not a relative path inside the package");
    m.files.push_back(std::move(mf));
  }
  return m;
}

}  // namespace kiln::package::internal
