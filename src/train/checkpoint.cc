// Checkpoints of variables and the CheckpointManager; the file format itself is
// kiln/core/tensor_file.h (docs/formats/checkpoint.md).
#include "kiln/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <unordered_set>

#include "kiln/core/error.h"

namespace kiln::train {
namespace {
namespace fs = std::filesystem;
bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
}  // namespace

void add_variables(CheckpointData& data, const std::vector<Variable>& vars) {
  std::unordered_set<std::string> names;
  for (const auto& [n, _] : data.tensors) names.insert(n);
  for (const auto& v : vars) {
    KILN_CHECK_ARG(v.defined(), "add_variables: undefined Variable");
    KILN_CHECK_ARG(!v.name().empty(), "add_variables: a Variable has an empty name");
    KILN_CHECK_ARG(names.insert(v.name()).second, "add_variables: checkpoint already has a tensor named '", v.name(),
                   "'");
  }
  // Snapshot the values: optimizers may update variable buffers in place later.
  for (const auto& v : vars) data.tensors.emplace_back(v.name(), v.peek().to(Device::cpu()).clone());
}

void restore_variables(const CheckpointData& data, const std::vector<Variable>& vars) {
  std::vector<const Tensor*> src(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    const Variable& v = vars[i];
    KILN_CHECK_ARG(v.defined(), "restore_variables: undefined Variable");
    src[i] = data.find(v.name());
    if (!src[i]) throw NotFoundError("restore_variables: checkpoint has no tensor for variable '" + v.name() + "'");
    if (src[i]->shape() != v.shape() || src[i]->dtype() != v.dtype())
      throw InvalidArgumentError("restore_variables: variable '" + v.name() + "' is " + v.peek().desc() +
                                 " but the checkpoint holds " + src[i]->desc());
  }
  // Copies, so that the variables do not share buffers with `data` (or each other).
  for (size_t i = 0; i < vars.size(); ++i) vars[i].assign(src[i]->to(vars[i].peek().device()).clone());
}

// ---------------------------------------------------------------------------------------

namespace {

// The step of "<prefix>-<step>.ckpt", or nullopt for any other name. Steps are
// canonical decimals (no sign, no leading zeros), so each step has one file name.
std::optional<int64_t> step_of(const std::string& file, const std::string& prefix) {
  std::string head = prefix + "-", tail = ".ckpt";
  if (file.size() <= head.size() + tail.size() || !starts_with(file, head) ||
      file.compare(file.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  std::string_view digits(file.data() + head.size(), file.size() - head.size() - tail.size());
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string directory, int max_to_keep, std::string prefix)
    : dir_(std::move(directory)), max_to_keep_(max_to_keep), prefix_(std::move(prefix)) {
  KILN_CHECK_ARG(!dir_.empty(), "CheckpointManager: empty directory");
  KILN_CHECK_ARG(!prefix_.empty() && prefix_.find('/') == std::string::npos,
                 "CheckpointManager: prefix must be a non-empty file name part, got '", prefix_, "'");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  std::error_code ec2;
  if (!fs::is_directory(dir_, ec2))
    throw FailedPreconditionError("CheckpointManager: cannot create directory " + dir_ +
                                  (ec ? ": " + ec.message() : std::string(": a file is in the way")));
}

std::string CheckpointManager::save(const CheckpointData& data, int64_t step) {
  KILN_CHECK_ARG(step >= 0, "CheckpointManager::save: step must be >= 0, got ", step);
  std::string path = (fs::path(dir_) / (prefix_ + "-" + std::to_string(step) + ".ckpt")).string();
  save_checkpoint(path, data);
  if (max_to_keep_ > 0) {
    // Delete the lowest steps, never the file just written (even if it is older).
    std::vector<std::string> all = checkpoints();
    size_t excess = all.size() > static_cast<size_t>(max_to_keep_) ? all.size() - max_to_keep_ : 0;
    for (size_t i = 0; i < all.size() && excess > 0; ++i) {
      if (all[i] == path) continue;
      std::error_code ec;
      fs::remove(all[i], ec);  // a failed prune leaves an extra file, not a failed save
      --excess;
    }
  }
  return path;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (auto step = step_of(name, prefix_)) found.emplace_back(*step, it->path().string());
  }
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw FailedPreconditionError("CheckpointManager: cannot list " + dir_ + ": " + ec.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [_, p] : found) out.push_back(std::move(p));
  return out;
}

std::optional<std::string> CheckpointManager::latest() const {
  auto all = checkpoints();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<CheckpointData> CheckpointManager::restore_latest(
    std::vector<std::pair<std::string, std::string>>* skipped) const {
  if (skipped) skipped->clear();
  auto all = checkpoints();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load_checkpoint(*it);
    } catch (const Error& e) {
      // Damaged (or vanished) files are skipped; other failures, e.g. permissions,
      // would silently roll training back, so they propagate.
      if (e.code() != ErrorCode::kDataLoss && e.code() != ErrorCode::kNotFound) throw;
      if (skipped) skipped->emplace_back(*it, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace kiln::train
