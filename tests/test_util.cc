#include "test_util.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/dtype.h"
#include "kiln/core/npy.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::testing {

std::string fixture(const std::string& rel) { return std::string(fixture_dir()) + "/" + rel; }

Tensor load(const std::string& rel) { return read_npy(fixture(rel)); }

Tol tol_for(DType t) {
  switch (t) {
    case DType::kF16: return {2e-3, 2e-3};
    case DType::kBF16: return {1.6e-2, 1.6e-2};
    case DType::kF32: return {2e-5, 1e-6};
    case DType::kF64: return {1e-10, 1e-12};
    default: return {0, 0};
  }
}

Tensor rand_tensor(const Shape& s, DType dt, double lo, double hi, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    auto b = Philox::block(seed, 0, i);
    v[i] = lo + (hi - lo) * uints_to_unit_double(b[0], b[1]);
  }
  return Tensor::from_vector<double>(v, s).to(dt);
}

TempDir::TempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("kiln_" + tag + ".XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  EXPECT_TRUE(f.good()) << "cannot write " << path;
}

const char* direct_conv_name(DirectConv d) {
  switch (d) {
    case DirectConv::kOff: return "off";
    case DirectConv::kAuto: return "auto";
    case DirectConv::kForceTile: return "force-tile";
  }
  return "?";
}

}  // namespace kiln::testing
