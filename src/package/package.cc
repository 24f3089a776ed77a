// Package-wide helpers: SHA-256, version directories, tensor specs.
#include "kiln/package/package.h"

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/package/saved_model.h"
#include "kiln/package/tf_saved_model.h"

namespace kiln::package {
namespace fs = std::filesystem;

std::string sha256_hex(const void* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr) != 1) throw InternalError("sha256: OpenSSL EVP_Digest failed");
  static const char* kHex = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 15];
  }
  return out;
}

std::string sha256_file(const std::string& path) {
  auto f = MappedFile::open(path);
  return sha256_hex(f->data(), f->size());
}

namespace {
// Canonical positive decimals only ("7", not "07" or "+7"), as TensorFlow Serving.
std::optional<int64_t> version_of(const std::string& name) {
  if (name.empty() || name.size() > 18 || name[0] == '0') return std::nullopt;
  int64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}
}  // namespace

std::vector<int64_t> list_versions(const std::string& base) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    if (auto v = version_of(it->path().filename().string())) out.push_back(*v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve_version_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kManifestFile, ec) || is_tf_saved_model(dir)) return dir;
  if (!fs::is_directory(dir, ec)) throw NotFoundError("no model package at " + dir + ": no such directory");
  auto versions = list_versions(dir);
  if (versions.empty())
    throw NotFoundError("no model package at " + dir + ": no " + kManifestFile + ", no " + kTfSavedModelFile +
                        " and no numeric version directories");
  return (fs::path(dir) / std::to_string(versions.back())).string();
}

std::string spec_str(const TensorSpec& spec) {
  std::string s = std::string(dtype_name(spec.dtype)) + "[";
  for (size_t d = 0; d < spec.shape.size(); ++d) s += (d ? ", " : "") + std::to_string(spec.shape[d]);
  return s + "]";
}

void check_spec(const Tensor& t, const TensorSpec& spec, const std::string& what) {
  if (!t.defined()) throw InvalidArgumentError(what + " is undefined");
  bool ok = t.dtype() == spec.dtype && t.rank() == static_cast<int>(spec.shape.size());
  for (int d = 0; ok && d < t.rank(); ++d)
    ok = spec.shape[static_cast<size_t>(d)] < 0 || spec.shape[static_cast<size_t>(d)] == t.dim(d);
  if (!ok) throw InvalidArgumentError(what + " must be " + spec_str(spec) + ", got " + t.desc());
}

}  // namespace kiln::package
