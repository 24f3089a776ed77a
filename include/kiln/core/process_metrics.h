#pragma once
// The metrics every kiln process exposes (the model server and `kiln train
// --metrics_port`), refreshed at each scrape:
//   kiln_build_info{version, cpu_isa, cpu_isa_detected} 1
//   process_cpu_seconds_total, process_resident_memory_bytes
//   kiln_allocator_bytes_in_use / _peak_bytes_in_use / _bytes_reserved {device}
//   kiln_device_reading{device, reading}: live device readings (NVML on GPUs:
//     utilisation, memory, temperature, power and its limit, PCIe)
// GPUs appear once the process has initialised CUDA (asking earlier would load the CUDA
// plugin into a CPU-only process).
#include "kiln/core/metrics.h"

namespace kiln {

void register_process_metrics(Metrics& metrics);

}  // namespace kiln
