#pragma once
// Structured log lines of the server, logfmt style on stderr, one write per line:
//   ts=2026-12-03T06:30:01.123Z level=info event=version_loaded model=mnist version=2 seconds=0.031
// (A few fields per line; spdlog's formatting machinery would add nothing here.)
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::serving {

enum class LogLevel { kInfo, kWarning, kError };

void log_event(LogLevel level, std::string_view event,
               std::initializer_list<std::pair<std::string_view, std::string>> fields = {});
// Silences (or restores) the log: tests and benchmarks.
void set_log_enabled(bool on);

}  // namespace kiln::serving
