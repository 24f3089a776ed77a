// GGUF reader: one pass over the header, metadata and tensor infos, every read bounds-
// checked; errors name the field and its byte offset.
#include "kiln/llm/gguf.h"

#include <algorithm>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"

namespace kiln::llm {

using detail::str_cat;

const char* gguf_type_name(GgufType type) {
  static constexpr const char* kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

namespace {

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;  // string, array: variable
  }
}

// Decodes one little-endian scalar of type t at p.
void read_scalar(GgufType t, const char* p, GgufValue& v) {
  switch (t) {
    case GgufType::kU8: v.num.u = static_cast<uint8_t>(*p); return;
    case GgufType::kI8: v.num.i = static_cast<int8_t>(*p); return;
    case GgufType::kBool: v.num.u = *p != 0; return;
    case GgufType::kU16: { uint16_t x; std::memcpy(&x, p, 2); v.num.u = x; return; }
    case GgufType::kI16: { int16_t x; std::memcpy(&x, p, 2); v.num.i = x; return; }
    case GgufType::kU32: { uint32_t x; std::memcpy(&x, p, 4); v.num.u = x; return; }
    case GgufType::kI32: { int32_t x; std::memcpy(&x, p, 4); v.num.i = x; return; }
    case GgufType::kF32: { float x; std::memcpy(&x, p, 4); v.num.f = x; return; }
    case GgufType::kU64: std::memcpy(&v.num.u, p, 8); return;
    case GgufType::kI64: std::memcpy(&v.num.i, p, 8); return;
    case GgufType::kF64: std::memcpy(&v.num.f, p, 8); return;
    default: return;
  }
}

constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxDims = 4;  // GGML_MAX_DIMS

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64: return true;
    default: return false;
  }
}

namespace {
// Element i of a numeric array as a scalar value.
GgufValue element(const GgufValue& a, uint64_t i) {
  if (a.type != GgufType::kArray || i >= a.count || a.raw == nullptr)
    throw OutOfRangeError(str_cat("GGUF array element ", i, " of ", a.count, " numbers"));
  GgufValue v;
  v.type = a.element_type;
  read_scalar(a.element_type, a.raw + i * scalar_size(a.element_type), v);
  return v;
}
}  // namespace

// Unsigned scalars below 64 bits leave num.i equal to num.u (the upper bits are zero).
double GgufValue::number_at(uint64_t i) const {
  const GgufValue v = element(*this, i);
  if (v.is_float()) return v.num.f;
  return v.type == GgufType::kU64 ? static_cast<double>(v.num.u) : static_cast<double>(v.num.i);
}

int64_t GgufValue::integer_at(uint64_t i) const {
  const GgufValue v = element(*this, i);
  if (v.is_float()) throw InvalidArgumentError(str_cat("GGUF array of ", gguf_type_name(element_type), " read as integers"));
  if (v.type == GgufType::kU64 && v.num.u > static_cast<uint64_t>(INT64_MAX))
    throw OutOfRangeError(str_cat("GGUF array element ", i, " = ", v.num.u, " does not fit in int64"));
  return v.num.i;
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // checked against overflow at open
  return n;
}

// The parser: a cursor over the bytes; every read names what it reads.
class GgufParser {
 public:
  GgufParser(GgufFile& f) : f_(f), p_(f.data_), n_(f.size_) {}

  void run() {
    if (n_ < 4 || std::memcmp(p_, "GGUF", 4) != 0)
      fail(0, n_ < 4 ? str_cat("file is ", n_, " bytes, too short for the magic 'GGUF'")
                     : "magic is not 'GGUF' (not a GGUF file)");
    pos_ = 4;
    const uint32_t version = u32("version");
    if (version == 1) throw UnimplementedError(f_.name_ + ": GGUF version 1 is not supported (kiln reads versions 2 and 3)");
    if (version != 2 && version != 3) {
      if ((version & 0xFFFFFF) == 0 && (version >> 24) >= 1 && (version >> 24) <= 3)
        throw UnimplementedError(f_.name_ + ": big-endian GGUF is not supported (kiln reads little-endian files)");
      fail(4, str_cat("version is ", version, ", expected 2 or 3"));
    }
    f_.version_ = version;
    const uint64_t n_tensors = u64("tensor count");
    const uint64_t n_kv = u64("metadata count");
    // Every metadata pair takes at least 8 (key length) + 4 (type) + 1 bytes, every tensor info 8 + 4 + 4 + 8.
    if (n_kv > (n_ - pos_) / 13) fail(16, str_cat("metadata count ", n_kv, " cannot fit in the file's ", n_, " bytes"));
    if (n_tensors > (n_ - pos_) / 24) fail(8, str_cat("tensor count ", n_tensors, " cannot fit in the file's ", n_, " bytes"));

    f_.kvs_.reserve(n_kv);
    for (uint64_t k = 0; k < n_kv; ++k) {
      const uint64_t at = pos_;
      GgufKv kv;
      kv.offset = at;
      kv.key = string(str_cat("key of metadata pair ", k));
      if (kv.key.empty()) fail(at, str_cat("metadata pair ", k, " has an empty key"));
      const uint64_t type_at = pos_;
      const uint32_t type = u32(str_cat("type of metadata '", kv.key, "'"));
      if (type > static_cast<uint32_t>(GgufType::kF64))
        fail(type_at, str_cat("metadata '", kv.key, "' has value type ", type, ", which is not a GGUF type (0..12)"));
      value(static_cast<GgufType>(type), kv.value, kv.key, 0);
      if (!f_.kv_index_.emplace(kv.key, f_.kvs_.size()).second)
        fail(at, str_cat("metadata key '", kv.key, "' appears twice"));
      f_.kvs_.push_back(std::move(kv));
    }

    if (const GgufValue* a = f_.find("general.alignment")) {
      if (a->type != GgufType::kU32 || a->num.u == 0 || (a->num.u & (a->num.u - 1)) != 0)
        fail(f_.kvs_[f_.kv_index_.at("general.alignment")].offset,
             str_cat("general.alignment must be a u32 power of two, it is ",
                     a->type == GgufType::kU32 ? std::to_string(a->num.u) : std::string("a ") + gguf_type_name(a->type)));
      f_.alignment_ = a->num.u;
    }

    std::vector<uint64_t> info_offsets;
    f_.tensors_.reserve(n_tensors);
    for (uint64_t t = 0; t < n_tensors; ++t) {
      const uint64_t at = pos_;
      info_offsets.push_back(at);
      GgufTensor ti{};
      ti.name = string(str_cat("name of tensor ", t));
      const std::string what = str_cat("tensor '", ti.name, "'");
      const uint64_t dims_at = pos_;
      const uint32_t n_dims = u32(what + " dimension count");
      if (n_dims == 0 || n_dims > kMaxDims) fail(dims_at, str_cat(what, " has ", n_dims, " dimensions, expected 1 to ", kMaxDims));
      int64_t elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t dim_at = pos_;
        const uint64_t dim = u64(str_cat(what, " dimension ", d));
        if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, static_cast<int64_t>(dim), &elements))
          fail(dim_at, str_cat(what, " dimension ", d, " = ", dim, " overflows the element count"));
        ti.dims.push_back(static_cast<int64_t>(dim));
      }
      const uint64_t type_at = pos_;
      const uint32_t type = u32(what + " type");
      const GgmlTypeInfo* info = ggml_type_info(type);
      if (info == nullptr) fail(type_at, str_cat(what, " has type id ", type, ", which is not a ggml type"));
      ti.type = static_cast<GgmlType>(type);
      if (ti.dims[0] % info->block_elements != 0)
        fail(dims_at, str_cat(what, " rows have ", ti.dims[0], " elements, not a multiple of the ", info->name, " block (",
                              info->block_elements, ")"));
      const uint64_t blocks = static_cast<uint64_t>(elements / info->block_elements);
      if (blocks > SIZE_MAX / info->block_bytes) fail(dims_at, what + " is larger than the address space");
      ti.nbytes = blocks * info->block_bytes;
      const uint64_t off_at = pos_;
      ti.offset = u64(what + " data offset");
      if (ti.offset % f_.alignment_ != 0)
        fail(off_at, str_cat(what, " data offset ", ti.offset, " is not a multiple of the alignment ", f_.alignment_));
      if (!f_.tensor_index_.emplace(ti.name, f_.tensors_.size()).second)
        fail(at, str_cat("tensor name '", ti.name, "' appears twice"));
      f_.tensors_.push_back(std::move(ti));
    }

    // The data section starts at the next multiple of the alignment.
    uint64_t data = pos_;
    if (data % f_.alignment_ != 0) data += f_.alignment_ - data % f_.alignment_;
    f_.data_offset_ = data;
    if (!f_.tensors_.empty() && data > n_)
      fail(pos_, str_cat("the data section would start at ", data, ", past the end of the file (", n_, " bytes)"));
    const uint64_t section = n_ - std::min<uint64_t>(data, n_);
    std::vector<size_t> order(f_.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return f_.tensors_[a].offset < f_.tensors_[b].offset; });
    uint64_t end_prev = 0;
    const GgufTensor* prev = nullptr;
    for (size_t i : order) {
      GgufTensor& ti = f_.tensors_[i];
      if (ti.offset > section || ti.nbytes > section - ti.offset)
        fail(info_offsets[i], str_cat("tensor '", ti.name, "' (", ti.nbytes, " bytes at data offset ", ti.offset,
                                      ") runs past the end of the file: the data section has ", section, " bytes"));
      if (prev != nullptr && ti.offset < end_prev)
        fail(info_offsets[i], str_cat("tensor '", ti.name, "' at data offset ", ti.offset, " overlaps tensor '", prev->name,
                                      "' (which ends at ", end_prev, ")"));
      ti.data = reinterpret_cast<const uint8_t*>(f_.data_) + data + ti.offset;
      end_prev = ti.offset + ti.nbytes;
      prev = &ti;
    }
  }

 private:
  [[noreturn]] void fail(uint64_t offset, const std::string& msg) const {
    throw DataLossError(str_cat(f_.name_, ": ", msg, " (byte offset ", offset, ")"));
  }
  void need(uint64_t bytes, const std::string& what) const {
    if (bytes > n_ - pos_)
      fail(pos_, str_cat(what, " needs ", bytes, " bytes, but the file ends after ", n_ - pos_, " (truncated)"));
  }
  uint32_t u32(const std::string& what) {
    need(4, what);
    uint32_t x;
    std::memcpy(&x, p_ + pos_, 4);
    pos_ += 4;
    return x;
  }
  uint64_t u64(const std::string& what) {
    need(8, what);
    uint64_t x;
    std::memcpy(&x, p_ + pos_, 8);
    pos_ += 8;
    return x;
  }
  std::string_view string(const std::string& what) {
    const uint64_t len = u64(what + " length");
    if (len > n_ - pos_) fail(pos_ - 8, str_cat(what, " is ", len, " bytes long, but the file ends after ", n_ - pos_, " (truncated)"));
    std::string_view s(p_ + pos_, len);
    pos_ += len;
    return s;
  }
  void value(GgufType type, GgufValue& v, std::string_view key, int depth) {
    v.type = type;
    const std::string what = str_cat("value of metadata '", key, "'");
    if (type == GgufType::kString) {
      v.str = string(what);
      return;
    }
    if (type != GgufType::kArray) {
      const size_t size = scalar_size(type);
      need(size, what);
      read_scalar(type, p_ + pos_, v);
      pos_ += size;
      return;
    }
    if (depth >= kMaxArrayDepth) fail(pos_, str_cat("metadata '", key, "' nests arrays deeper than ", kMaxArrayDepth));
    const uint64_t type_at = pos_;
    const uint32_t elem = u32(str_cat("element type of metadata '", key, "'"));
    if (elem > static_cast<uint32_t>(GgufType::kF64))
      fail(type_at, str_cat("metadata '", key, "' is an array of type ", elem, ", which is not a GGUF type (0..12)"));
    v.element_type = static_cast<GgufType>(elem);
    const uint64_t count_at = pos_;
    v.count = u64(str_cat("length of metadata '", key, "'"));
    const size_t size = scalar_size(v.element_type);
    const uint64_t min_size = size ? size : (v.element_type == GgufType::kString ? 8 : 12);
    if (v.count > (n_ - pos_) / min_size)
      fail(count_at, str_cat("metadata '", key, "' has ", v.count, " elements of ", gguf_type_name(v.element_type),
                             ", more than the ", n_ - pos_, " bytes left can hold (truncated)"));
    if (size) {
      v.raw = p_ + pos_;
      pos_ += v.count * size;
    } else if (v.element_type == GgufType::kString) {
      v.strings.reserve(v.count);
      for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(string(str_cat("element ", i, " of metadata '", key, "'")));
    } else {
      v.arrays.resize(v.count);
      for (uint64_t i = 0; i < v.count; ++i) value(GgufType::kArray, v.arrays[i], key, depth + 1);
    }
  }

  GgufFile& f_;
  const char* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
};

std::shared_ptr<const GgufFile> GgufFile::parse(const char* data, size_t size, std::string name,
                                                std::shared_ptr<const void> owner) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->name_ = std::move(name);
  f->data_ = data;
  f->size_ = size;
  f->owner_ = std::move(owner);
  GgufParser(*f).run();
  return f;
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> m = MappedFile::open(path);
  const char* data = m->data();
  const size_t size = m->size();
  return parse(data, size, path, std::move(m));
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufValue& GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) throw NotFoundError(str_cat(name_, ": metadata '", key, "' is missing"));
  return *v;
}

namespace {
[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const GgufValue& v, const char* expected) {
  throw InvalidArgumentError(str_cat(file, ": metadata '", key, "' is ", gguf_type_name(v.type),
                                     v.type == GgufType::kArray ? std::string(" of ") + gguf_type_name(v.element_type) : "",
                                     ", expected ", expected));
}
}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(key);
  if (!v.is_integer()) wrong_type(name_, key, v, "an integer");
  if (v.type == GgufType::kU64 && v.num.u > static_cast<uint64_t>(INT64_MAX))
    throw OutOfRangeError(str_cat(name_, ": metadata '", key, "' = ", v.num.u, " does not fit in int64"));
  return v.num.i;
}
int64_t GgufFile::get_int(std::string_view key, int64_t fallback) const { return has(key) ? get_int(key) : fallback; }

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.is_float()) return v.num.f;
  if (v.is_integer()) return v.type == GgufType::kU64 ? static_cast<double>(v.num.u) : static_cast<double>(v.num.i);
  wrong_type(name_, key, v, "a number");
}
double GgufFile::get_float(std::string_view key, double fallback) const { return has(key) ? get_float(key) : fallback; }

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return fallback;
  if (v->type != GgufType::kBool) wrong_type(name_, key, *v, "a bool");
  return v->num.u != 0;
}

std::string_view GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::kString) wrong_type(name_, key, v, "a string");
  return v.str;
}
std::string_view GgufFile::get_string(std::string_view key, std::string_view fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const GgufValue& GgufFile::get_array(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::kArray) wrong_type(name_, key, v, "an array");
  return v;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (t == nullptr) throw NotFoundError(str_cat(name_, ": tensor '", name, "' is missing"));
  return *t;
}

std::vector<float> GgufFile::dequantize(const GgufTensor& t) const {
  std::vector<float> out(static_cast<size_t>(t.elements()));
  dequantize_row(t.type, t.data, out.data(), t.elements());
  return out;
}

}  // namespace kiln::llm
