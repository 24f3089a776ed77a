#include "kiln/core/npy.h"

#include <cctype>
#include <cstring>

#include "kiln/core/file_io.h"

namespace kiln {
namespace {

[[noreturn]] void bad(const std::string& why) { throw DataLossError("malformed .npy data: " + why); }

struct HeaderParser {
  std::string_view s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) bad(std::string("expected '") + c + "' at header offset " + std::to_string(i));
  }
  std::string str() {
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) bad("expected a quoted string in header");
    char q = s[i++];
    size_t start = i;
    while (i < s.size() && s[i] != q) ++i;
    if (i >= s.size()) bad("unterminated string in header");
    return std::string(s.substr(start, i++ - start));
  }
  std::string word() {
    ws();
    size_t start = i;
    while (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
    return std::string(s.substr(start, i - start));
  }
  int64_t integer() {
    ws();
    size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start || i - start > 15) bad("bad dimension in shape");
    int64_t v = 0;
    for (size_t k = start; k < i; ++k) v = v * 10 + (s[k] - '0');
    // numpy may write 'L' suffixes (python 2 files)
    if (i < s.size() && s[i] == 'L') ++i;
    return v;
  }
};

DType dtype_from_descr(const std::string& d) {
  if (d.size() < 2) bad("bad descr '" + d + "'");
  char order = d[0];
  std::string code = d.substr(1);
  bool one_byte = code == "b1" || code == "u1" || code == "i1" || code == "?";
  if (order == '>' && !one_byte) throw InvalidArgumentError("big-endian .npy arrays ('" + d + "') are not supported");
  if (order != '<' && order != '|' && order != '=' && order != '>') bad("bad byte order in descr '" + d + "'");
  if (code == "f4") return DType::kF32;
  if (code == "f8") return DType::kF64;
  if (code == "f2") return DType::kF16;
  if (code == "i4") return DType::kI32;
  if (code == "i8") return DType::kI64;
  if (code == "i1") return DType::kI8;
  if (code == "u1") return DType::kU8;
  if (code == "b1" || code == "?") return DType::kBool;
  throw InvalidArgumentError(".npy dtype '" + d + "' is not supported by kiln");
}

const char* descr_for(DType t) {
  switch (t) {
    case DType::kF32: return "<f4";
    case DType::kF64: return "<f8";
    case DType::kF16: return "<f2";
    case DType::kI32: return "<i4";
    case DType::kI64: return "<i8";
    case DType::kI8: return "|i1";
    case DType::kU8: return "|u1";
    case DType::kBool: return "|b1";
    case DType::kBF16: break;
  }
  throw InvalidArgumentError("numpy has no bfloat16: convert the tensor to f32 before writing .npy");
}

}  // namespace

Tensor parse_npy(std::string_view b) {
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) bad("missing \\x93NUMPY magic");
  uint8_t major = static_cast<uint8_t>(b[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<uint8_t>(b[8]) | (static_cast<size_t>(static_cast<uint8_t>(b[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) bad("truncated header length");
    header_len = 0;
    for (int k = 0; k < 4; ++k) header_len |= static_cast<size_t>(static_cast<uint8_t>(b[8 + k])) << (8 * k);
    header_start = 12;
  } else {
    bad("unsupported format version " + std::to_string(major));
  }
  if (header_len > b.size() - header_start) bad("header longer than the file");
  HeaderParser p{b.substr(header_start, header_len)};
  std::string descr;
  bool fortran = false, have_descr = false, have_shape = false;
  std::vector<int64_t> dims;
  p.expect('{');
  while (!p.eat('}')) {
    std::string key = p.str();
    p.expect(':');
    if (key == "descr") {
      descr = p.str();
      have_descr = true;
    } else if (key == "fortran_order") {
      std::string w = p.word();
      if (w != "True" && w != "False") bad("fortran_order must be True or False");
      fortran = w == "True";
    } else if (key == "shape") {
      p.expect('(');
      while (!p.eat(')')) {
        dims.push_back(p.integer());
        if (dims.size() > static_cast<size_t>(Shape::kMaxRank)) bad("too many dimensions");
        p.eat(',');
        if (p.i >= p.s.size()) bad("unterminated shape");
      }
      have_shape = true;
    } else {
      bad("unknown header key '" + key + "'");
    }
    p.eat(',');
    if (p.i >= p.s.size()) bad("unterminated header dictionary");
  }
  if (!have_descr || !have_shape) bad("header lacks descr or shape");
  if (fortran) throw InvalidArgumentError("Fortran-order .npy arrays are not supported; save with order='C'");
  DType dt = dtype_from_descr(descr);
  Shape shape(dims);
  // Guard the product against overflow before trusting it.
  unsigned __int128 n = 1;
  for (int64_t d : dims) {
    n *= static_cast<unsigned __int128>(d);
    if (n > (static_cast<unsigned __int128>(1) << 50)) bad("shape " + shape.str() + " is too large");
  }
  size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  size_t data_start = header_start + header_len;
  if (b.size() - data_start != bytes)
    bad("expected " + std::to_string(bytes) + " data bytes for " + std::string(dtype_name(dt)) + shape.str() + ", found " +
        std::to_string(b.size() - data_start));
  Tensor t = Tensor::from_bytes(b.data() + data_start, bytes, shape, dt);
  if (dt == DType::kBool) {
    uint8_t* q = static_cast<uint8_t*>(t.raw_data());
    for (size_t k = 0; k < bytes; ++k) q[k] = q[k] != 0;
  }
  return t;
}

Tensor read_npy(const std::string& path) {
  std::string bytes = read_file(path);
  try {
    return parse_npy(bytes);
  } catch (const DataLossError& e) {
    throw DataLossError(path + ": " + e.message());
  }
}

std::string serialize_npy(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::string header = std::string("{'descr': '") + descr_for(h.dtype()) + "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < h.rank(); ++i) header += std::to_string(h.shape()[i]) + (h.rank() == 1 || i + 1 < h.rank() ? "," : "");
  header += "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(static_cast<const char*>(h.raw_data()), h.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& t) { write_file_atomic(path, serialize_npy(t)); }

}  // namespace kiln
