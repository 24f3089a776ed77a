// A package's numerics change only when its loader asks (issue: a server started with
// KILN_AUTO_MIXED_PRECISION=bf16 served bf16 results from an fp32 package). The
// environment variable is gone; LoadOptions::passes and `kiln serve
// --auto_mixed_precision` are the only ways.
#include <cstdlib>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/graph/graph.h"
#include "kiln/package/saved_model.h"
#include "kiln/serving/server.h"
#include "serving_test_util.h"

namespace kiln::serving {
namespace {

int nodes_in(const graph::Graph& g, DType t) {
  int n = 0;
  for (const graph::Node& node : g.nodes) n += node.kind == graph::NodeKind::kOp && node.outputs[0].dtype == t;
  return n;
}

TEST(PackageNumerics, OnlyTheLoaderChoosesMixedPrecision) {
  kiln::testing::TempDir dir("numerics");
  const std::string version = testing::export_test_model(dir.path(), 1, 3);
  ASSERT_EQ(setenv("KILN_AUTO_MIXED_PRECISION", "bf16", 1), 0);
  auto as_stored = package::SavedModel::load(version);
  unsetenv("KILN_AUTO_MIXED_PRECISION");
  EXPECT_EQ(nodes_in(as_stored->graph("serving_default"), DType::kBF16), 0);
  package::LoadOptions bf16;
  bf16.passes.auto_mixed_precision = DType::kBF16;
  auto mixed = package::SavedModel::load(version, bf16);
  EXPECT_GT(nodes_in(mixed->graph("serving_default"), DType::kBF16), 0);
}

TEST(PackageNumerics, ServerRejectsAnUnknownPrecision) {
  ServerOptions o;
  o.model_base_path = "/nonexistent";
  o.auto_mixed_precision = "fp8";
  o.quiet = true;
  o.port = o.rest_api_port = -1;
  Server s(o);
  EXPECT_KILN_ERROR(s.start(), kInvalidArgument, "--auto_mixed_precision must be off, bf16 or f16, got 'fp8'");
}

}  // namespace
}  // namespace kiln::serving
