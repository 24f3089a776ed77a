// Dataset::shard_for_worker: auto-sharding a pipeline of global batches among
// data-parallel workers, by elements (each global batch is exactly the union of the
// workers' batches) and by files (each worker reads its files only).
#include <algorithm>
#include <atomic>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/data/dataset.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::TempDir;
using Batches = std::vector<std::vector<int64_t>>;

// Every batch's i64 values, sorted within the batch.
Batches batches(const Dataset& ds, uint64_t pass) {
  Batches out;
  for (const Element& e : ds.iterator(pass)) {
    const Tensor& t = e.tensor(0);
    std::vector<int64_t> b;
    for (int64_t i = 0; i < t.numel(); ++i) b.push_back(static_cast<int64_t>(t.get_double(i)));
    std::sort(b.begin(), b.end());
    out.push_back(b);
  }
  return out;
}

// Worker parts merged batch by batch (a worker may have one batch fewer at the end).
Batches merged(const std::vector<Batches>& parts) {
  Batches out;
  for (const Batches& p : parts)
    for (size_t k = 0; k < p.size(); ++k) {
      if (out.size() <= k) out.emplace_back();
      out[k].insert(out[k].end(), p[k].begin(), p[k].end());
    }
  for (auto& b : out) std::sort(b.begin(), b.end());
  return out;
}

TEST(ShardForWorker, ByElementsEachGlobalBatchIsTheUnionOfTheWorkersBatches) {
  std::atomic<int> maps{0};
  auto counted = [&maps](const Element& e) {
    ++maps;
    return e;
  };
  // 21 elements in batches of 4: the last global batch has one element (worker 1's part
  // of it is empty: it has one batch fewer).
  const Dataset ds = Dataset::range(21).shuffle(21, 5).map(counted).batch(4).prefetch(2);
  std::vector<Batches> parts;
  for (int w = 0; w < 2; ++w) {
    WorkerShard s = ds.shard_for_worker(2, w);
    ASSERT_TRUE(s.sharded) << s.how;
    EXPECT_NE(s.how.find("by elements (AUTO)"), std::string::npos) << s.how;
    EXPECT_NE(s.how.find("batch 4 -> 2 per worker"), std::string::npos) << s.how;
    // The shard sits under the map: each worker maps its elements only.
    const std::string d = s.dataset.describe();
    EXPECT_LT(d.find("Shard"), d.find("Map")) << d;
    maps = 0;
    parts.push_back(batches(s.dataset, 1));
    EXPECT_EQ(maps.load(), w == 0 ? 11 : 10);
  }
  const Batches global = batches(ds, 1);
  ASSERT_EQ(global.size(), 6u);
  EXPECT_EQ(parts[0].size(), 6u);
  EXPECT_EQ(parts[1].size(), 5u);
  for (const auto& b : parts[0]) EXPECT_LE(b.size(), 2u);
  EXPECT_EQ(merged(parts), global);
  // Another pass reshuffles the same way on every worker.
  EXPECT_EQ(merged({batches(ds.shard_for_worker(2, 0).dataset, 2), batches(ds.shard_for_worker(2, 1).dataset, 2)}),
            batches(ds, 2));
  EXPECT_NE(batches(ds, 2), global);
}

TEST(ShardForWorker, DropRemainderKeepsTheNumberOfBatches) {
  // 11 elements, batches of 4 dropping the rest: 2 global batches; worker 0 has 6
  // elements (3 batches of 2 without the limit).
  const Dataset ds = Dataset::range(11).batch(4, /*drop_remainder=*/true);
  std::vector<Batches> parts;
  for (int w = 0; w < 2; ++w) {
    WorkerShard s = ds.shard_for_worker(2, w);
    ASSERT_TRUE(s.sharded) << s.how;
    EXPECT_EQ(s.dataset.cardinality(), 2);
    parts.push_back(batches(s.dataset, 0));
    EXPECT_EQ(parts.back().size(), 2u);
  }
  EXPECT_EQ(merged(parts), (Batches{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(ShardForWorker, ByFilesEachWorkerReadsItsFiles) {
  TempDir dir("shard");
  for (int f = 0; f < 4; ++f) kiln::testing::write_bytes(dir.file("part-" + std::to_string(f) + ".txt"), "x");
  std::atomic<int> opened{0};
  // Each file holds three records: file f gives 10f, 10f+1, 10f+2.
  auto read = [&opened](const Element& e) {
    ++opened;
    const std::string name = e[0].strings().item();
    const int64_t f = name[name.size() - 5] - '0';
    return Dataset::range(10 * f, 10 * f + 3);
  };
  const Dataset ds = Dataset::list_files({dir.file("*.txt")}).interleave(read, {.cycle_length = 1}).batch(2);
  Batches all;
  for (int w = 0; w < 2; ++w) {
    WorkerShard s = ds.shard_for_worker(2, w);
    ASSERT_TRUE(s.sharded) << s.how;
    EXPECT_NE(s.how.find("by files (AUTO): worker " + std::to_string(w) + " reads files"), std::string::npos) << s.how;
    opened = 0;
    const Batches b = batches(s.dataset, 0);
    EXPECT_EQ(opened.load(), 2) << "each worker opens its 2 of the 4 files";
    std::vector<int64_t> seen;
    for (const auto& x : b) {
      EXPECT_EQ(x.size(), 1u);  // batch 2 -> 1 per worker
      seen.insert(seen.end(), x.begin(), x.end());
    }
    std::vector<int64_t> want;
    for (int f = w; f < 4; f += 2)
      for (int i = 0; i < 3; ++i) want.push_back(10 * f + i);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, want);
  }
  // Fewer files than workers: AUTO shards by elements, FILE refuses.
  WorkerShard eight = ds.batch(8).shard_for_worker(8, 3);  // (batches of 2, batched by 8)
  EXPECT_NE(eight.how.find("by elements"), std::string::npos) << eight.how;
  PipelineOptions file;
  file.auto_shard_policy = AutoShardPolicy::kFile;
  EXPECT_KILN_ERROR(ds.with_options(file).shard_for_worker(8, 0), kInvalidArgument,
                    "auto_shard_policy FILE, but the batch size 2 does not divide among 8 workers");
  EXPECT_KILN_ERROR(ds.unbatch().batch(8).with_options(file).shard_for_worker(8, 0), kInvalidArgument,
                    "the pipeline has 4 files for 8 workers");
  EXPECT_KILN_ERROR(Dataset::range(8).batch(2).with_options(file).shard_for_worker(2, 0), kInvalidArgument,
                    "no list_files source under the batch");
  // DATA shards by elements even where there are files.
  PipelineOptions data;
  data.auto_shard_policy = AutoShardPolicy::kData;
  EXPECT_NE(ds.with_options(data).shard_for_worker(2, 0).how.find("by elements (DATA)"), std::string::npos);
}

TEST(ShardForWorker, WhatIsNotShardedSaysWhy) {
  const Dataset ds = Dataset::range(10).batch(4);
  auto expect_whole = [](const WorkerShard& s, const std::string& why) {
    EXPECT_FALSE(s.sharded);
    EXPECT_NE(s.how.find(why), std::string::npos) << s.how;
  };
  expect_whole(ds.shard_for_worker(1, 0), "one worker");
  PipelineOptions off;
  off.auto_shard_policy = AutoShardPolicy::kOff;
  expect_whole(ds.with_options(off).shard_for_worker(2, 1), "auto_shard_policy is OFF");
  expect_whole(Dataset::range(10).batch(5).shard_for_worker(2, 0), "the batch size 5 does not divide among 2 workers");
  expect_whole(Dataset::range(10).shard_for_worker(2, 0), "no batch()");
  expect_whole(Dataset::zip({ds, ds}).shard_for_worker(2, 0), "no batch()");
  // The whole pipeline comes back: every worker reads every global batch.
  EXPECT_EQ(batches(ds.with_options(off).shard_for_worker(2, 1).dataset, 0), batches(ds, 0));
  EXPECT_KILN_ERROR(ds.shard_for_worker(0, 0), kInvalidArgument, "num_workers must be >= 1");
  EXPECT_KILN_ERROR(ds.shard_for_worker(2, 2), kInvalidArgument, "index must be in [0, 2)");
}

}  // namespace
}  // namespace kiln::data
