#pragma once
// Device configuration: TensorFlow's tf.config for kiln (docs/devices.md).
//
// Physical devices are what the machine has: one CPU (the host; its memory is RAM, or
// the container's cgroup limit when lower), and the GPUs the CUDA driver shows when
// kiln is built with CUDA (the driver applies CUDA_VISIBLE_DEVICES before kiln
// enumerates). Logical devices are what tensors live on (`Device{kCPU, 1}` = "cpu:1"):
// every visible physical device gives one logical device, or several when split with
// set_logical_device_configuration. Each logical device has its own BFC allocator
// (include/kiln/core/bfc_allocator.h) with its own limit and statistics. Logical
// devices of one type are numbered in the order of the visible physical devices.
//
// Configuration is read once and then fixed: settings come from the environment,
// read at the first call into this module or the first tensor (KILN_<TYPE>_MEMORY_LIMIT,
// KILN_MEMORY_GROWTH, KILN_<TYPE>_LOGICAL_DEVICES, KILN_VISIBLE_DEVICES; a malformed
// value is an InvalidArgumentError naming the variable, thrown by that first call);
// calls of the setters below override them. When the first allocator of a device type
// is created (the first tensor on a device of that type, or initialize_devices()), the
// configuration of that type is frozen: every setter for that type then throws
// FailedPreconditionError ("... cannot be changed after device cpu:0 was initialized").
// Allocators of the other logical devices of the type are created at their own first
// allocation (pre-allocating then, when memory growth is off).
//
// Setters take physical devices (as list_physical_devices returns them); memory_stats
// and reset_peak_memory_stats take logical devices (as tensors use them). For the
// CPU the two coincide unless the CPU is split.
//
// Exceeding a limit makes the allocation throw ResourceExhaustedError naming the logical
// device, its limit and growth mode, the request, the allocator's statistics and its
// largest free block; nothing aborts and the device stays usable.
//
// Thread-safety: every function may be called from any thread. The allocators are
// created under a lock; after that, looking one up is lock-free.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"

namespace kiln::config {

struct PhysicalDevice {
  Device device;  // physical index: {kCUDA, 1} = the second GPU the driver shows
  DeviceProperties properties;
  bool visible = true;
};

struct LogicalDeviceConfig {
  // Bytes this logical device may hold; 0 = no limit of its own (only with memory
  // growth on and no memory limit on the physical device).
  int64_t memory_limit = 0;
};

struct LogicalDevice {
  Device device;             // what tensors use, e.g. cpu:1
  Device physical;           // the physical device it is carved from
  int64_t memory_limit = 0;  // 0 = no limit
  bool memory_growth = true;
  bool initialized = false;  // its allocator exists
};

// Every physical device (of `type`, or of all types), visible or not. Does not
// initialize anything.
std::vector<PhysicalDevice> list_physical_devices(std::optional<DeviceType> type = {});

// Makes exactly `indices` (physical indices) of `type` visible; the others get no
// logical device. Logical devices follow the order of `indices`. Throws
// InvalidArgumentError for an unknown or repeated index, or when the list hides the
// CPU (kiln always needs the host); FailedPreconditionError once `type` is initialized.
void set_visible_devices(DeviceType type, const std::vector<int>& indices);
// The same from a list such as "cpu:0,cuda:1" or "cpu" (what KILN_VISIBLE_DEVICES
// and `--visible-devices` take): the listed devices ("cuda" = every GPU) are visible,
// the devices of other types are hidden, except the CPU, which is always visible.
// `what` names the source in error messages.
void set_visible_devices(std::string_view spec, std::string_view what = "visible devices");
// The visible physical devices (of `type`, or of all types), in logical order.
std::vector<PhysicalDevice> get_visible_devices(std::optional<DeviceType> type = {});

// true (the default): each allocator reserves memory in regions on demand, doubling
// from 2 MiB, up to its limit. false: each logical device reserves its whole limit at
// its first allocation; a physical device without a limit (and not split) then gets
// kDefaultPreallocateFraction of its memory. Applies to every logical device of
// `physical`.
void set_memory_growth(const Device& physical, bool enable);
bool get_memory_growth(const Device& physical);
inline constexpr double kDefaultPreallocateFraction = 0.9;

// Caps the memory of `physical` (bytes; 0 = no limit). Must not exceed the device's
// memory_bytes (InvalidArgumentError). Unsplit, its one logical device gets this limit;
// split, the logical devices' limits must add up to at most this.
void set_memory_limit(const Device& physical, int64_t bytes);
// The same as a fraction 0 < f <= 1 of the device's memory_bytes (the seeds'
// set_per_process_memory_fraction(0.7)).
void set_memory_fraction(const Device& physical, double fraction);
// The current limit of `physical` in bytes (0 = none).
int64_t get_memory_limit(const Device& physical);

// Splits `physical` into configs.size() logical devices (at least one), each with
// its own allocator and limit. An empty vector undoes a split. The limits must add up
// to at most the device's memory (and its memory limit, if set).
void set_logical_device_configuration(const Device& physical, const std::vector<LogicalDeviceConfig>& configs);
// The split of `physical`; empty when it is not split.
std::vector<LogicalDeviceConfig> get_logical_device_configuration(const Device& physical);

// The logical devices the current configuration gives (of `type`, or of all types),
// with `initialized` telling which have an allocator. Unlike TensorFlow's, this does
// not initialize anything; it does validate the configuration (InvalidArgumentError).
std::vector<LogicalDevice> list_logical_devices(std::optional<DeviceType> type = {});

// Creates the allocator of every logical device (of `type`, or of all types), which
// freezes their configuration and pre-allocates when growth is off.
void initialize_devices(std::optional<DeviceType> type = {});
// Whether the configuration of `type` is frozen (one of its allocators exists).
bool is_initialized(DeviceType type);

// Statistics of a logical device's allocator (allocator.h). An uninitialized device
// reports zeros and its bytes_limit. Throws NotFoundError for an unknown device.
AllocatorStats memory_stats(const Device& logical);
// Sets peak_bytes_in_use to the current bytes_in_use (no-op when uninitialized).
void reset_peak_memory_stats(const Device& logical);

// Parses a memory amount: bytes ("1048576", "512K", "1.5G", "2GiB", "64MB"; binary
// units) or a fraction of the device ("0.7", "70%"). Exactly one of the fields is set;
// "0" is zero bytes. Throws InvalidArgumentError naming `what` (e.g. the variable or
// flag) on anything else.
struct MemoryAmount {
  int64_t bytes = 0;
  double fraction = 0;  // > 0 when given as a fraction
  int64_t resolve(int64_t device_memory) const;
};
MemoryAmount parse_memory_amount(std::string_view text, std::string_view what);
// Human-readable bytes: "1.5 GiB", "512 B".
std::string format_bytes(int64_t bytes);

// ---- For backends ----------------------------------------------------------------
// A backend enumerates its physical devices through a DeviceProvider registered at
// static-initialisation time; its Backend::device_count() returns
// logical_device_count(type), Backend::allocator(i) returns
// logical_allocator({type, i}), and it maps logical device i to the hardware with
// physical_index({type, i}). Backend::properties(i) describes the physical device
// behind logical device i.
class DeviceProvider {
 public:
  virtual ~DeviceProvider() = default;
  // Physical devices (called once, at the first use of the type's configuration).
  virtual int physical_device_count() = 0;
  virtual DeviceProperties physical_properties(int physical_index) = 0;
  // Raw memory of a physical device for one logical device's BFC allocator.
  virtual std::unique_ptr<SubAllocator> make_sub_allocator(int physical_index) = 0;
};
void register_device_provider(DeviceType type, DeviceProvider* provider);
// The number of logical devices of `type` (loads the configuration; does not freeze it).
int logical_device_count(DeviceType type);
// The allocator of a logical device, created on first use (freezing the type's
// configuration). Throws NotFoundError for an unknown device, InvalidArgumentError for
// an invalid configuration, ResourceExhaustedError when pre-allocation fails.
Allocator& logical_allocator(const Device& logical);
// The physical device index behind a logical device.
int physical_index(const Device& logical);

}  // namespace kiln::config
