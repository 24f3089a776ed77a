#pragma once
// TensorFlow's TensorBundle (the `variables/` directory of a SavedModel, and TF2
// checkpoints): `<prefix>.index`, a LevelDB-format table (read with libleveldb) whose
// "" key holds a BundleHeaderProto (number of shards, endianness) and every other key a
// BundleEntryProto (dtype, shape, shard, offset, size, masked CRC-32C), and the data
// shards `<prefix>.data-<i>-of-<n>`, memory-mapped.
//
// Errors name the file: a missing index or shard is NotFoundError; an index that is
// not a table or whose blocks fail their checksums, an entry that does not parse, a
// byte range beyond its shard's end, a size that does not fit the dtype and shape, or
// bytes whose CRC-32C differs from the entry's are DataLossError (naming the key); a
// big-endian bundle, a partitioned (sliced) variable or a dtype kiln has no tensor for
// is UnimplementedError.
//
// Numeric tensors borrow the mapped shard when their offset is 64-byte aligned (the
// alignment of kiln's allocator) and are copied otherwise; either way the bytes are
// checked against the CRC once, when read. Thread-safety: immutable after open.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "tensorflow/core/protobuf/tensor_bundle.pb.h"

namespace kiln {
class MappedFile;
}

namespace kiln::tf {

class TensorBundle {
 public:
  // prefix: ".../variables/variables" (without ".index").
  static std::unique_ptr<TensorBundle> open(const std::string& prefix);
  // The same from the index file's bytes (the fuzzer's entry point); the shards are
  // still mapped from `prefix`.
  static std::unique_ptr<TensorBundle> from_index(const std::string& index_bytes, const std::string& prefix);
  ~TensorBundle();

  bool contains(const std::string& key) const { return entries_.count(key) > 0; }
  std::vector<std::string> keys() const;
  const tensorflow::BundleEntryProto& entry(const std::string& key) const;  // NotFoundError
  // A numeric tensor.
  Tensor tensor(const std::string& key) const;
  // A DT_STRING tensor's elements (e.g. "_CHECKPOINTABLE_OBJECT_GRAPH", a scalar).
  std::vector<std::string> strings(const std::string& key) const;
  const std::string& prefix() const { return prefix_; }
  int num_shards() const { return num_shards_; }

 private:
  TensorBundle() = default;
  // The bytes of an entry: the range checked, and the CRC-32C when check_crc (string
  // entries check theirs as they decode).
  std::string_view bytes(const std::string& key, const tensorflow::BundleEntryProto& e,
                         std::shared_ptr<MappedFile>* shard, bool check_crc) const;
  std::string shard_path(int i) const;

  std::string prefix_;
  int num_shards_ = 1;
  std::map<std::string, tensorflow::BundleEntryProto> entries_;
  std::vector<std::shared_ptr<MappedFile>> shards_;  // mapped at open
};

}  // namespace kiln::tf
