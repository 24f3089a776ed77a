#include "kiln/core/op_def.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

OpRegistry& OpRegistry::global() {
  static OpRegistry* r = new OpRegistry();  // never destroyed: kernels may run during exit
  return *r;
}

OpDef& OpRegistry::slot(std::string_view name) {
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    it = ops_.emplace(std::string(name), Entry{}).first;
    it->second.def.name = std::string(name);
  }
  return it->second.def;
}

const OpDef* OpRegistry::find(std::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() || !it->second.defined ? nullptr : &it->second.def;
}

const OpDef& OpRegistry::get(std::string_view name) const {
  const OpDef* d = find(name);
  if (!d) throw NotFoundError(detail::str_cat("no op named '", name, "' is registered"));
  return *d;
}

void OpRegistry::define(OpDef d) {
  auto it = ops_.find(d.name);
  if (it == ops_.end()) it = ops_.emplace(d.name, Entry{}).first;
  Entry& e = it->second;
  KILN_CHECK_INTERNAL(!e.defined, "op '", d.name, "' is defined twice");
  // Kernels, a vjp and traits may have registered first.
  d.kernels_ = e.def.kernels_;
  d.prepares_ = e.def.prepares_;
  if (e.def.vjp) d.vjp = e.def.vjp;
  if (e.has_traits) d.traits = e.def.traits;
  e.def = std::move(d);
  e.defined = true;
}

void OpRegistry::register_kernel(std::string_view op, DeviceType dev, DType dt, KernelFn fn, PrepareFn prepare) {
  OpDef& d = slot(op);
  d.kernels_[static_cast<int>(dev)][static_cast<int>(dt)] = fn;
  d.prepares_[static_cast<int>(dev)][static_cast<int>(dt)] = prepare;
}

void OpRegistry::register_vjp(std::string_view op, VjpFn fn) { slot(op).vjp = fn; }

void OpRegistry::register_traits(std::string_view op, const OpTraits& traits) {
  slot(op).traits = traits;
  ops_.find(op)->second.has_traits = true;
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> v;
  for (auto& [k, e] : ops_)
    if (e.defined) v.push_back(&e.def);
  return v;
}

bool OpDef::has_kernels(DeviceType dev) const {
  const auto& row = kernels_[static_cast<int>(dev)];
  return std::any_of(row.begin(), row.end(), [](KernelFn k) { return k != nullptr; });
}

std::vector<std::string> OpRegistry::verify(std::span<const std::string_view> expected) const {
  std::vector<std::string> problems;
  for (const auto& [name, e] : ops_) {
    if (!e.defined) {
      for (int dev = 0; dev < kNumDeviceTypes; ++dev)
        if (e.def.has_kernels(static_cast<DeviceType>(dev)))
          problems.push_back(detail::str_cat("a ", device_type_name(static_cast<DeviceType>(dev)),
                                             " kernel is registered for '", name, "', which no op defines"));
      if (e.def.vjp) problems.push_back(detail::str_cat("a vjp is registered for '", name, "', which no op defines"));
      if (e.has_traits)
        problems.push_back(detail::str_cat("traits are registered for '", name, "', which no op defines"));
      continue;
    }
    if (!e.def.infer) problems.push_back(detail::str_cat("op '", name, "' has no shape inference"));
    if (!e.def.has_kernels(DeviceType::kCPU)) problems.push_back(detail::str_cat("op '", name, "' has no CPU kernel"));
  }
  for (std::string_view name : expected)
    if (!find(name)) problems.push_back(detail::str_cat("op '", name, "' is named but not defined"));
  return problems;
}

OpRegistration::OpRegistration(OpDef d) { OpRegistry::global().define(std::move(d)); }

VjpRegistration::VjpRegistration(const char* op, VjpFn fn) { OpRegistry::global().register_vjp(op, fn); }

OpTraitsRegistration::OpTraitsRegistration(const char* op, const OpTraits& traits) {
  OpRegistry::global().register_traits(op, traits);
}

KernelRegistration::KernelRegistration(const char* op, DeviceType dev, std::initializer_list<DType> dtypes,
                                       KernelFn fn, PrepareFn prepare) {
  for (DType t : dtypes) OpRegistry::global().register_kernel(op, dev, t, fn, prepare);
}

KernelRegistration::KernelRegistration(const char* op, DeviceType dev, DType dtype, KernelFn fn,
                                       PrepareFn prepare) {
  OpRegistry::global().register_kernel(op, dev, dtype, fn, prepare);
}

}  // namespace kiln
