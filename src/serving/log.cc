#include "log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace kiln::serving {

static std::atomic<bool> g_log_on{true};

void set_log_enabled(bool on) { g_log_on = on; }

void log_event(LogLevel level, std::string_view event,
               std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  if (!g_log_on.load(std::memory_order_relaxed)) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char ts[96];  // roomy: the compiler cannot bound the int fields
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  std::string line = "ts=";
  line += ts;
  line += level == LogLevel::kInfo ? " level=info" : level == LogLevel::kWarning ? " level=warning" : " level=error";
  line += " event=";
  line += event;
  for (auto& [k, v] : fields) {
    line += ' ';
    line += k;
    line += '=';
    bool quote = v.empty() || v.find_first_of(" \"=\n") != std::string::npos;
    if (!quote) {
      line += v;
      continue;
    }
    line += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') line += '\\';
      if (c == '\n') {
        line += "\\n";
        continue;
      }
      line += c;
    }
    line += '"';
  }
  line += '\n';
  // One write() per line: lines from different threads never interleave.
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
}

}  // namespace kiln::serving
