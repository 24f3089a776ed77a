#include "kiln/data/tfrecord_dataset.h"

#include <iostream>

#include "kiln/core/error.h"

namespace kiln::data {
namespace {

// The records of one file.
Dataset records_of(const std::string& path, const TFRecordDatasetOptions& o) {
  auto make_pass = [path, o]() -> PullFn {
    TFRecordReaderOptions ro;
    ro.compression = o.compression;
    ro.skip_corrupt = o.skip_corrupt;
    ro.buffer_bytes = o.buffer_bytes;
    auto stats = o.stats;
    ro.on_skip = [stats](const std::string& what) {
      if (stats) ++stats->skipped;
      std::cerr << "kiln: skipping corrupt TFRecord data: " << what << "\n";
    };
    auto reader = std::make_shared<TFRecordReader>(path, ro);
    return [reader, stats](Element* out) {
      std::string rec;
      if (!reader->next(&rec)) return false;
      if (stats) {
        ++stats->records;
        stats->bytes += rec.size();
      }
      *out = Element{Value(StringTensor::scalar(std::move(rec)))};
      return true;
    };
  };
  return Dataset::from_generator(ElementSpec{{}, {TypeSpec::string()}}, make_pass, kUnknownCardinality,
                                 "TFRecord(" + path + ")");
}

}  // namespace

Dataset tfrecord_dataset(std::vector<std::string> files, TFRecordDatasetOptions options) {
  KILN_CHECK_ARG(options.num_parallel_reads >= 1 || options.num_parallel_reads == kAutotune,
                 "tfrecord_dataset: num_parallel_reads must be >= 1 or kAutotune, got ", options.num_parallel_reads);
  Dataset names = Dataset::list_files(std::move(files));
  auto open = [options](const Element& e) { return records_of(e[0].strings().item(), options); };
  const ElementSpec spec{{}, {TypeSpec::string()}};
  if (options.num_parallel_reads == 1) return names.interleave(open, {.cycle_length = 1, .output_spec = spec});
  return names.interleave(open, {.cycle_length = options.num_parallel_reads,
                                 .block_length = 1,
                                 .num_parallel_calls = options.num_parallel_reads,
                                 .output_spec = spec});
}

}  // namespace kiln::data
