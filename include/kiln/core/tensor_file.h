#pragma once
// Tensor files: named tensors plus string metadata in one file (safetensors layout, so
// standard tools read it), written atomically (temp file, fsync, rename, fsync of the
// directory) with a CRC-32C per tensor and over the header, so a torn or corrupted
// file is detected on load: docs/formats/checkpoint.md. Training checkpoints
// (kiln/train/checkpoint.h) and model-package weights (kiln/package/) are such files.
//
// Thread-safety: functions are reentrant; a TensorFile is a value.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/file_io.h"
#include "kiln/core/tensor.h"

namespace kiln {

struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // unique names, any dtype, CPU
  std::map<std::string, std::string> metadata;          // e.g. "step", "epoch"
  const Tensor* find(const std::string& name) const;
};

// Throws InvalidArgumentError for duplicate/empty names or user metadata keys starting
// with "kiln."; kiln::Error from file I/O.
void save_tensor_file(const std::string& path, const TensorFile& data);
// Reads and fully validates a file (every checksum) into fresh buffers. Throws
// NotFoundError for a missing file and DataLossError (naming the file and what is
// wrong: truncated, bad header, checksum mismatch of tensor X) otherwise.
TensorFile load_tensor_file(const std::string& path);
// As load_tensor_file, validated the same way, but the tensors borrow the bytes of the
// memory-mapped file (no copy; the mapping lives while any of them does). Such tensors
// are read-only: kernels and ops never write their inputs, but writing into one's
// raw_data() crashes.
TensorFile map_tensor_file(const std::string& path);
// The same over a file already mapped.
TensorFile map_tensor_file(const std::shared_ptr<MappedFile>& file);

}  // namespace kiln
