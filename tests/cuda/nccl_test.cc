// NCCL wrappers (kiln/cuda/nccl.h): errors without a GPU; collectives on one.
#include "kiln/core/device.h"
#include "kiln/core/tensor.h"
#include "kiln/cuda/nccl.h"
#include "kiln/ops/creation.h"

#include "test_util.h"

namespace kiln {
namespace {

const Device kNcclGpu{DeviceType::kCUDA, 0};

bool nccl_have_gpu() {
  Backend* b = find_backend(DeviceType::kCUDA);
  return b && b->device_count() > 0;
}

TEST(Nccl, NeedsADevice) {
  if (nccl_have_gpu()) {
    EXPECT_KILN_ERROR(cuda::Communicator::for_devices({99}), kInvalidArgument, "no device cuda:99");
    return;
  }
  EXPECT_KILN_ERROR(cuda::Communicator::for_devices({0}), kFailedPrecondition, "NCCL needs a CUDA device");
  EXPECT_KILN_ERROR(cuda::UniqueId::create(), kFailedPrecondition, "NCCL needs a CUDA device");
}

TEST(Nccl, AllReduceAndBroadcastOnEveryGpu) {
  if (!nccl_have_gpu()) GTEST_SKIP() << "no CUDA device: " << find_backend(DeviceType::kCUDA)->no_device_reason();
  const int n = find_backend(DeviceType::kCUDA)->device_count();
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  auto comms = cuda::Communicator::for_devices(devices);
  ASSERT_EQ(static_cast<int>(comms.size()), n);
  std::vector<Tensor> t;
  for (int i = 0; i < n; ++i) t.push_back(ops::full({1000}, i + 1.0).to({DeviceType::kCUDA, i}));
  cuda::all_reduce(comms, t, cuda::ReduceOp::kSum);
  const float want = n * (n + 1) / 2.0f;
  for (int i = 0; i < n; ++i) EXPECT_CLOSE(t[i].to(Device::cpu()), ops::full({1000}, want), 0, 0);
  std::vector<Tensor> u;
  for (int i = 0; i < n; ++i) u.push_back(ops::full({10}, 7.0 * i).to({DeviceType::kCUDA, i}));
  cuda::broadcast(comms, u, n - 1);
  for (int i = 0; i < n; ++i) EXPECT_CLOSE(u[i].to(Device::cpu()), ops::full({10}, 7.0 * (n - 1)), 0, 0);
  // A tensor on the wrong device is refused.
  Tensor host = ops::ones({3});
  EXPECT_KILN_ERROR(comms[0].all_reduce(host), kInvalidArgument, "not on this communicator's device");
}

}  // namespace
}  // namespace kiln
