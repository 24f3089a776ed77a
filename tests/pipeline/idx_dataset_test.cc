#include "kiln/data/idx.h"

#include "test_util.h"

namespace kiln::data {
namespace {

// An IDX file: magic 0x00000801 + rank-1 u8 data, or 0x00000803 for rank 3.
std::string idx_u8(std::vector<uint32_t> dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) s.push_back(static_cast<char>(d >> (8 * k)));
  s.append(data.begin(), data.end());
  return s;
}

TEST(IdxDataset, ZipsRowsOfEveryFile) {
  kiln::testing::TempDir dir("idxds");
  std::vector<uint8_t> px(3 * 2 * 2);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  kiln::testing::write_bytes(dir.file("images"), idx_u8({3, 2, 2}, px));
  kiln::testing::write_bytes(dir.file("labels"), idx_u8({3}, {7, 8, 9}));
  kiln::testing::write_bytes(dir.file("short"), idx_u8({2}, {1, 2}));
  Dataset ds = idx_dataset({dir.file("images"), dir.file("labels")});
  EXPECT_EQ(ds.cardinality(), 3);
  EXPECT_EQ(ds.element_spec().str(), "(u8[2, 2], u8[])");
  std::vector<int> labels;
  std::vector<uint8_t> second;
  for (const Element& e : ds.iterator()) {
    labels.push_back(e.tensor(1).item<int>());
    if (labels.size() == 2) second = e.tensor(0).to_vector<uint8_t>();
  }
  EXPECT_EQ(labels, (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(second, (std::vector<uint8_t>{4, 5, 6, 7}));
  EXPECT_KILN_ERROR(idx_dataset({dir.file("images"), dir.file("short")}), kInvalidArgument, "has 2 rows");
  EXPECT_KILN_ERROR(idx_dataset({dir.file("missing")}), kNotFound, "missing");
}

}  // namespace
}  // namespace kiln::data
