#pragma once
// Checkpoints: named tensors plus string metadata in one tensor file
// (kiln/core/tensor_file.h: atomic writes, CRC-32C per tensor and over the header;
// safetensors compatible: docs/formats/checkpoint.md).
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
#include "kiln/core/tensor_file.h"

namespace kiln::train {

// The file format is kiln/core/tensor_file.h; a checkpoint is a TensorFile.
using CheckpointData = TensorFile;
// Throws InvalidArgumentError for duplicate/empty names; kiln::Error from file I/O.
inline void save_checkpoint(const std::string& path, const CheckpointData& data) { save_tensor_file(path, data); }
// Throws NotFoundError for a missing file and DataLossError (naming the file and
// what is wrong: truncated, bad header, checksum mismatch of tensor X) otherwise.
inline CheckpointData load_checkpoint(const std::string& path) { return load_tensor_file(path); }

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
