#include "kiln/train/schedules.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "kiln/core/error.h"

namespace kiln::train::schedules {
namespace {
using kiln::detail::str_cat;

void require_positive(const char* schedule, const char* what, int64_t v) {
  if (v <= 0) throw InvalidArgumentError(str_cat(schedule, ": ", what, " must be > 0, got ", v));
}

class ConstantSchedule final : public LearningRateSchedule {
 public:
  explicit ConstantSchedule(double lr) : lr_(lr) {}
  double operator()(int64_t) const override { return lr_; }

 private:
  double lr_;
};

class StepDecaySchedule final : public LearningRateSchedule {
 public:
  StepDecaySchedule(double initial, int64_t step_size, double gamma)
      : initial_(initial), step_size_(step_size), gamma_(gamma) {}
  double operator()(int64_t step) const override {
    return initial_ * std::pow(gamma_, static_cast<double>(std::max<int64_t>(step, 0) / step_size_));
  }

 private:
  double initial_;
  int64_t step_size_;
  double gamma_;
};

class PiecewiseConstantSchedule final : public LearningRateSchedule {
 public:
  PiecewiseConstantSchedule(std::vector<int64_t> boundaries, std::vector<double> values)
      : boundaries_(std::move(boundaries)), values_(std::move(values)) {}
  double operator()(int64_t step) const override {
    size_t i = 0;
    while (i < boundaries_.size() && step >= boundaries_[i]) ++i;
    return values_[i];
  }

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

class ExponentialDecaySchedule final : public LearningRateSchedule {
 public:
  ExponentialDecaySchedule(double initial, int64_t decay_steps, double rate, bool staircase)
      : initial_(initial), decay_steps_(decay_steps), rate_(rate), staircase_(staircase) {}
  double operator()(int64_t step) const override {
    double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
    if (staircase_) p = std::floor(p);
    return initial_ * std::pow(rate_, p);
  }

 private:
  double initial_;
  int64_t decay_steps_;
  double rate_;
  bool staircase_;
};

// Keras CosineDecay with initial_learning_rate = 0 and warmup_target = initial when
// warmup_steps > 0 (otherwise plain cosine decay from initial).
class CosineDecaySchedule final : public LearningRateSchedule {
 public:
  CosineDecaySchedule(double initial, int64_t decay_steps, double alpha, int64_t warmup_steps)
      : initial_(initial), decay_steps_(decay_steps), alpha_(alpha), warmup_(warmup_steps) {}
  double operator()(int64_t step) const override {
    double s = static_cast<double>(std::max<int64_t>(step, 0));
    const double warmup = static_cast<double>(warmup_), decay = static_cast<double>(decay_steps_);
    s = std::min(s, decay + warmup);
    if (s < warmup) return initial_ * s / warmup;
    const double fraction = (s - warmup) / decay;
    const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * fraction));
    return initial_ * ((1 - alpha_) * cosine + alpha_);
  }

 private:
  double initial_;
  int64_t decay_steps_;
  double alpha_;
  int64_t warmup_;
};

}  // namespace

SchedulePtr Constant(double lr) { return std::make_shared<ConstantSchedule>(lr); }

SchedulePtr StepDecay(double initial, int64_t step_size, double gamma) {
  require_positive("StepDecay", "step_size", step_size);
  return std::make_shared<StepDecaySchedule>(initial, step_size, gamma);
}

SchedulePtr PiecewiseConstant(std::vector<int64_t> boundaries, std::vector<double> values) {
  if (values.size() != boundaries.size() + 1)
    throw InvalidArgumentError(str_cat("PiecewiseConstant: values must have one more element than boundaries, got ",
                                       values.size(), " values for ", boundaries.size(), " boundaries"));
  for (size_t i = 1; i < boundaries.size(); ++i)
    if (boundaries[i] <= boundaries[i - 1])
      throw InvalidArgumentError(str_cat("PiecewiseConstant: boundaries must be strictly increasing, got ",
                                         boundaries[i - 1], " then ", boundaries[i], " at index ", i));
  return std::make_shared<PiecewiseConstantSchedule>(std::move(boundaries), std::move(values));
}

SchedulePtr ExponentialDecay(double initial, int64_t decay_steps, double decay_rate, bool staircase) {
  require_positive("ExponentialDecay", "decay_steps", decay_steps);
  return std::make_shared<ExponentialDecaySchedule>(initial, decay_steps, decay_rate, staircase);
}

SchedulePtr CosineDecay(double initial, int64_t decay_steps, double alpha, int64_t warmup_steps) {
  require_positive("CosineDecay", "decay_steps", decay_steps);
  if (warmup_steps < 0)
    throw InvalidArgumentError(str_cat("CosineDecay: warmup_steps must be >= 0, got ", warmup_steps));
  return std::make_shared<CosineDecaySchedule>(initial, decay_steps, alpha, warmup_steps);
}

}  // namespace kiln::train::schedules
