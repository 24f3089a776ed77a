#pragma once
// Learning-rate schedules (keras.optimizers.schedules): the rate for an optimizer step
// (0-based count of applied updates).
#include <cstdint>
#include <memory>
#include <vector>

namespace kiln::train {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual double operator()(int64_t step) const = 0;
};
using SchedulePtr = std::shared_ptr<LearningRateSchedule>;

namespace schedules {
SchedulePtr Constant(double lr);
// lr * gamma^(floor(step / step_size)) (torch StepLR).
SchedulePtr StepDecay(double initial, int64_t step_size, double gamma = 0.1);
// values[i] while step < boundaries[i] (values has one more element).
SchedulePtr PiecewiseConstant(std::vector<int64_t> boundaries, std::vector<double> values);
// initial * rate^(step / decay_steps), floored exponent when staircase.
SchedulePtr ExponentialDecay(double initial, int64_t decay_steps, double decay_rate, bool staircase = false);
// Linear warmup from 0 to `initial` over warmup_steps, then cosine decay to
// alpha * initial over decay_steps (keras CosineDecay with warmup).
SchedulePtr CosineDecay(double initial, int64_t decay_steps, double alpha = 0, int64_t warmup_steps = 0);
}  // namespace schedules

}  // namespace kiln::train
