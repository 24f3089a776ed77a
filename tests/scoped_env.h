#pragma once
// Sets (or, with a null value, unsets) an environment variable for one scope and
// restores what was there before, also when the scope is left by an exception: for
// tests of what the environment must (or must no longer) change. Kernel preferences are
// set through ScopedKernelPreferences (test_util.h), never the environment.
#include <cstdlib>
#include <string>

namespace kiln::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace kiln::testing
