// The metrics of every kiln process (kiln/core/process_metrics.h).
#include "kiln/core/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/version.h"

namespace kiln {

void register_process_metrics(Metrics& metrics) {
  // The build and what its CPU kernels run here (kiln/core/cpu_isa.h): a constant 1.
  metrics.gauge("kiln_build_info", "kiln's version and the instruction set its CPU kernels use (value 1)",
                {"version", "cpu_isa", "cpu_isa_detected"})
      .at({KILN_VERSION_STRING, cpu_isa_name(cpu_isa()), cpu_isa_name(detected_cpu_isa())})
      .set(1);
  auto& cpu = metrics.gauge("process_cpu_seconds_total", "User + system CPU seconds of the process", {});
  auto& rss = metrics.gauge("process_resident_memory_bytes", "Resident memory of the process", {});
  auto& in_use = metrics.gauge("kiln_allocator_bytes_in_use", "Bytes the device allocator has handed out", {"device"});
  auto& peak = metrics.gauge("kiln_allocator_peak_bytes_in_use", "Peak bytes the device allocator handed out", {"device"});
  auto& reserved =
      metrics.gauge("kiln_allocator_bytes_reserved", "Bytes the device allocator holds from the system", {"device"});
  auto& reading = metrics.gauge("kiln_device_reading",
                                "Live device readings (NVML on GPUs: utilization, memory, temperature, power, PCIe)",
                                {"device", "reading"});
  metrics.on_collect([&cpu, &rss, &in_use, &peak, &reserved, &reading] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    cpu.at({}).set(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6);
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) == 2) rss.at({}).set(double(resident) * sysconf(_SC_PAGESIZE));
      std::fclose(f);
    }
    for (DeviceType t : {DeviceType::kCPU, DeviceType::kCUDA}) {
      if (t != DeviceType::kCPU && !config::is_initialized(t)) continue;
      Backend* b = find_backend(t);
      if (!b) continue;
      for (int i = 0; i < b->device_count(); ++i) {
        auto s = b->allocator(i).stats();
        std::string dev = std::string(device_type_name(t)) + ":" + std::to_string(i);
        in_use.at({dev}).set(double(s.bytes_in_use));
        peak.at({dev}).set(double(s.peak_bytes_in_use));
        reserved.at({dev}).set(double(s.bytes_reserved));
        for (const DeviceReading& r : b->readings(i)) reading.at({dev, r.name}).set(r.value);
      }
    }
  });
}

}  // namespace kiln
