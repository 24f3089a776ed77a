// Learning-rate schedules at several steps, against hand-computed values.
#include <cmath>

#include "kiln/train/schedules.h"
#include "test_util.h"

namespace kiln::train {
namespace {

TEST(ScheduleTest, Constant) {
  auto s = schedules::Constant(0.3);
  EXPECT_DOUBLE_EQ((*s)(0), 0.3);
  EXPECT_DOUBLE_EQ((*s)(123456), 0.3);
}

TEST(ScheduleTest, StepDecay) {
  auto s = schedules::StepDecay(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ((*s)(0), 1.0);
  EXPECT_DOUBLE_EQ((*s)(9), 1.0);
  EXPECT_DOUBLE_EQ((*s)(10), 0.5);
  EXPECT_DOUBLE_EQ((*s)(25), 0.25);
  EXPECT_DOUBLE_EQ((*schedules::StepDecay(0.2, 3))(7), 0.2 * 0.01);  // default gamma 0.1
}

TEST(ScheduleTest, PiecewiseConstant) {
  auto s = schedules::PiecewiseConstant({10, 20}, {1.0, 0.5, 0.1});
  EXPECT_DOUBLE_EQ((*s)(0), 1.0);
  EXPECT_DOUBLE_EQ((*s)(9), 1.0);
  EXPECT_DOUBLE_EQ((*s)(10), 0.5);
  EXPECT_DOUBLE_EQ((*s)(19), 0.5);
  EXPECT_DOUBLE_EQ((*s)(20), 0.1);
  EXPECT_DOUBLE_EQ((*s)(1000), 0.1);
  EXPECT_DOUBLE_EQ((*schedules::PiecewiseConstant({}, {0.7}))(5), 0.7);
}

TEST(ScheduleTest, ExponentialDecay) {
  auto s = schedules::ExponentialDecay(0.1, 100, 0.5);
  EXPECT_DOUBLE_EQ((*s)(0), 0.1);
  EXPECT_NEAR((*s)(50), 0.1 * 0.70710678118654752, 1e-15);  // 0.1 * 0.5^0.5
  EXPECT_NEAR((*s)(200), 0.025, 1e-15);
  auto st = schedules::ExponentialDecay(0.1, 100, 0.5, true);
  EXPECT_DOUBLE_EQ((*st)(50), 0.1);
  EXPECT_DOUBLE_EQ((*st)(99), 0.1);
  EXPECT_DOUBLE_EQ((*st)(100), 0.05);
  EXPECT_DOUBLE_EQ((*st)(250), 0.025);
}

TEST(ScheduleTest, CosineDecay) {
  // 0.1 + 0.9 * 0.5 * (1 + cos(pi * step / 100)), constant after step 100.
  auto s = schedules::CosineDecay(1.0, 100, 0.1);
  EXPECT_NEAR((*s)(0), 1.0, 1e-15);
  EXPECT_NEAR((*s)(25), 0.1 + 0.9 * 0.5 * (1 + 0.70710678118654752), 1e-15);
  EXPECT_NEAR((*s)(50), 0.55, 1e-15);
  EXPECT_NEAR((*s)(100), 0.1, 1e-15);
  EXPECT_NEAR((*s)(5000), 0.1, 1e-15);
}

TEST(ScheduleTest, CosineDecayWithWarmup) {
  // Linear 0 -> 2 over 10 steps, then cosine from 2 to 0 over 100 steps.
  auto s = schedules::CosineDecay(2.0, 100, 0, 10);
  EXPECT_DOUBLE_EQ((*s)(0), 0.0);
  EXPECT_DOUBLE_EQ((*s)(5), 1.0);
  EXPECT_NEAR((*s)(10), 2.0, 1e-15);
  EXPECT_NEAR((*s)(60), 1.0, 1e-15);
  EXPECT_NEAR((*s)(110), 0.0, 1e-15);
  EXPECT_NEAR((*s)(1000), 0.0, 1e-15);
}

TEST(ScheduleTest, Errors) {
  EXPECT_KILN_ERROR(schedules::StepDecay(1, 0), kInvalidArgument, "step_size");
  EXPECT_KILN_ERROR(schedules::ExponentialDecay(1, 0, 0.5), kInvalidArgument, "decay_steps");
  EXPECT_KILN_ERROR(schedules::CosineDecay(1, -1), kInvalidArgument, "decay_steps");
  EXPECT_KILN_ERROR(schedules::CosineDecay(1, 10, 0, -1), kInvalidArgument, "warmup_steps");
  EXPECT_KILN_ERROR(schedules::PiecewiseConstant({10}, {1.0}), kInvalidArgument, "one more");
  EXPECT_KILN_ERROR(schedules::PiecewiseConstant({10, 10}, {1.0, 2.0, 3.0}), kInvalidArgument, "increasing");
}

}  // namespace
}  // namespace kiln::train
