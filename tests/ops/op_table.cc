#include "op_table.h"

#include <sys/stat.h>

namespace kiln::testing {
namespace {
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::vector<Tensor> load_series(const std::string& family, const std::string& name, const char* kind) {
  std::vector<Tensor> v;
  for (int k = 0;; ++k) {
    std::string rel = family + "/" + name + "." + kind + std::to_string(k) + ".npy";
    if (!exists(fixture(rel))) break;
    v.push_back(load(rel));
  }
  return v;
}
Tensor cast_floating(const Tensor& t, DType dt) { return is_floating(t.dtype()) ? ops::cast(t, dt) : t; }
}  // namespace

std::vector<Tensor> load_inputs(const std::string& family, const std::string& name) {
  return load_series(family, name, "in");
}
std::vector<Tensor> load_outputs(const std::string& family, const std::string& name) {
  return load_series(family, name, "out");
}

void run_op_case(const std::string& family, const OpCase& c) {
  SCOPED_TRACE("case " + family + "/" + c.name);
  std::vector<Tensor> in = load_inputs(family, c.name);
  std::vector<Tensor> ref = load_outputs(family, c.name);
  ASSERT_FALSE(ref.empty()) << "no fixture outputs for " << family << "/" << c.name
                            << " (run scripts/fixtures/gen_" << family << ".py)";
  for (DType dt : c.dtypes) {
    SCOPED_TRACE(std::string("dtype ") + std::string(dtype_name(dt)));
    std::vector<Tensor> args, expected;
    if (dt == DType::kF16 || dt == DType::kBF16) {
      for (auto& t : in) args.push_back(cast_floating(t, dt));
      std::vector<Tensor> widened;
      for (auto& t : args) widened.push_back(cast_floating(t, DType::kF32));
      expected = c.fn(widened);
    } else {
      for (auto& t : in) args.push_back(cast_floating(t, dt));
      expected = ref;
    }
    std::vector<Tensor> got = c.fn(args);
    ASSERT_EQ(got.size(), expected.size());
    Tol tol = tol_for(dt);
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE("output " + std::to_string(k));
      ASSERT_EQ(got[k].shape(), expected[k].shape()) << got[k].desc() << " vs " << expected[k].desc();
      if (is_floating(got[k].dtype())) {
        if (is_floating(dt)) {
          EXPECT_EQ(got[k].dtype(), dt) << "output dtype should follow the input dtype";
        }
        EXPECT_CLOSE(got[k], expected[k], tol.rtol * c.rtol_scale, tol.atol * c.rtol_scale);
      } else {
        EXPECT_CLOSE(got[k], expected[k], 0, 0);
      }
    }
  }
}

}  // namespace kiln::testing
