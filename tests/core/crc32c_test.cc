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

TEST(Crc32c, MaskRoundTrips) {
  for (uint32_t v : {0u, 1u, 0xe3069283u, 0xffffffffu}) EXPECT_EQ(crc32c_unmask(crc32c_mask(v)), v);
  EXPECT_NE(crc32c_mask(0xe3069283u), 0xe3069283u);
}

}  // namespace
}  // namespace kiln
