#pragma once
// Where new layer weights are created (tf.device for variables). Layers create their
// weights on DeviceScope::current(): cpu:0 outside any scope. Model::fit, evaluate and
// predict open one for CompileOptions::device, so a model built lazily by its first
// batch gets its weights (and its optimizer's slots, made like the weights) there.
//
// Thread-safety: the scope is per thread; scopes nest (the inner one wins until it ends).
#include "kiln/core/device.h"

namespace kiln {

class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  static Device current();

 private:
  Device previous_;
};

}  // namespace kiln
