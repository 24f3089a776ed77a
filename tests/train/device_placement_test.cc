// CompileOptions::device and DeviceScope: where weights, slots and batches live. The
// CPU split into two logical devices stands in for a GPU here (the same placement
// code runs for cuda:N; kiln_cuda_tests covers the device itself).
#include "core/device_config_internal.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/train/device_scope.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "test_util.h"

namespace kiln::train {
namespace {

const Device kCpu1{DeviceType::kCPU, 1};

class DevicePlacement : public ::testing::Test {
 protected:
  void SetUp() override {
    config::internal::reset_for_testing();
    config::set_logical_device_configuration(Device::cpu(), {{0}, {0}});
  }
  void TearDown() override { config::internal::reset_for_testing(); }
};

TEST_F(DevicePlacement, ScopeDecidesWhereNewWeightsGo) {
  EXPECT_EQ(DeviceScope::current(), Device::cpu());
  auto dense = layers::Dense(3);
  {
    DeviceScope scope(kCpu1);
    EXPECT_EQ(DeviceScope::current(), kCpu1);
    {
      DeviceScope inner(Device::cpu());
      EXPECT_EQ(DeviceScope::current(), Device::cpu());
    }
    EXPECT_EQ(DeviceScope::current(), kCpu1);
    (*dense)({ops::ones({2, 4})}, false);  // builds the layer
  }
  EXPECT_EQ(DeviceScope::current(), Device::cpu());
  ASSERT_EQ(dense->weights().size(), 2u);
  for (const Variable& v : dense->weights()) EXPECT_EQ(v.peek().device(), kCpu1) << v.name();
}

TEST_F(DevicePlacement, ModelTrainsOnItsDevice) {
  set_seed(3);
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(8, "relu"), layers::Dense(3)}, Shape{4});
  CompileOptions co{optimizers::Adam({0.05}), {losses::SparseCategoricalCrossentropy(true)}, {}};
  co.device = "cpu:1";
  m->compile(co);
  Tensor x = kiln::testing::rand_tensor({32, 4}, DType::kF32, -1, 1, 5);
  Tensor y = Tensor::from_vector<int32_t>(std::vector<int32_t>(32, 2), {32});
  History h = m->fit(x, y, {.epochs = 3, .batch_size = 8, .verbose = 0});
  EXPECT_LT(h.history.at("loss").back(), h.history.at("loss").front());
  for (const Variable& v : m->weights()) EXPECT_EQ(v.peek().device(), kCpu1) << v.name();
  for (const Variable& v : m->optimizer()->variables()) EXPECT_EQ(v.peek().device(), kCpu1) << v.name();
  EXPECT_GT(m->traced_steps(), 0);
  // Predictions come back to the host's first device.
  EXPECT_EQ(m->predict(std::vector<Tensor>{x}, 16).at(0).device(), Device::cpu());
  // Recompiling for cpu:0 moves the trained weights back, values intact.
  const Tensor w0 = m->weights()[0].peek().clone();
  co.device = "cpu";
  m->compile(co);
  EXPECT_EQ(m->weights()[0].peek().device(), Device::cpu());
  EXPECT_TRUE(array_equal(m->weights()[0].peek(), w0));
}

TEST_F(DevicePlacement, CompileRefusesDevicesThatAreNotThere) {
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(2)}, Shape{4});
  CompileOptions co{optimizers::SGD(), {losses::MeanSquaredError()}, {}};
  co.device = "tpu:0";
  EXPECT_KILN_ERROR(m->compile(co), kInvalidArgument, "unknown device 'tpu:0'");
  co.device = "cuda:9";
  EXPECT_KILN_ERROR(m->compile(co), kNotFound, "cuda");
  co.device = "cpu:7";
  EXPECT_KILN_ERROR(m->compile(co), kNotFound, "cpu:7 does not exist");
}

}  // namespace
}  // namespace kiln::train
