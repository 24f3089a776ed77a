// TensorFlow's TensorBundle: the index through libleveldb's table reader, the shards
// memory-mapped (tf_bundle.h).
#include "tf_bundle.h"

#include <leveldb/env.h>
#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/table.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "tf_types.h"

namespace kiln::tf {
namespace {

// LevelDB reads the table through this: the index file's bytes, already in memory.
class BytesFile : public leveldb::RandomAccessFile {
 public:
  explicit BytesFile(const std::string& bytes) : bytes_(bytes) {}
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result, char* /*scratch*/) const override {
    if (offset > bytes_.size()) return leveldb::Status::IOError("read past the end");
    *result = leveldb::Slice(bytes_.data() + offset, std::min<size_t>(n, bytes_.size() - offset));
    return leveldb::Status::OK();
  }

 private:
  const std::string& bytes_;
};

constexpr size_t kBorrowAlignment = 64;

// LevelDB allocates the size a block handle claims before it reads the block, so a
// hostile index could make it allocate terabytes. Every handle it will follow is checked
// against the file first: the footer's (metaindex, index) and the index block's (one per
// data block). The table format: blocks of entries (varint32 shared, non-shared and
// value lengths, the key delta, the value), a uint32 restart array and its count, then a
// 5-byte trailer (compression type, CRC); a 48-byte footer ends the file.
void check_block_handles(const std::string& b, const std::string& path) {
  constexpr size_t kFooter = 48, kTrailer = 5;
  auto bad = [&](const std::string& why) { return DataLossError(path + " is not a TensorBundle index: " + why); };
  if (b.size() < kFooter) throw bad(std::to_string(b.size()) + " bytes, shorter than a table's footer");
  uint64_t magic;
  std::memcpy(&magic, b.data() + b.size() - 8, 8);
  if (magic != 0xdb4775248b80fb57ull) throw bad("no table magic number at its end (truncated or not a table)");
  auto varint = [&](size_t& p, size_t end) {
    uint64_t v = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
      if (p >= end) throw bad("a varint runs past its block at byte " + std::to_string(p));
      const auto byte = static_cast<uint8_t>(b[p++]);
      v |= uint64_t{byte & 0x7fu} << shift;
      if (!(byte & 0x80)) return v;
    }
    throw bad("a varint longer than 10 bytes at byte " + std::to_string(p));
  };
  struct Handle {
    uint64_t offset, size;
  };
  auto handle = [&](size_t& p, size_t end, const std::string& what) {
    const Handle h{varint(p, end), varint(p, end)};
    if (h.offset > b.size() || h.size > b.size() - h.offset || b.size() - h.offset - h.size < kTrailer)
      throw bad(what + " block at [" + std::to_string(h.offset) + ", +" + std::to_string(h.size) +
                ") lies beyond the file's " + std::to_string(b.size()) + " bytes");
    return h;
  };
  size_t p = b.size() - kFooter;
  (void)handle(p, b.size() - 8, "the metaindex");
  const Handle index = handle(p, b.size() - 8, "the index");
  const auto type = static_cast<uint8_t>(b[index.offset + index.size]);
  if (type > 1) throw bad("block compression type " + std::to_string(type));
  if (type != 0)
    throw UnimplementedError(path + ": a compressed index block (TensorFlow writes bundle indexes uncompressed)");
  const size_t begin = index.offset, end = index.offset + index.size;
  if (index.size < 4) throw bad("an index block of " + std::to_string(index.size) + " bytes");
  uint32_t restarts;
  std::memcpy(&restarts, b.data() + end - 4, 4);
  if (restarts > (index.size - 4) / 4) throw bad("the index block's restart count " + std::to_string(restarts));
  const size_t entries_end = end - 4 - 4 * size_t{restarts};
  for (size_t q = begin; q < entries_end;) {
    (void)varint(q, entries_end);  // shared key bytes
    const uint64_t non_shared = varint(q, entries_end), value_len = varint(q, entries_end);
    if (non_shared > entries_end - q || value_len > entries_end - q - non_shared)
      throw bad("an index entry runs past its block at byte " + std::to_string(q));
    q += non_shared;
    size_t v = q;
    (void)handle(v, q + value_len, "a data");
    q += value_len;
  }
}

// Elements of a DT_STRING entry: varint64 lengths, the masked CRC-32C of the lengths
// (4 bytes), then the bytes of each string. The checksums run over each length as 4
// little-endian bytes (not its varint), then the 4 checksum bytes, then the strings:
// the whole is the entry's CRC-32C.
std::vector<std::string> decode_strings(std::string_view b, int64_t n, uint32_t entry_crc, const std::string& what) {
  std::vector<uint64_t> lens;
  size_t pos = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
      if (pos >= b.size() || shift > 63) throw DataLossError(what + ": string lengths are truncated");
      const auto byte = static_cast<uint8_t>(b[pos++]);
      v |= uint64_t{byte & 0x7fu} << shift;
      if (!(byte & 0x80)) break;
      shift += 7;
    }
    lens.push_back(v);
  }
  uint32_t crc = 0;
  for (uint64_t len : lens) {
    const auto len32 = static_cast<uint32_t>(len);  // little-endian host
    crc = crc32c_extend(crc, &len32, sizeof len32);
  }
  if (n > 0) {
    if (b.size() - pos < 4) throw DataLossError(what + ": the lengths' checksum is missing");
    uint32_t stored;
    std::memcpy(&stored, b.data() + pos, 4);
    if (crc32c_unmask(stored) != crc) throw DataLossError(what + ": the string lengths fail their CRC-32C");
    crc = crc32c_extend(crc, b.data() + pos, 4);
    pos += 4;
  }
  std::vector<std::string> out;
  for (uint64_t len : lens) {
    if (len > b.size() - pos) throw DataLossError(what + ": a string runs past the entry's end");
    out.emplace_back(b.substr(pos, len));
    crc = crc32c_extend(crc, b.data() + pos, len);
    pos += len;
  }
  if (pos != b.size()) throw DataLossError(what + ": " + std::to_string(b.size() - pos) + " bytes after the strings");
  if (crc != crc32c_unmask(entry_crc)) throw DataLossError(what + " fails its CRC-32C: the file is corrupted");
  return out;
}

}  // namespace

TensorBundle::~TensorBundle() = default;

std::string TensorBundle::shard_path(int i) const {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".data-%05d-of-%05d", i, num_shards_);
  return prefix_ + buf;
}

std::unique_ptr<TensorBundle> TensorBundle::open(const std::string& prefix) {
  return from_index(read_file(prefix + ".index"), prefix);  // NotFoundError names the index
}

std::unique_ptr<TensorBundle> TensorBundle::from_index(const std::string& bytes, const std::string& prefix) {
  std::unique_ptr<TensorBundle> b(new TensorBundle());
  b->prefix_ = prefix;
  const std::string index_path = prefix + ".index";
  check_block_handles(bytes, index_path);
  BytesFile file(bytes);
  leveldb::Options options;
  options.paranoid_checks = true;
  leveldb::Table* raw = nullptr;
  leveldb::Status st = leveldb::Table::Open(options, &file, bytes.size(), &raw);
  if (!st.ok()) throw DataLossError(index_path + " is not a TensorBundle index: " + st.ToString());
  std::unique_ptr<leveldb::Table> table(raw);
  leveldb::ReadOptions ro;
  ro.verify_checksums = true;
  std::unique_ptr<leveldb::Iterator> it(table->NewIterator(ro));
  bool header = false;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    const leveldb::Slice v = it->value();
    if (key.empty()) {
      tensorflow::BundleHeaderProto h;
      if (!h.ParseFromArray(v.data(), static_cast<int>(v.size())))
        throw DataLossError(index_path + ": the header record does not parse");
      if (h.endianness() != tensorflow::BundleHeaderProto::LITTLE)
        throw UnimplementedError(index_path + ": a big-endian bundle (kiln reads little-endian ones)");
      if (h.num_shards() < 1 || h.num_shards() > 100000)
        throw DataLossError(index_path + ": the header says " + std::to_string(h.num_shards()) + " shards");
      b->num_shards_ = h.num_shards();
      header = true;
      continue;
    }
    tensorflow::BundleEntryProto e;
    if (!e.ParseFromArray(v.data(), static_cast<int>(v.size())))
      throw DataLossError(index_path + ": the entry of '" + key + "' does not parse");
    b->entries_.emplace(key, std::move(e));
  }
  if (!it->status().ok()) throw DataLossError(index_path + " is corrupted: " + it->status().ToString());
  if (!header) throw DataLossError(index_path + " has no header record");
  for (const auto& [key, e] : b->entries_)
    if (e.shard_id() < 0 || e.shard_id() >= b->num_shards_)
      throw DataLossError(index_path + ": '" + key + "' is in shard " + std::to_string(e.shard_id()) + " of " +
                          std::to_string(b->num_shards_));
  for (int i = 0; i < b->num_shards_; ++i) b->shards_.push_back(MappedFile::open(b->shard_path(i)));
  return b;
}

std::vector<std::string> TensorBundle::keys() const {
  std::vector<std::string> k;
  for (const auto& [key, _] : entries_) k.push_back(key);
  return k;
}

const tensorflow::BundleEntryProto& TensorBundle::entry(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) throw NotFoundError(prefix_ + ".index has no tensor '" + key + "'");
  return it->second;
}

std::string_view TensorBundle::bytes(const std::string& key, const tensorflow::BundleEntryProto& e,
                                     std::shared_ptr<MappedFile>* shard, bool check_crc) const {
  const std::shared_ptr<MappedFile>& f = shards_[static_cast<size_t>(e.shard_id())];
  const std::string what = f->path() + ": tensor '" + key + "'";
  if (e.slices_size() > 0)
    throw UnimplementedError(prefix_ + ".index: '" + key + "' is a partitioned variable (" +
                             std::to_string(e.slices_size()) + " slices); kiln reads whole tensors");
  if (e.offset() < 0 || e.size() < 0 || static_cast<uint64_t>(e.offset()) > f->size() ||
      static_cast<uint64_t>(e.size()) > f->size() - static_cast<uint64_t>(e.offset()))
    throw DataLossError(what + " at bytes [" + std::to_string(e.offset()) + ", " +
                        std::to_string(e.offset() + e.size()) + ") is beyond the file's end (" +
                        std::to_string(f->size()) + " bytes): truncated");
  std::string_view b(f->data() + e.offset(), static_cast<size_t>(e.size()));
  if (check_crc && crc32c(b.data(), b.size()) != crc32c_unmask(e.crc32c()))
    throw DataLossError(what + " at byte " + std::to_string(e.offset()) + " fails its CRC-32C: the file is corrupted");
  *shard = f;
  return b;
}

namespace {
Shape entry_shape(const tensorflow::BundleEntryProto& e, const std::string& what) {
  if (e.shape().unknown_rank() || e.shape().dim_size() > 8)
    throw DataLossError(what + ": the shape has an unknown or too large rank");
  std::vector<int64_t> dims;
  for (const auto& d : e.shape().dim()) {
    if (d.size() < 0) throw DataLossError(what + ": dimension " + std::to_string(d.size()));
    dims.push_back(d.size());
  }
  return Shape(dims);
}
}  // namespace

Tensor TensorBundle::tensor(const std::string& key) const {
  const tensorflow::BundleEntryProto& e = entry(key);
  const std::string what = prefix_ + ".index: tensor '" + key + "'";
  const std::optional<DType> dt = from_tf_dtype(e.dtype());
  if (!dt)
    throw UnimplementedError(what + " has dtype " + tensorflow::DataType_Name(e.dtype()) +
                             ", which kiln has no tensors for");
  const Shape shape = entry_shape(e, what);
  std::shared_ptr<MappedFile> shard;
  const std::string_view b = bytes(key, e, &shard, true);
  const uint64_t want = static_cast<uint64_t>(shape.numel()) * dtype_size(*dt);
  if (b.size() != want)
    throw DataLossError(what + " holds " + std::to_string(b.size()) + " bytes; " +
                        std::string(dtype_name(*dt)) + shape.str() + " needs " + std::to_string(want));
  if (e.offset() % kBorrowAlignment == 0 && want > 0) {
    auto storage = std::make_shared<Storage>(const_cast<char*>(b.data()), b.size(), Device::cpu(), shard);
    return Tensor(std::move(storage), 0, shape, *dt);
  }
  return Tensor::from_bytes(b.data(), b.size(), shape, *dt);
}

std::vector<std::string> TensorBundle::strings(const std::string& key) const {
  const tensorflow::BundleEntryProto& e = entry(key);
  const std::string what = prefix_ + ".index: tensor '" + key + "'";
  if (e.dtype() != tensorflow::DT_STRING)
    throw InvalidArgumentError(what + " is " + tensorflow::DataType_Name(e.dtype()) + ", not DT_STRING");
  const Shape shape = entry_shape(e, what);
  std::shared_ptr<MappedFile> shard;
  const std::string_view b = bytes(key, e, &shard, false);
  return decode_strings(b, shape.numel(), e.crc32c(), shard->path() + ": tensor '" + key + "'");
}

}  // namespace kiln::tf
