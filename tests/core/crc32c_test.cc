#include "kiln/core/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln {
namespace {

// Test vectors from RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32c, Rfc3720Vectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, 0);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
}

TEST(Crc32c, ExtendEqualsOnePass) {
  std::string s = "hello, tfrecord world";
  uint32_t a = crc32c_extend(crc32c(s.data(), 5), s.data() + 5, s.size() - 5);
  EXPECT_EQ(a, crc32c(s.data(), s.size()));
}

// Every length and alignment (the fast path works 8 bytes at a time) against a
// bit-by-bit reference (reflected polynomial 0x82F63B78), one pass and extended.
TEST(Crc32c, MatchesBitwiseReferenceAtAnyLengthAndAlignment) {
  auto ref = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
  };
  std::string buf(200, '\0');
  uint32_t x = 12345;
  for (char& ch : buf) ch = static_cast<char>((x = x * 1103515245u + 12345u) >> 23);
  const auto* u = reinterpret_cast<const unsigned char*>(buf.data());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; off + n <= buf.size(); n += (n < 40 ? 1 : 13)) {
      ASSERT_EQ(crc32c(u + off, n), ref(u + off, n)) << off << " " << n;
      size_t k = n / 3;
      ASSERT_EQ(crc32c_extend(crc32c(u + off, k), u + off + k, n - k), ref(u + off, n)) << off << " " << n;
    }
}

TEST(Crc32c, MaskRoundTrips) {
  for (uint32_t v : {0u, 1u, 0xe3069283u, 0xffffffffu}) EXPECT_EQ(crc32c_unmask(crc32c_mask(v)), v);
  EXPECT_NE(crc32c_mask(0xe3069283u), 0xe3069283u);
}

}  // namespace
}  // namespace kiln
