// cache: the first complete pass is recorded, later passes replay it.
//
// In memory: the elements are kept by the node (shared by its iterators). To a file:
// "<filename>.kcache" (docs/formats/cache.md) is written to a temp name during the
// first pass and renamed when the pass completes; a later pass (or a later run of
// the program) reads it instead of the input. A corrupt cache file is an error that
// names it (delete it to rebuild), never silently wrong data.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "dataset_internal.h"
#include "kiln/core/crc32c.h"

namespace kiln::data {
namespace {

constexpr char kMagic[8] = {'K', 'C', 'A', 'C', 'H', 'E', '1', '\n'};

// ---- element (de)serialization ----
// element: u32 payload length | u32 masked crc32c(payload) | payload
// payload: u32 n | n x component; component: u8 kind (0 tensor, 1 string) | u8 dtype |
//          u8 rank | rank x i64 dims | data (tensor: raw bytes; string: per value
//          u64 length + bytes). Names are in the header (u32 n | n x (u32 len, bytes)).

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string encode(const Element& e) {
  std::string p;
  put_u32(p, static_cast<uint32_t>(e.size()));
  for (const auto& v : e.values()) {
    p.push_back(v.is_string() ? 1 : 0);
    p.push_back(static_cast<char>(v.is_string() ? 0 : static_cast<int>(v.tensor().dtype())));
    p.push_back(static_cast<char>(v.rank()));
    for (int64_t d : v.shape()) put_u64(p, static_cast<uint64_t>(d));
    if (v.is_string()) {
      for (const auto& s : v.strings().values) {
        put_u64(p, s.size());
        p += s;
      }
    } else {
      p.append(static_cast<const char*>(v.tensor().raw_data()), v.tensor().nbytes());
    }
  }
  return p;
}

class Reader {
 public:
  Reader(const std::string& data, size_t pos, std::string file) : d_(data), pos_(pos), file_(std::move(file)) {}
  bool at_end() const { return pos_ >= d_.size(); }
  size_t pos() const { return pos_; }
  const char* take(size_t n) {
    if (n > d_.size() - pos_) fail("truncated");
    const char* p = d_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint32_t u32() {
    uint32_t v;
    std::memcpy(&v, take(4), 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v;
    std::memcpy(&v, take(8), 8);
    return v;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw DataLossError(detail::str_cat("cache file ", file_, " is corrupt (", what, " at byte ", pos_,
                                        "); delete it to rebuild the cache"));
  }

 private:
  const std::string& d_;
  size_t pos_;
  std::string file_;
};

Element decode(Reader& r, const std::shared_ptr<Element>& names) {
  uint32_t n = r.u32();
  if (n > 4096) r.fail("component count");
  std::vector<Value> vals;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t kind = static_cast<uint8_t>(*r.take(1));
    uint8_t dt = static_cast<uint8_t>(*r.take(1));
    uint8_t rank = static_cast<uint8_t>(*r.take(1));
    if (kind > 1 || dt >= kNumDTypes || rank > Shape::kMaxRank) r.fail("component header");
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) {
      d = static_cast<int64_t>(r.u64());
      if (d < 0 || d > (int64_t{1} << 40)) r.fail("dimension");
    }
    Shape shape(dims);
    if (kind == 1) {
      std::vector<std::string> s(static_cast<size_t>(shape.numel()));
      for (auto& v : s) {
        uint64_t len = r.u64();
        v.assign(r.take(static_cast<size_t>(len)), static_cast<size_t>(len));
      }
      vals.emplace_back(StringTensor(shape, std::move(s)));
    } else {
      DType dtype = static_cast<DType>(dt);
      size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
      vals.emplace_back(Tensor::from_bytes(r.take(bytes), bytes, shape, dtype));
    }
  }
  return names ? Element::with_names_of(*names, std::move(vals)) : Element(std::move(vals));
}

// Streams a completed cache file: one element in memory at a time, so a file cache
// may be larger than RAM.
class FileReplayIterator : public IteratorImpl {
 public:
  explicit FileReplayIterator(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) throw NotFoundError("cache: cannot open " + path_ + ": " + std::strerror(errno));
    struct stat st{};
    if (::fstat(::fileno(file_), &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
    char magic[sizeof kMagic];
    pos_ = std::fread(magic, 1, sizeof magic, file_);
    if (pos_ != sizeof magic || std::memcmp(magic, kMagic, sizeof kMagic) != 0) fail(0, "bad magic");
    uint32_t n_names;
    std::memcpy(&n_names, read_exact(4, "name count").data(), 4);
    if (n_names > 4096) fail(sizeof kMagic, "name count");
    if (n_names) {
      std::vector<std::string> ns(n_names);
      for (auto& n : ns) {
        std::string len = read_exact(4, "name length");
        uint32_t l;
        std::memcpy(&l, len.data(), 4);
        if (l > size_ - pos_) fail(pos_ - 4, "name length");
        n = read_exact(l, "name");
      }
      names_ = std::make_shared<Element>(std::move(ns), std::vector<Value>(n_names));
    }
  }
  ~FileReplayIterator() override {
    if (file_) std::fclose(file_);
  }
  bool next(Element* out) override {
    const uint64_t start = pos_;
    char head[8];
    size_t got = std::fread(head, 1, 8, file_);
    pos_ += got;
    if (got == 0 && std::feof(file_)) return false;
    if (got != 8) fail(start, "truncated element header");
    uint32_t len, crc;
    std::memcpy(&len, head, 4);
    std::memcpy(&crc, head + 4, 4);
    if (len > size_ - pos_) fail(start, "element length past the end of the file");
    payload_ = read_exact(len, "truncated element");
    if (crc32c_unmask(crc) != crc32c(payload_.data(), payload_.size())) fail(start, "element checksum mismatch");
    Reader r(payload_, 0, path_);
    *out = decode(r, names_);
    return true;
  }

 private:
  [[noreturn]] void fail(uint64_t at, const std::string& what) const {
    throw DataLossError(detail::str_cat("cache file ", path_, " is corrupt (", what, " at byte ", at,
                                        "); delete it to rebuild the cache"));
  }
  std::string read_exact(size_t n, const char* what) {
    std::string b(n, '\0');
    size_t got = n ? std::fread(b.data(), 1, n, file_) : 0;
    pos_ += got;
    if (got != n) fail(pos_, what);
    return b;
  }
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t pos_ = 0;
  uint64_t size_ = 0;
  std::shared_ptr<Element> names_;
  std::string payload_;
};

class CacheNode : public DatasetNode {
 public:
  CacheNode(NodePtr input, std::string filename)
      : DatasetNode("Cache", input->spec(), input->cardinality(), {input}), filename_(std::move(filename)) {}
  std::string params() const override { return filename_.empty() ? "memory" : "file=" + filename_ + ".kcache"; }

  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override;

  // Shared state: the completed cache (memory), guarded by mu_.
  mutable std::mutex mu_;
  mutable std::shared_ptr<const std::vector<Element>> memory_;
  std::string filename_;
};

// Replays a completed cache.
class ReplayIterator : public IteratorImpl {
 public:
  explicit ReplayIterator(std::shared_ptr<const std::vector<Element>> e) : elems_(std::move(e)) {}
  bool next(Element* out) override {
    if (i_ >= elems_->size()) return false;
    *out = (*elems_)[i_++];
    return true;
  }

 private:
  std::shared_ptr<const std::vector<Element>> elems_;
  size_t i_ = 0;
};

// Reads the input and records it; publishes the recording when the input ends.
class RecordIterator : public IteratorImpl {
 public:
  RecordIterator(const CacheNode* node, std::unique_ptr<IteratorImpl> in) : node_(node), in_(std::move(in)) {
    if (!node_->filename_.empty()) {
      path_ = node_->filename_ + ".kcache";
      tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(reinterpret_cast<uintptr_t>(this));
      file_ = std::fopen(tmp_.c_str(), "wb");
      if (!file_) throw FailedPreconditionError("cache: cannot create " + tmp_ + ": " + std::strerror(errno));
      std::fwrite(kMagic, 1, sizeof kMagic, file_);
    }
  }
  ~RecordIterator() override {
    if (file_) {  // pass not completed: no cache
      std::fclose(file_);
      ::unlink(tmp_.c_str());
    }
  }
  bool next(Element* out) override {
    if (!in_->next(out)) {
      finish();
      return false;
    }
    if (file_) {
      if (first_) write_names(*out);
      std::string p = encode(*out);
      std::string head;
      put_u32(head, static_cast<uint32_t>(p.size()));
      put_u32(head, crc32c_mask(crc32c(p.data(), p.size())));
      if (std::fwrite(head.data(), 1, head.size(), file_) != head.size() ||
          std::fwrite(p.data(), 1, p.size(), file_) != p.size())
        throw DataLossError("cache: writing " + tmp_ + " failed: " + std::strerror(errno));
    } else {
      recorded_.push_back(*out);
    }
    first_ = false;
    return true;
  }

 private:
  void write_names(const Element& e) {
    std::string h;
    put_u32(h, static_cast<uint32_t>(e.names().size()));
    for (const auto& n : e.names()) {
      put_u32(h, static_cast<uint32_t>(n.size()));
      h += n;
    }
    std::fwrite(h.data(), 1, h.size(), file_);
  }
  void finish() {
    if (file_) {
      if (first_) write_names(Element{});
      bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
      std::fclose(file_);
      file_ = nullptr;
      if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        ::unlink(tmp_.c_str());
        throw DataLossError("cache: cannot complete " + path_ + ": " + std::strerror(errno));
      }
      return;
    }
    std::lock_guard<std::mutex> lk(node_->mu_);
    if (!node_->memory_)
      node_->memory_ = std::make_shared<const std::vector<Element>>(std::move(recorded_));
  }

  const CacheNode* node_;
  std::unique_ptr<IteratorImpl> in_;
  std::vector<Element> recorded_;
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  bool first_ = true;
};

std::unique_ptr<IteratorImpl> CacheNode::make(const IterContext& ctx) const {
  if (filename_.empty()) {
    std::lock_guard<std::mutex> lk(mu_);
    if (memory_) return std::make_unique<ReplayIterator>(memory_);
  } else if (::access((filename_ + ".kcache").c_str(), F_OK) == 0) {
    return std::make_unique<FileReplayIterator>(filename_ + ".kcache");
  }
  return std::make_unique<RecordIterator>(this, inputs()[0]->make(ctx));
}

}  // namespace

NodePtr make_cache_node(NodePtr input, std::string filename) {
  return std::make_shared<CacheNode>(std::move(input), std::move(filename));
}

}  // namespace kiln::data
