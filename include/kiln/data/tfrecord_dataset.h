#pragma once
// TFRecord files as a Dataset (tf.data.TFRecordDataset): one string scalar per record.
//
//   auto ds = tfrecord_dataset({"data/train-*.tfrecord"}, {.num_parallel_reads = 4})
//                 .batch(256)
//                 .map([&](const Element& b) { return parser.parse_batch(b[0].strings()); })
//                 .prefetch(kAutotune);
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/tfrecord.h"

namespace kiln::data {

// Counters shared by every pass over a tfrecord_dataset.
struct TFRecordStats {
  std::atomic<uint64_t> records{0};
  std::atomic<uint64_t> bytes{0};    // record payload bytes
  std::atomic<uint64_t> skipped{0};  // corrupt records skipped (skip_corrupt)
};

struct TFRecordDatasetOptions {
  Compression compression = Compression::kNone;  // kAuto detects per file
  // Skip corrupt records and count them (stats->skipped, and a warning on stderr
  // naming the file and offset) instead of failing with DataLossError.
  bool skip_corrupt = false;
  // Files read at once: 1 reads the files one after the other; N > 1 (or kAutotune)
  // interleaves N files record by record, each read on its own thread.
  int64_t num_parallel_reads = 1;
  size_t buffer_bytes = 256 << 10;                // read size per file
  std::shared_ptr<TFRecordStats> stats = nullptr;  // filled when given
};

// `files` are paths or glob patterns (Dataset::list_files: sorted, NotFoundError when
// a pattern matches nothing). Read errors surface from the iterator naming the file
// and byte offset.
Dataset tfrecord_dataset(std::vector<std::string> files, TFRecordDatasetOptions options = {});

}  // namespace kiln::data
