// Device configuration (kiln/core/device_config.h): memory limits in bytes and as a
// fraction, growth versus pre-allocation, logical devices with their own limits,
// resource-exhausted messages, freezing after first use, environment variables,
// visible devices, statistics.
#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"

#include <cmath>
#include <cstdlib>

#include "core/device_config_internal.h"
#include "test_util.h"

namespace kiln::config {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
const Device kCpu0{DeviceType::kCPU, 0};
const Device kCpu1{DeviceType::kCPU, 1};

const char* const kEnvVars[] = {"KILN_CPU_MEMORY_LIMIT", "KILN_MEMORY_GROWTH", "KILN_CPU_LOGICAL_DEVICES",
                                "KILN_VISIBLE_DEVICES", "KILN_CUDA_MEMORY_LIMIT", "KILN_CUDA_LOGICAL_DEVICES"};

// Every test starts from a fresh configuration (ctest runs each test in its own process
// anyway; this also makes a whole-binary run independent of earlier tests).
class DeviceConfig : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
  static void reset() {
    for (const char* v : kEnvVars) unsetenv(v);
    internal::reset_for_testing();
  }
};

Tensor bytes_on(int64_t n, const Device& d) { return Tensor::empty({n}, DType::kU8, d); }

int64_t cpu_memory() { return list_physical_devices(DeviceType::kCPU).at(0).properties.memory_bytes; }

// In a fresh process nothing may allocate a tensor before main: otherwise every setter
// would fail. The death test re-runs this binary with only this test ("threadsafe").
TEST(DeviceConfigStartup, NoTensorIsAllocatedBeforeMain) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(is_initialized(DeviceType::kCPU) ? 1 : 0), ::testing::ExitedWithCode(0), "");
}

TEST(MemoryAmount, ParsesBytesAndFractions) {
  EXPECT_EQ(parse_memory_amount("1048576", "x").bytes, 1048576);
  EXPECT_EQ(parse_memory_amount("512K", "x").bytes, 512 * 1024);
  EXPECT_EQ(parse_memory_amount(" 64MB ", "x").bytes, 64 * kMiB);
  EXPECT_EQ(parse_memory_amount("2GiB", "x").bytes, 2048 * kMiB);
  EXPECT_EQ(parse_memory_amount("1.5g", "x").bytes, 1536 * kMiB);
  EXPECT_EQ(parse_memory_amount("0", "x").bytes, 0);
  EXPECT_EQ(parse_memory_amount("0", "x").fraction, 0);
  EXPECT_DOUBLE_EQ(parse_memory_amount("0.7", "x").fraction, 0.7);
  EXPECT_DOUBLE_EQ(parse_memory_amount("70%", "x").fraction, 0.7);
  EXPECT_EQ(parse_memory_amount("0.7", "x").bytes, 0);
  EXPECT_EQ(parse_memory_amount("25%", "x").resolve(1000), 250);
  EXPECT_EQ(parse_memory_amount("3K", "x").resolve(1000), 3072);
  for (const char* bad : {"", "lots", "1.5", "-1", "5X", "150%", "0%", "1..2", "0.0", "G"})
    EXPECT_KILN_ERROR(parse_memory_amount(bad, "--memory-limit"), kInvalidArgument, "--memory-limit");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536 * kMiB), "1.5 GiB");
}

TEST_F(DeviceConfig, ListsTheHostAsOnePhysicalDevice) {
  auto all = list_physical_devices();
  ASSERT_EQ(all.size(), 1u);  // a build without CUDA
  EXPECT_EQ(all[0].device, kCpu0);
  EXPECT_TRUE(all[0].visible);
  EXPECT_GT(all[0].properties.memory_bytes, 64 * kMiB);
  EXPECT_FALSE(all[0].properties.name.empty());
  EXPECT_TRUE(list_physical_devices(DeviceType::kCUDA).empty());
  auto logical = list_logical_devices();
  ASSERT_EQ(logical.size(), 1u);
  EXPECT_EQ(logical[0].device, kCpu0);
  EXPECT_EQ(logical[0].memory_limit, 0);
  EXPECT_TRUE(logical[0].memory_growth);
  EXPECT_FALSE(logical[0].initialized);
  EXPECT_FALSE(is_initialized(DeviceType::kCPU));  // listing initializes nothing
  Tensor t = bytes_on(1000, kCpu0);
  EXPECT_TRUE(is_initialized(DeviceType::kCPU));
  EXPECT_TRUE(list_logical_devices()[0].initialized);
}

TEST_F(DeviceConfig, LimitInBytesGivesResourceExhaustedWithStats) {
  set_memory_limit(kCpu0, 4 * kMiB);
  EXPECT_EQ(get_memory_limit(kCpu0), 4 * kMiB);
  EXPECT_EQ(list_logical_devices()[0].memory_limit, 4 * kMiB);
  Tensor a = bytes_on(3 * kMiB, kCpu0);
  try {
    Tensor b = bytes_on(2 * kMiB, kCpu0);
    FAIL() << "expected ResourceExhaustedError";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    std::string m = e.what();
    for (const char* want : {"ResourceExhausted", "out of memory on device cpu:0", "limit 4.0 MiB", "memory growth on",
                             "cannot allocate 2097152 bytes", "in_use=3145728", "limit=4194304", "reserved=4194304",
                             "largest_free_block=1048576", "raise the device's memory limit"})
      EXPECT_NE(m.find(want), std::string::npos) << "'" << m << "' lacks '" << want << "'";
  }
  // The device stays usable: what fits still fits, and freeing makes room.
  Tensor c = bytes_on(kMiB / 2, kCpu0);
  a = Tensor();
  Tensor d = bytes_on(3 * kMiB, kCpu0);
  EXPECT_EQ(memory_stats(kCpu0).bytes_limit, 4 * kMiB);
}

TEST_F(DeviceConfig, LimitAsFraction) {
  const int64_t mem = cpu_memory();
  set_memory_fraction(kCpu0, 0.5);
  EXPECT_EQ(get_memory_limit(kCpu0), static_cast<int64_t>(std::floor(0.5 * static_cast<double>(mem))));
  EXPECT_EQ(memory_stats(kCpu0).bytes_limit, get_memory_limit(kCpu0));  // before initialization too
  EXPECT_KILN_ERROR(set_memory_fraction(kCpu0, 0), kInvalidArgument, "(0, 1]");
  EXPECT_KILN_ERROR(set_memory_fraction(kCpu0, 1.5), kInvalidArgument, "(0, 1]");
  EXPECT_KILN_ERROR(set_memory_limit(kCpu0, mem + 1), kInvalidArgument, "exceeds its memory");
  EXPECT_KILN_ERROR(set_memory_limit(kCpu0, -1), kInvalidArgument, "negative");
  Tensor t = bytes_on(1000, kCpu0);
  EXPECT_EQ(memory_stats(kCpu0).bytes_limit, static_cast<int64_t>(std::floor(0.5 * static_cast<double>(mem))));
}

TEST_F(DeviceConfig, EnvironmentFractionAndOverride) {
  setenv("KILN_CPU_MEMORY_LIMIT", "25%", 1);
  EXPECT_EQ(get_memory_limit(kCpu0), static_cast<int64_t>(std::floor(0.25 * static_cast<double>(cpu_memory()))));
  set_memory_limit(kCpu0, 8 * kMiB);  // API calls override the environment
  EXPECT_EQ(get_memory_limit(kCpu0), 8 * kMiB);
  internal::reset_for_testing();
  setenv("KILN_CPU_MEMORY_LIMIT", "6M", 1);
  setenv("KILN_MEMORY_GROWTH", "false", 1);
  Tensor t = bytes_on(1000, kCpu0);  // the environment is read at the first tensor too
  AllocatorStats s = memory_stats(kCpu0);
  EXPECT_EQ(s.bytes_limit, 6 * kMiB);
  EXPECT_EQ(s.bytes_reserved, 6 * kMiB);
  EXPECT_FALSE(get_memory_growth(kCpu0));
}

TEST_F(DeviceConfig, GrowthReservesOnDemandPreallocationReservesTheLimit) {
  set_memory_limit(kCpu0, 64 * kMiB);
  EXPECT_TRUE(get_memory_growth(kCpu0));
  {
    Tensor t = bytes_on(kMiB, kCpu0);
    AllocatorStats s = memory_stats(kCpu0);
    EXPECT_EQ(s.bytes_reserved, 2 * kMiB);  // the first 2 MiB region
    EXPECT_EQ(s.num_regions, 1);
  }
  internal::reset_for_testing();
  set_memory_limit(kCpu0, 64 * kMiB);
  set_memory_growth(kCpu0, false);
  EXPECT_FALSE(get_memory_growth(kCpu0));
  EXPECT_FALSE(list_logical_devices()[0].memory_growth);
  Tensor t = bytes_on(kMiB, kCpu0);
  AllocatorStats s = memory_stats(kCpu0);
  EXPECT_EQ(s.bytes_reserved, 64 * kMiB);
  EXPECT_EQ(s.num_regions, 1);
  EXPECT_EQ(s.largest_free_block, 63 * kMiB);
  // Without a limit, pre-allocation takes the default fraction of the device.
  internal::reset_for_testing();
  set_memory_growth(kCpu0, false);
  EXPECT_EQ(list_logical_devices()[0].memory_limit,
            static_cast<int64_t>(static_cast<double>(cpu_memory()) * kDefaultPreallocateFraction));
}

TEST_F(DeviceConfig, LogicalDevicesHaveTheirOwnLimits) {
  set_logical_device_configuration(kCpu0, {{8 * kMiB}, {4 * kMiB}});
  ASSERT_EQ(get_logical_device_configuration(kCpu0).size(), 2u);
  EXPECT_EQ(get_logical_device_configuration(kCpu0)[1].memory_limit, 4 * kMiB);
  auto logical = list_logical_devices();
  ASSERT_EQ(logical.size(), 2u);
  EXPECT_EQ(logical[1].device, kCpu1);
  EXPECT_EQ(logical[1].physical, kCpu0);
  EXPECT_EQ(logical[0].memory_limit, 8 * kMiB);
  EXPECT_EQ(logical[1].memory_limit, 4 * kMiB);
  EXPECT_EQ(backend_for(kCpu1).device_count(), 2);
  EXPECT_EQ(physical_index(kCpu1), 0);

  // A first big buffer takes one 4 MiB region (regions are not contiguous: with a small
  // 2 MiB region first, 3 MiB would no longer fit under the limit).
  Tensor big1 = bytes_on(3 * kMiB, kCpu1);
  // Tensors and op outputs live on cpu:1.
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).to(kCpu1);
  EXPECT_EQ(a.device(), kCpu1);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(ops::add(a, a).device(), kCpu1);
  EXPECT_EQ(ops::matmul(a, a).device(), kCpu1);
  EXPECT_EQ((a * 2.0).device(), kCpu1);  // the scalar is made on cpu:0: mixing CPU devices is fine
  EXPECT_EQ((2.0 * a).device(), kCpu1);  // outputs follow the largest input
  EXPECT_EQ((2.0 * a).to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(Tensor::zeros({3}, DType::kF32, kCpu1).clone().device(), kCpu1);
  EXPECT_TRUE(list_logical_devices()[1].initialized);

  // Exhaust cpu:1; cpu:0 is unaffected.
  EXPECT_KILN_ERROR(bytes_on(2 * kMiB, kCpu1), kResourceExhausted, "out of memory on device cpu:1 (limit 4.0 MiB");
  Tensor big0 = bytes_on(6 * kMiB, kCpu0);
  EXPECT_KILN_ERROR(big0.to(kCpu1), kResourceExhausted, "cannot allocate 6291456 bytes");
  EXPECT_GE(memory_stats(kCpu0).bytes_in_use, 6 * kMiB);
  EXPECT_LT(memory_stats(kCpu1).bytes_in_use, 4 * kMiB);
  EXPECT_GE(memory_stats(kCpu1).bytes_in_use, 3 * kMiB);
  EXPECT_EQ(memory_stats(kCpu1).bytes_limit, 4 * kMiB);
  EXPECT_KILN_ERROR(bytes_on(1, Device{DeviceType::kCPU, 2}), kNotFound, "cpu:2");
  EXPECT_KILN_ERROR(memory_stats(Device{DeviceType::kCPU, 2}), kNotFound, "2 logical cpu device(s)");
}

TEST_F(DeviceConfig, LogicalDevicesFromEnvironment) {
  setenv("KILN_CPU_LOGICAL_DEVICES", "4M, 2M,0.001", 1);
  auto logical = list_logical_devices();
  ASSERT_EQ(logical.size(), 3u);
  EXPECT_EQ(logical[0].memory_limit, 4 * kMiB);
  EXPECT_EQ(logical[1].memory_limit, 2 * kMiB);
  EXPECT_EQ(logical[2].memory_limit, static_cast<int64_t>(std::floor(0.001 * static_cast<double>(cpu_memory()))));
  set_logical_device_configuration(kCpu0, {});  // undoes the split
  EXPECT_EQ(list_logical_devices().size(), 1u);
}

TEST_F(DeviceConfig, InconsistentSettingsAreRejectedAtFirstUse) {
  set_logical_device_configuration(kCpu0, {{4 * kMiB}, {4 * kMiB}});
  set_memory_limit(kCpu0, 6 * kMiB);
  EXPECT_KILN_ERROR(list_logical_devices(), kInvalidArgument, "more than its memory limit");
  EXPECT_KILN_ERROR(bytes_on(10, kCpu0), kInvalidArgument, "more than its memory limit");
  set_memory_limit(kCpu0, 0);
  set_logical_device_configuration(kCpu0, {{0}, {0}});  // two unlimited devices, growing
  EXPECT_EQ(list_logical_devices().size(), 2u);
  set_memory_growth(kCpu0, false);
  EXPECT_KILN_ERROR(list_logical_devices(), kInvalidArgument, "need a memory limit each when memory growth is off");
  EXPECT_KILN_ERROR(set_logical_device_configuration(kCpu0, {{-1}}), kInvalidArgument, "negative");
  set_logical_device_configuration(kCpu0, {{cpu_memory()}, {cpu_memory()}});
  EXPECT_KILN_ERROR(list_logical_devices(), kInvalidArgument, "more than its memory");
}

TEST_F(DeviceConfig, SettersAfterInitializationAreFailedPrecondition) {
  Tensor t = bytes_on(100, kCpu0);
  const char* msg = "cannot be changed after device cpu:0 was initialized";
  EXPECT_KILN_ERROR(set_memory_growth(kCpu0, false), kFailedPrecondition, msg);
  EXPECT_KILN_ERROR(set_memory_limit(kCpu0, 8 * kMiB), kFailedPrecondition, msg);
  EXPECT_KILN_ERROR(set_memory_fraction(kCpu0, 0.5), kFailedPrecondition, msg);
  EXPECT_KILN_ERROR(set_logical_device_configuration(kCpu0, {{kMiB}, {kMiB}}), kFailedPrecondition, msg);
  EXPECT_KILN_ERROR(set_visible_devices(DeviceType::kCPU, {0}), kFailedPrecondition, msg);
  // Getters and listings still work; the setting did not change.
  EXPECT_TRUE(get_memory_growth(kCpu0));
  EXPECT_EQ(get_memory_limit(kCpu0), 0);
  EXPECT_EQ(list_logical_devices().size(), 1u);
  // The string form fails only if it would change something.
  set_visible_devices("cpu:0");
}

TEST_F(DeviceConfig, InitializeDevicesFreezesAndPreallocatesEveryLogicalDevice) {
  set_logical_device_configuration(kCpu0, {{2 * kMiB}, {4 * kMiB}});
  set_memory_growth(kCpu0, false);
  initialize_devices();
  EXPECT_TRUE(is_initialized(DeviceType::kCPU));
  EXPECT_EQ(memory_stats(kCpu0).bytes_reserved, 2 * kMiB);
  EXPECT_EQ(memory_stats(kCpu1).bytes_reserved, 4 * kMiB);
  EXPECT_KILN_ERROR(set_memory_growth(kCpu0, true), kFailedPrecondition, "memory growth of cpu:0");
}

TEST_F(DeviceConfig, BadEnvironmentValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
    const char* want;
  };
  for (const Case& c : {Case{"KILN_CPU_MEMORY_LIMIT", "lots", "KILN_CPU_MEMORY_LIMIT: 'lots'"},
                        Case{"KILN_CPU_MEMORY_LIMIT", "2X", "unknown unit 'x'"},
                        Case{"KILN_MEMORY_GROWTH", "maybe", "KILN_MEMORY_GROWTH: 'maybe' is not a boolean"},
                        Case{"KILN_CPU_LOGICAL_DEVICES", "1G,,1G", "KILN_CPU_LOGICAL_DEVICES: '' is empty"},
                        Case{"KILN_CPU_LOGICAL_DEVICES", "1G,x", "KILN_CPU_LOGICAL_DEVICES: 'x'"},
                        Case{"KILN_VISIBLE_DEVICES", "tpu:0", "KILN_VISIBLE_DEVICES: unknown device 'tpu:0'"},
                        Case{"KILN_VISIBLE_DEVICES", "cpu:3", "KILN_VISIBLE_DEVICES: unknown physical device cpu:3"},
                        Case{"KILN_VISIBLE_DEVICES", "cuda:7", "unknown physical device cuda:7"},
                        Case{"KILN_VISIBLE_DEVICES", "cpu:0,cpu:0", "cpu:0 is listed twice"}}) {
    SCOPED_TRACE(std::string(c.var) + "=" + c.value);
    reset();
    setenv(c.var, c.value, 1);
    EXPECT_KILN_ERROR(list_physical_devices(), kInvalidArgument, c.want);
    // Still an error at the first tensor, every time (nothing half-applied).
    EXPECT_KILN_ERROR(bytes_on(10, kCpu0), kInvalidArgument, c.want);
    EXPECT_FALSE(is_initialized(DeviceType::kCPU));
  }
  reset();
  setenv("KILN_VISIBLE_DEVICES", "cpu", 1);  // good values load
  setenv("KILN_MEMORY_GROWTH", "off", 1);
  setenv("KILN_CPU_MEMORY_LIMIT", "3M", 1);
  EXPECT_FALSE(get_memory_growth(kCpu0));
  EXPECT_EQ(get_memory_limit(kCpu0), 3 * kMiB);
}

TEST_F(DeviceConfig, VisibleDevicesRules) {
  EXPECT_KILN_ERROR(set_visible_devices(DeviceType::kCPU, {}), kInvalidArgument, "the CPU cannot be hidden");
  EXPECT_KILN_ERROR(set_visible_devices(DeviceType::kCPU, {1}), kInvalidArgument, "unknown physical device cpu:1");
  EXPECT_KILN_ERROR(set_visible_devices(DeviceType::kCPU, {0, 0}), kInvalidArgument, "listed twice");
  EXPECT_KILN_ERROR(set_visible_devices(DeviceType::kCUDA, {7}), kInvalidArgument, "unknown physical device cuda:7");
  EXPECT_KILN_ERROR(set_visible_devices("cpu:0,gpu:7"), kInvalidArgument, "cuda:7");
  EXPECT_KILN_ERROR(set_visible_devices("cpu:0,,", "--visible-devices"), kInvalidArgument, "--visible-devices: empty");
  set_visible_devices(DeviceType::kCUDA, {});  // hiding every GPU is fine
  set_visible_devices(DeviceType::kCPU, {0});
  set_visible_devices("cuda");  // every GPU (if any); the CPU stays visible
  set_visible_devices("cpu:0");
  auto vis = get_visible_devices();
  ASSERT_EQ(vis.size(), 1u);
  EXPECT_EQ(vis[0].device, kCpu0);
  EXPECT_TRUE(get_visible_devices(DeviceType::kCUDA).empty());
  // Setters name unknown physical devices.
  EXPECT_KILN_ERROR(set_memory_growth(kCpu1, false), kInvalidArgument, "unknown physical device cpu:1");
  EXPECT_KILN_ERROR(set_memory_limit(Device{DeviceType::kCUDA, 7}, kMiB), kInvalidArgument,
                    "unknown physical device cuda:7");
}

TEST_F(DeviceConfig, StatsAndResetPeak) {
  AllocatorStats s0 = memory_stats(kCpu0);  // uninitialized: zeros
  EXPECT_EQ(s0.bytes_in_use, 0);
  EXPECT_EQ(s0.bytes_reserved, 0);
  Tensor a = bytes_on(kMiB, kCpu0);
  {
    Tensor b = bytes_on(2 * kMiB, kCpu0);
    EXPECT_GE(memory_stats(kCpu0).bytes_in_use, 3 * kMiB);
  }
  AllocatorStats s = memory_stats(kCpu0);
  EXPECT_EQ(s.bytes_in_use, kMiB);
  EXPECT_EQ(s.peak_bytes_in_use, 3 * kMiB);
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.largest_alloc_size, 2 * kMiB);
  reset_peak_memory_stats(kCpu0);
  EXPECT_EQ(memory_stats(kCpu0).peak_bytes_in_use, kMiB);
  Tensor c = bytes_on(kMiB / 2, kCpu0);
  c = Tensor();
  s = memory_stats(kCpu0);
  EXPECT_EQ(s.peak_bytes_in_use, kMiB + kMiB / 2);
  EXPECT_EQ(s.bytes_in_use, kMiB);
  EXPECT_EQ(&backend_for(kCpu0).allocator(0), &logical_allocator(kCpu0));
  EXPECT_STREQ(logical_allocator(kCpu0).name(), "cpu:0");
}

}  // namespace
}  // namespace kiln::config
