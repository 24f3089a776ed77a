#pragma once
// Checkpoints: named tensors plus string metadata in one file, written atomically
// (temp file, fsync, rename, fsync of the directory) with a CRC32C per tensor and over
// the header, so a torn or corrupted file is detected on load. Layout (safetensors
// compatible, so standard tools read it): docs/formats/checkpoint.md.
//
// CheckpointManager keeps numbered checkpoints "<prefix>-<step>.ckpt" in a directory,
// deletes all but the newest max_to_keep, and restores the newest one that loads,
// skipping (and reporting) corrupted ones.
//
// Thread-safety: none; one writer per directory.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/core/tensor.h"

namespace kiln::train {

struct CheckpointData {
  std::vector<std::pair<std::string, Tensor>> tensors;  // unique names, any dtype, CPU
  std::map<std::string, std::string> metadata;          // e.g. "step", "epoch"
  const Tensor* find(const std::string& name) const;
};

// Throws InvalidArgumentError for duplicate/empty names; kiln::Error from file I/O.
void save_checkpoint(const std::string& path, const CheckpointData& data);
// Throws NotFoundError for a missing file and DataLossError (naming the file and
// what is wrong: truncated, bad header, checksum mismatch of tensor X) otherwise.
CheckpointData load_checkpoint(const std::string& path);

// Copies variable values into a CheckpointData (keys: variable names) and back.
// `restore_variables` throws NotFoundError naming a missing variable and
// InvalidArgumentError on a shape/dtype mismatch, before assigning anything.
void add_variables(CheckpointData& data, const std::vector<Variable>& vars);
void restore_variables(const CheckpointData& data, const std::vector<Variable>& vars);

class CheckpointManager {
 public:
  CheckpointManager(std::string directory, int max_to_keep = 5, std::string prefix = "ckpt");
  // Writes "<prefix>-<step>.ckpt" and prunes old ones; returns the path.
  std::string save(const CheckpointData& data, int64_t step);
  // Paths of the existing checkpoints, oldest first.
  std::vector<std::string> checkpoints() const;
  // The newest checkpoint path, if any (not validated).
  std::optional<std::string> latest() const;
  // Loads the newest checkpoint that is intact; corrupted ones are reported through
  // `skipped` (path and error message) and left in place. nullopt when none loads.
  std::optional<CheckpointData> restore_latest(std::vector<std::pair<std::string, std::string>>* skipped = nullptr) const;
  const std::string& directory() const { return dir_; }

 private:
  std::string dir_;
  int max_to_keep_;
  std::string prefix_;
};

}  // namespace kiln::train
