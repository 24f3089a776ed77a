// Device configuration (include/kiln/core/device_config.h): settings per physical
// device, the logical layout derived from them, and one BFC allocator per logical
// device.
#include "kiln/core/device_config.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "device_config_internal.h"
#include "kiln/core/bfc_allocator.h"
#include "kiln/core/error.h"

namespace kiln::config {
namespace {

// ---- Parsing ---------------------------------------------------------------------------

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    out.push_back(trim(s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

bool parse_bool(std::string_view text, std::string_view what) {
  std::string v = lower(trim(text));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgumentError(std::string(what) + ": '" + std::string(text) +
                             "' is not a boolean; expected true/false (or 1/0, yes/no, on/off)");
}

std::string type_upper(DeviceType t) {
  std::string s = device_type_name(t);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// ---- Allocators ------------------------------------------------------------------------

// A logical device's allocator: a BFC allocator whose errors name the device and how
// it is configured.
class DeviceAllocator final : public Allocator {
 public:
  DeviceAllocator(std::unique_ptr<SubAllocator> sub, const BFCOptions& o, const std::string& device,
                  std::string context)
      : context_(std::move(context)), bfc_(make_bfc(std::move(sub), o, device, context_)) {}

  const char* name() const override { return bfc_->name(); }

  void* allocate(size_t bytes) override {
    try {
      return bfc_->allocate(bytes);
    } catch (const ResourceExhaustedError& e) {
      throw ResourceExhaustedError("out of memory on " + context_ + ": " + e.message() +
                                   "; raise the device's memory limit or use less memory (e.g. smaller batches)");
    }
  }
  void deallocate(void* ptr) override { bfc_->deallocate(ptr); }
  AllocatorStats stats() const override { return bfc_->stats(); }
  void reset_peak() { bfc_->reset_peak(); }

 private:
  static std::unique_ptr<BFCAllocator> make_bfc(std::unique_ptr<SubAllocator> sub, const BFCOptions& o,
                                                const std::string& device, const std::string& context) {
    try {
      return std::make_unique<BFCAllocator>(std::move(sub), o, device);
    } catch (const ResourceExhaustedError& e) {
      throw ResourceExhaustedError("cannot pre-allocate " + context + ": " + e.message() +
                                   "; lower its memory limit or turn memory growth on");
    }
  }

  std::string context_;
  std::unique_ptr<BFCAllocator> bfc_;
};

// ---- State -----------------------------------------------------------------------------

struct PhysSettings {
  std::optional<bool> growth;
  std::optional<MemoryAmount> limit;
  std::optional<std::vector<MemoryAmount>> logical;  // empty = not split
};

struct LogicalSpec {
  int physical = 0;
  int64_t limit = 0;
  bool growth = true;
};

// Providers register without the state lock: the CUDA plugin registers while it is
// being loaded, which happens under that lock (enumerate_locked).
std::array<std::atomic<DeviceProvider*>, kNumDeviceTypes> g_providers{};

struct TypeState {
  DeviceProvider* provider = nullptr;  // g_providers[type] as of the last enumeration
  bool enumerated = false;
  std::vector<DeviceProperties> props;  // per physical device
  std::vector<PhysSettings> phys;
  std::optional<std::vector<int>> visible;  // nullopt = all, in physical order
  // Set when frozen; immutable afterwards (until reset_for_testing).
  std::atomic<bool> frozen{false};
  std::string frozen_by;
  std::vector<LogicalSpec> layout;
  std::atomic<int> count{0};
  std::atomic<DeviceAllocator*>* slots = nullptr;  // `count` entries; never freed
};

struct EnvSettings {
  bool loaded = false;
  std::optional<bool> growth;
  std::optional<MemoryAmount> limit[kNumDeviceTypes];
  std::optional<std::vector<MemoryAmount>> logical[kNumDeviceTypes];
  std::optional<std::string> visible;
};

struct State {
  std::mutex mu;
  EnvSettings env;
  TypeState types[kNumDeviceTypes];
  // Every allocator ever made: never destroyed, since tensors in static storage may
  // outlive everything else (and reset_for_testing retires allocators still in use).
  std::vector<DeviceAllocator*> allocators;
  std::vector<std::atomic<DeviceAllocator*>*> retired_slots;  // kept reachable, see reset_for_testing
};

State& state() {
  static State* s = new State;  // never destroyed, for the same reason
  return *s;
}

TypeState& ts(DeviceType t) { return state().types[static_cast<int>(t)]; }

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string no_such_physical(DeviceType t, int index, const TypeState& s) {
  std::string msg = "unknown physical device " + Device{t, index}.str() + " (" + std::to_string(s.props.size()) +
                    " physical " + device_type_name(t) + " device(s)";
  if (!s.provider) msg += "; " + backend_unavailable_reason(t);
  return msg + ")";
}

// Fills props/phys of one type from its provider and applies the environment to it.
void enumerate_locked(DeviceType t) {
  TypeState& s = ts(t);
  if (s.enumerated) return;
  find_backend(t);  // loads the backend's plugin (CUDA), which registers its provider
  s.provider = g_providers[static_cast<int>(t)].load(std::memory_order_acquire);
  s.props.clear();
  if (s.provider) {
    int n = s.provider->physical_device_count();
    for (int i = 0; i < n; ++i) s.props.push_back(s.provider->physical_properties(i));
  }
  s.phys.assign(s.props.size(), PhysSettings{});
  const EnvSettings& env = state().env;
  for (PhysSettings& p : s.phys) {
    p.growth = env.growth;
    p.limit = env.limit[static_cast<int>(t)];
    p.logical = env.logical[static_cast<int>(t)];
  }
  s.enumerated = true;
}

// Parses "cpu:0,cuda" into per-type visible lists (nullopt = all), validated against
// the enumerated devices. Throws InvalidArgumentError naming `what`.
std::array<std::optional<std::vector<int>>, kNumDeviceTypes> parse_visible_locked(std::string_view spec,
                                                                                 std::string_view what) {
  std::array<std::optional<std::vector<int>>, kNumDeviceTypes> out;
  std::array<bool, kNumDeviceTypes> all{};
  for (int t = 0; t < kNumDeviceTypes; ++t) out[t] = std::vector<int>{};
  std::string w(what);
  for (const std::string& item : split_commas(spec)) {
    if (item.empty()) throw InvalidArgumentError(w + ": empty entry in '" + std::string(spec) + "'");
    Device d;
    try {
      d = parse_device(lower(item));
    } catch (const Error& e) {
      throw InvalidArgumentError(w + ": " + e.message());
    }
    int t = static_cast<int>(d.type);
    enumerate_locked(d.type);
    const TypeState& s = state().types[t];
    if (item.find(':') == std::string::npos) {
      all[t] = true;
      continue;
    }
    if (d.index >= static_cast<int>(s.props.size()))
      throw InvalidArgumentError(w + ": " + no_such_physical(d.type, d.index, s));
    auto& v = *out[t];
    if (std::find(v.begin(), v.end(), d.index) != v.end())
      throw InvalidArgumentError(w + ": " + d.str() + " is listed twice");
    v.push_back(d.index);
  }
  for (int t = 0; t < kNumDeviceTypes; ++t)
    if (all[t] || static_cast<DeviceType>(t) == DeviceType::kCPU) out[t].reset();
  return out;
}

void load_env_locked() {
  State& st = state();
  if (st.env.loaded) return;
  EnvSettings env;
  if (const char* v = env_or_null("KILN_MEMORY_GROWTH")) env.growth = parse_bool(v, "KILN_MEMORY_GROWTH");
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    std::string up = type_upper(static_cast<DeviceType>(t));
    std::string lim = "KILN_" + up + "_MEMORY_LIMIT", logi = "KILN_" + up + "_LOGICAL_DEVICES";
    if (const char* v = env_or_null(lim.c_str())) {
      MemoryAmount m = parse_memory_amount(v, lim);
      if (m.bytes < 0) throw InvalidArgumentError(lim + ": must not be negative");
      env.limit[t] = m;
    }
    if (const char* v = env_or_null(logi.c_str())) {
      std::vector<MemoryAmount> list;
      for (const std::string& item : split_commas(v)) list.push_back(parse_memory_amount(item, logi));
      env.logical[t] = list;
    }
  }
  if (const char* v = env_or_null("KILN_VISIBLE_DEVICES")) env.visible = v;
  // Enumerate with the new settings; on any error, leave nothing half-applied.
  EnvSettings saved = st.env;
  st.env = env;
  for (auto& s : st.types) s.enumerated = false;
  try {
    // Types other than the CPU are enumerated when first asked about (that loads the
    // CUDA plugin and its libraries), unless the environment configures them now.
    for (int t = 0; t < kNumDeviceTypes; ++t)
      if (t == static_cast<int>(DeviceType::kCPU) || env.visible || env.limit[t] || env.logical[t])
        enumerate_locked(static_cast<DeviceType>(t));
    if (env.visible) {
      auto vis = parse_visible_locked(*env.visible, "KILN_VISIBLE_DEVICES");
      for (int t = 0; t < kNumDeviceTypes; ++t) st.types[t].visible = vis[t];
    }
  } catch (...) {
    st.env = saved;
    for (auto& s : st.types) {
      s.enumerated = false;
      s.visible.reset();
    }
    throw;
  }
  st.env.loaded = true;
}

TypeState& loaded_type_locked(DeviceType t) {
  load_env_locked();
  TypeState& s = ts(t);
  enumerate_locked(t);
  return s;
}

PhysSettings& physical_locked(const Device& d) {
  TypeState& s = loaded_type_locked(d.type);
  if (d.index < 0 || d.index >= static_cast<int>(s.phys.size()))
    throw InvalidArgumentError(no_such_physical(d.type, d.index, s));
  return s.phys[d.index];
}

void check_not_frozen(DeviceType t, const std::string& what) {
  const TypeState& s = ts(t);
  if (s.frozen.load(std::memory_order_acquire))
    throw FailedPreconditionError(what + " cannot be changed after device " + s.frozen_by +
                                  " was initialized (its first tensor was allocated); configure devices before "
                                  "creating any tensor on them");
}

std::vector<int> all_indices(const TypeState& s) {
  std::vector<int> all(s.props.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

std::vector<int> visible_list(const TypeState& s) { return s.visible ? *s.visible : all_indices(s); }

// The logical devices the settings of `t` give, validated.
std::vector<LogicalSpec> compute_layout_locked(DeviceType t) {
  TypeState& s = loaded_type_locked(t);
  std::vector<LogicalSpec> out;
  for (int p : visible_list(s)) {
    const PhysSettings& ps = s.phys[p];
    const int64_t mem = s.props[p].memory_bytes;
    const std::string name = Device{t, p}.str();
    bool growth = ps.growth.value_or(true);
    int64_t plimit = ps.limit ? ps.limit->resolve(mem) : 0;
    if (plimit > mem && mem > 0)
      throw InvalidArgumentError("memory limit of " + name + " (" + format_bytes(plimit) + ") exceeds its memory (" +
                                 format_bytes(mem) + ")");
    if (ps.logical && !ps.logical->empty()) {
      int64_t sum = 0;
      for (const MemoryAmount& m : *ps.logical) {
        int64_t l = m.resolve(mem);
        if (l < 0) throw InvalidArgumentError("logical device limits of " + name + " must not be negative");
        if (l == 0 && !growth)
          throw InvalidArgumentError("logical devices of " + name +
                                     " need a memory limit each when memory growth is off (it pre-allocates them)");
        if (l == 0 && plimit)
          throw InvalidArgumentError("logical devices of " + name + " need a memory limit each when " + name +
                                     " has a memory limit (" + format_bytes(plimit) + ")");
        sum += l;
        out.push_back({p, l, growth});
      }
      if (plimit && sum > plimit)
        throw InvalidArgumentError("the logical devices of " + name + " ask for " + format_bytes(sum) +
                                   " in total, more than its memory limit of " + format_bytes(plimit));
      if (mem > 0 && sum > mem)
        throw InvalidArgumentError("the logical devices of " + name + " ask for " + format_bytes(sum) +
                                   " in total, more than its memory (" + format_bytes(mem) + ")");
    } else {
      int64_t l = plimit;
      if (!growth && l == 0) l = static_cast<int64_t>(static_cast<double>(mem) * kDefaultPreallocateFraction);
      out.push_back({p, l, growth});
    }
  }
  return out;
}

// Layout of `t`: the frozen one, or the one the current settings give.
std::vector<LogicalSpec> layout_locked(DeviceType t) {
  TypeState& s = ts(t);
  if (s.frozen.load(std::memory_order_acquire)) return s.layout;
  return compute_layout_locked(t);
}

DeviceAllocator* slot(const TypeState& s, int i) {
  return s.frozen.load(std::memory_order_acquire) && i >= 0 && i < s.count.load(std::memory_order_acquire)
             ? s.slots[i].load(std::memory_order_acquire)
             : nullptr;
}

std::string describe(const Device& logical, const LogicalSpec& spec) {
  std::string s = "device " + logical.str() + " (limit " + (spec.limit ? format_bytes(spec.limit) : "none") +
                  ", memory growth " + (spec.growth ? "on" : "off");
  return s + ")";
}

void check_logical(DeviceType t, const Device& d, size_t count) {
  if (d.index < 0 || d.index >= static_cast<int>(count))
    throw NotFoundError("device " + d.str() + " does not exist (" + std::to_string(count) + " logical " +
                        device_type_name(t) + " device(s))");
}

}  // namespace

// ---- Parsing (public) ------------------------------------------------------------------

int64_t MemoryAmount::resolve(int64_t device_memory) const {
  if (fraction > 0) return static_cast<int64_t>(std::floor(fraction * static_cast<double>(device_memory)));
  return bytes;
}

MemoryAmount parse_memory_amount(std::string_view text, std::string_view what) {
  const std::string t = trim(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(std::string(what) + ": '" + std::string(text) + "' " + why +
                                "; expected bytes (e.g. 512M, 2G, 1073741824) or a fraction of the device's "
                                "memory (e.g. 0.7 or 70%)");
  };
  if (t.empty()) throw bad("is empty");
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  std::string num = t.substr(0, i), suffix = lower(trim(t.substr(i)));
  if (num.empty() || num == "." || std::count(num.begin(), num.end(), '.') > 1) throw bad("is not a memory amount");
  double x = std::strtod(num.c_str(), nullptr);
  MemoryAmount m;
  if (suffix == "%") {
    if (!(x > 0 && x <= 100)) throw bad("is not a percentage in (0, 100]");
    m.fraction = x / 100;
    return m;
  }
  if (suffix.empty() && num.find('.') != std::string::npos) {
    if (!(x > 0 && x <= 1)) throw bad("is not a fraction in (0, 1]");
    m.fraction = x;
    return m;
  }
  double unit;
  if (suffix.empty() || suffix == "b")
    unit = 1;
  else if (suffix == "k" || suffix == "kb" || suffix == "kib")
    unit = 1024.0;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib")
    unit = 1024.0 * 1024;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib")
    unit = 1024.0 * 1024 * 1024;
  else if (suffix == "t" || suffix == "tb" || suffix == "tib")
    unit = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad("has an unknown unit '" + suffix + "'");
  double b = std::floor(x * unit);
  if (b > 4.0e18) throw bad("is too large");
  m.bytes = static_cast<int64_t>(b);
  return m;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// ---- Physical devices ------------------------------------------------------------------

std::vector<PhysicalDevice> list_physical_devices(std::optional<DeviceType> type) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  std::vector<PhysicalDevice> out;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (type && static_cast<int>(*type) != t) continue;
    const TypeState& s = loaded_type_locked(static_cast<DeviceType>(t));
    std::vector<int> vis = visible_list(s);
    for (size_t i = 0; i < s.props.size(); ++i)
      out.push_back({Device{static_cast<DeviceType>(t), static_cast<int>(i)}, s.props[i],
                     std::find(vis.begin(), vis.end(), static_cast<int>(i)) != vis.end()});
  }
  return out;
}

void set_visible_devices(DeviceType type, const std::vector<int>& indices) {
  std::lock_guard<std::mutex> lock(state().mu);
  TypeState& s = loaded_type_locked(type);
  check_not_frozen(type, std::string("visible ") + device_type_name(type) + " devices");
  std::set<int> seen;
  for (int i : indices) {
    if (i < 0 || i >= static_cast<int>(s.props.size())) throw InvalidArgumentError(no_such_physical(type, i, s));
    if (!seen.insert(i).second) throw InvalidArgumentError(Device{type, i}.str() + " is listed twice");
  }
  if (type == DeviceType::kCPU && !seen.count(0))
    throw InvalidArgumentError("the CPU cannot be hidden: kiln always needs the host device cpu:0");
  s.visible = indices;
}

void set_visible_devices(std::string_view spec, std::string_view what) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  auto vis = parse_visible_locked(spec, what);
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const TypeState& s = ts(static_cast<DeviceType>(t));
    DeviceType dt = static_cast<DeviceType>(t);
    if (visible_list(s) != (vis[t] ? *vis[t] : all_indices(s)))
      check_not_frozen(dt, std::string("visible ") + device_type_name(dt) + " devices");
  }
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    TypeState& s = ts(static_cast<DeviceType>(t));
    if (!s.frozen.load(std::memory_order_acquire)) s.visible = vis[t];
  }
}

std::vector<PhysicalDevice> get_visible_devices(std::optional<DeviceType> type) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  std::vector<PhysicalDevice> out;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (type && static_cast<int>(*type) != t) continue;
    const TypeState& s = loaded_type_locked(static_cast<DeviceType>(t));
    for (int i : visible_list(s)) out.push_back({Device{static_cast<DeviceType>(t), i}, s.props[i], true});
  }
  return out;
}

void set_memory_growth(const Device& physical, bool enable) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  check_not_frozen(physical.type, "memory growth of " + physical.str());
  p.growth = enable;
}

bool get_memory_growth(const Device& physical) {
  std::lock_guard<std::mutex> lock(state().mu);
  return physical_locked(physical).growth.value_or(true);
}

void set_memory_limit(const Device& physical, int64_t bytes) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  check_not_frozen(physical.type, "memory limit of " + physical.str());
  int64_t mem = ts(physical.type).props[physical.index].memory_bytes;
  if (bytes < 0) throw InvalidArgumentError("memory limit of " + physical.str() + " must not be negative");
  if (mem > 0 && bytes > mem)
    throw InvalidArgumentError("memory limit of " + physical.str() + " (" + format_bytes(bytes) +
                               ") exceeds its memory (" + format_bytes(mem) + ")");
  if (bytes == 0)
    p.limit.reset();
  else
    p.limit = MemoryAmount{bytes, 0};
}

void set_memory_fraction(const Device& physical, double fraction) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  check_not_frozen(physical.type, "memory limit of " + physical.str());
  if (!(fraction > 0 && fraction <= 1))
    throw InvalidArgumentError("memory fraction of " + physical.str() + " must be in (0, 1], got " +
                               std::to_string(fraction));
  p.limit = MemoryAmount{0, fraction};
}

int64_t get_memory_limit(const Device& physical) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  return p.limit ? p.limit->resolve(ts(physical.type).props[physical.index].memory_bytes) : 0;
}

void set_logical_device_configuration(const Device& physical, const std::vector<LogicalDeviceConfig>& configs) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  check_not_frozen(physical.type, "logical devices of " + physical.str());
  std::vector<MemoryAmount> list;
  for (const LogicalDeviceConfig& c : configs) {
    if (c.memory_limit < 0)
      throw InvalidArgumentError("logical device limits of " + physical.str() + " must not be negative, got " +
                                 std::to_string(c.memory_limit));
    list.push_back(MemoryAmount{c.memory_limit, 0});
  }
  p.logical = std::move(list);
}

std::vector<LogicalDeviceConfig> get_logical_device_configuration(const Device& physical) {
  std::lock_guard<std::mutex> lock(state().mu);
  PhysSettings& p = physical_locked(physical);
  std::vector<LogicalDeviceConfig> out;
  if (p.logical)
    for (const MemoryAmount& m : *p.logical)
      out.push_back({m.resolve(ts(physical.type).props[physical.index].memory_bytes)});
  return out;
}

// ---- Logical devices -------------------------------------------------------------------

std::vector<LogicalDevice> list_logical_devices(std::optional<DeviceType> type) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  std::vector<LogicalDevice> out;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (type && static_cast<int>(*type) != t) continue;
    DeviceType dt = static_cast<DeviceType>(t);
    std::vector<LogicalSpec> layout = layout_locked(dt);
    for (size_t i = 0; i < layout.size(); ++i)
      out.push_back({Device{dt, static_cast<int>(i)}, Device{dt, layout[i].physical}, layout[i].limit,
                     layout[i].growth, slot(ts(dt), static_cast<int>(i)) != nullptr});
  }
  return out;
}

void initialize_devices(std::optional<DeviceType> type) {
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (type && static_cast<int>(*type) != t) continue;
    DeviceType dt = static_cast<DeviceType>(t);
    int n = logical_device_count(dt);
    for (int i = 0; i < n; ++i) logical_allocator(Device{dt, i});
  }
}

bool is_initialized(DeviceType type) { return ts(type).frozen.load(std::memory_order_acquire); }

AllocatorStats memory_stats(const Device& logical) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  std::vector<LogicalSpec> layout = layout_locked(logical.type);
  check_logical(logical.type, logical, layout.size());
  if (DeviceAllocator* a = slot(ts(logical.type), logical.index)) return a->stats();
  AllocatorStats s;
  s.bytes_limit = layout[logical.index].limit;
  return s;
}

void reset_peak_memory_stats(const Device& logical) {
  std::lock_guard<std::mutex> lock(state().mu);
  load_env_locked();
  check_logical(logical.type, logical, layout_locked(logical.type).size());
  if (DeviceAllocator* a = slot(ts(logical.type), logical.index)) a->reset_peak();
}

// ---- For backends ----------------------------------------------------------------------

void register_device_provider(DeviceType type, DeviceProvider* provider) {
  g_providers[static_cast<int>(type)].store(provider, std::memory_order_release);
}

int logical_device_count(DeviceType type) {
  TypeState& s = ts(type);
  if (s.frozen.load(std::memory_order_acquire)) return s.count.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(state().mu);
  return static_cast<int>(layout_locked(type).size());
}

Allocator& logical_allocator(const Device& logical) {
  TypeState& s = ts(logical.type);
  if (DeviceAllocator* a = slot(s, logical.index)) return *a;
  std::lock_guard<std::mutex> lock(state().mu);
  if (!s.frozen.load(std::memory_order_acquire)) {
    std::vector<LogicalSpec> layout = compute_layout_locked(logical.type);
    check_logical(logical.type, logical, layout.size());
    s.layout = std::move(layout);
    s.slots = new std::atomic<DeviceAllocator*>[s.layout.size()]();
    s.count.store(static_cast<int>(s.layout.size()), std::memory_order_release);
    s.frozen_by = logical.str();
    s.frozen.store(true, std::memory_order_release);
  }
  check_logical(logical.type, logical, s.layout.size());
  if (DeviceAllocator* a = s.slots[logical.index].load(std::memory_order_acquire)) return *a;
  const LogicalSpec& spec = s.layout[logical.index];
  if (!s.provider) throw NotFoundError(std::string("no ") + device_type_name(logical.type) + " backend");
  BFCOptions o;
  o.memory_limit = static_cast<size_t>(spec.limit);
  o.allow_growth = spec.growth;
  auto* a = new DeviceAllocator(s.provider->make_sub_allocator(spec.physical), o, logical.str(),
                                describe(logical, spec));
  state().allocators.push_back(a);
  s.slots[logical.index].store(a, std::memory_order_release);
  return *a;
}

int physical_index(const Device& logical) {
  TypeState& s = ts(logical.type);
  if (s.frozen.load(std::memory_order_acquire)) {
    check_logical(logical.type, logical, static_cast<size_t>(s.count.load(std::memory_order_acquire)));
    return s.layout[logical.index].physical;
  }
  std::lock_guard<std::mutex> lock(state().mu);
  std::vector<LogicalSpec> layout = layout_locked(logical.type);
  check_logical(logical.type, logical, layout.size());
  return layout[logical.index].physical;
}

namespace internal {

void reset_for_testing() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.env = EnvSettings{};
  for (TypeState& s : st.types) {
    s.enumerated = false;
    s.props.clear();
    s.phys.clear();
    s.visible.reset();
    s.frozen.store(false);
    s.frozen_by.clear();
    s.layout.clear();
    s.count.store(0);
    if (s.slots) st.retired_slots.push_back(s.slots);  // a racing reader may still hold it
    s.slots = nullptr;
  }
}

}  // namespace internal
}  // namespace kiln::config
