#include "records_cmd.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/data/example.h"
#include "kiln/data/idx.h"
#include "kiln/data/tfrecord.h"

namespace kiln::tools {

namespace fs = std::filesystem;
using data::Compression;

CLI::App* add_records_command(CLI::App& app, RecordsArgs& a) {
  auto* c = app.add_subcommand("records", "Inspect TFRecord files; convert IDX data to TFRecord shards of Examples");
  c->require_subcommand(1);
  auto compressions = CLI::IsMember({"none", "gzip", "zlib", "auto"}, CLI::ignore_case);

  a.show = c->add_subcommand("show", "Count a TFRecord file's records and print the first ones");
  a.show->add_option("file", a.file, "TFRecord file")->required();
  a.show->add_option("--limit", a.limit, "Records to print (10)")->check(CLI::NonNegativeNumber);
  a.show->add_option("--compression", a.compression, "none, gzip, zlib or auto (default: detect)")->check(compressions);
  a.show->add_flag("--skip-corrupt", a.skip_corrupt, "Skip corrupt records (and count them) instead of stopping");

  auto writer_options = [&](CLI::App* s) {
    s->add_option("--out", a.out, s == a.from_idx ? "Shard path prefix" : "Output directory")->required();
    s->add_option("--shards", a.shards, "Number of files (1)")->check(CLI::Range(int64_t{1}, int64_t{100000}));
    s->add_option("--compression", a.compression, "none (default), gzip or zlib")
        ->check(CLI::IsMember({"none", "gzip", "zlib"}, CLI::ignore_case));
  };
  a.from_idx = c->add_subcommand(
      "from-idx", "Convert IDX images + labels into PREFIX-00000-of-0000N.tfrecord shards of tf.train.Example "
                  "{image: raw u8 pixels, label, height, width}");
  a.from_idx->add_option("--images", a.images, "IDX file of u8 images [N, H, W] (.gz allowed)")->required();
  a.from_idx->add_option("--labels", a.labels, "IDX file of u8 labels [N]")->required();
  writer_options(a.from_idx);
  a.fashion_mnist = c->add_subcommand(
      "fashion-mnist", "Convert Fashion-MNIST into DIR/{train,test}-0000i-of-0000N.tfrecord (as from-idx)");
  a.fashion_mnist->add_option("--data-dir", a.data_dir, "IDX directory (default: Debian's dataset-fashion-mnist)");
  writer_options(a.fashion_mnist);
  return c;
}

namespace {

std::string printable(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    out += std::isprint(c) ? static_cast<char>(c) : '.';
  }
  return out;
}

std::string hex(std::string_view s, size_t max) {
  std::string out;
  char b[4];
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(s[i]));
    if (i) out += ' ';
    out += b;
  }
  if (s.size() > max) out += " ...";
  return out;
}

bool is_text(std::string_view s) {
  for (char ch : s)
    if (!std::isprint(static_cast<unsigned char>(ch))) return false;
  return true;
}

template <typename T>
std::string list(const std::vector<T>& v, size_t max) {
  std::string out = "[";
  for (size_t i = 0; i < v.size() && i < max; ++i) {
    if (i) out += ", ";
    if constexpr (std::is_floating_point_v<T>) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", static_cast<double>(v[i]));
      out += b;
    } else {
      out += std::to_string(v[i]);
    }
  }
  if (v.size() > max) out += ", ... (" + std::to_string(v.size()) + " values)";
  return out + "]";
}

void print_feature(const std::string& name, const data::Feature& f) {
  std::printf("    %s: %s", name.c_str(), std::string(data::feature_kind_name(f.kind)).c_str());
  switch (f.kind) {
    case data::Feature::kBytes:
      std::printf(" (%zu)", f.bytes.size());
      for (size_t i = 0; i < f.bytes.size() && i < 4; ++i) {
        const std::string& b = f.bytes[i];
        if (is_text(b) && b.size() <= 64) std::printf(" \"%s\"", b.c_str());
        else std::printf(" <%zu bytes: %s>", b.size(), hex(b, 16).c_str());
      }
      if (f.bytes.size() > 4) std::printf(" ...");
      break;
    case data::Feature::kFloat:
      std::printf(" %s", list(f.floats, 8).c_str());
      break;
    case data::Feature::kInt64:
      std::printf(" %s", list(f.ints, 8).c_str());
      break;
    case data::Feature::kNone:
      break;
  }
  std::printf("\n");
}

int show(const RecordsArgs& a) {
  data::TFRecordReaderOptions opt;
  opt.compression = data::parse_compression(a.compression);
  opt.skip_corrupt = a.skip_corrupt;
  opt.on_skip = [](const std::string& why) { std::fprintf(stderr, "kiln: skipped: %s\n", why.c_str()); };
  data::TFRecordReader r(a.file, opt);
  std::string rec;
  uint64_t n = 0, bytes = 0;
  while (r.next(&rec)) {
    if (static_cast<int64_t>(n) < a.limit) {
      std::printf("record %llu  offset %llu  %zu bytes\n", static_cast<unsigned long long>(n),
                  static_cast<unsigned long long>(r.offset() - rec.size() - 16), rec.size());
      // An Example when it decodes and has features (random bytes rarely do; an empty
      // record would decode as an empty Example).
      std::optional<data::Features> ex;
      try {
        data::Features f = data::decode_example(rec);
        if (!f.empty()) ex = std::move(f);
      } catch (const Error&) {
      }
      if (ex) {
        std::printf("  tf.train.Example, %zu features:\n", ex->size());
        for (const auto& [name, f] : *ex) print_feature(name, f);
      } else {
        std::printf("  %s\n  |%s|\n", hex(rec, 32).c_str(), printable(rec, 32).c_str());
      }
    }
    ++n;
    bytes += rec.size();
  }
  std::printf("%s: %llu records, %llu bytes of record data, compression %s", a.file.c_str(),
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(bytes),
              data::compression_name(r.compression() == Compression::kAuto ? Compression::kNone : r.compression()));
  if (a.skip_corrupt) std::printf(", %llu corrupt skipped", static_cast<unsigned long long>(r.records_skipped()));
  std::printf("\n");
  return 0;
}

std::string shard_name(const std::string& prefix, int64_t i, int64_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "-%05lld-of-%05lld.tfrecord", static_cast<long long>(i), static_cast<long long>(n));
  return prefix + b;
}

// Writes images u8 [N, H, W] and labels u8 [N] as `shards` files of Examples,
// consecutive records per shard.
void write_shards(const Tensor& images, const Tensor& labels, const std::string& images_name,
                  const std::string& labels_name, const std::string& prefix, int64_t shards, Compression c) {
  if (images.dtype() != DType::kU8 || images.rank() != 3)
    throw InvalidArgumentError(images_name + ": expected u8 images [N, H, W], got " + images.desc());
  if (labels.dtype() != DType::kU8 || labels.rank() != 1)
    throw InvalidArgumentError(labels_name + ": expected u8 labels [N], got " + labels.desc());
  const int64_t n = images.dim(0), h = images.dim(1), w = images.dim(2);
  if (labels.dim(0) != n)
    throw InvalidArgumentError(images_name + " holds " + std::to_string(n) + " images but " + labels_name + " " +
                               std::to_string(labels.dim(0)) + " labels");
  const auto* px = images.data<uint8_t>();
  const auto* lab = labels.data<uint8_t>();
  const size_t image_bytes = static_cast<size_t>(h * w);
  data::Features f;
  f["height"] = data::Feature::of_ints({h});
  f["width"] = data::Feature::of_ints({w});
  f["image"] = data::Feature::of_bytes({std::string()});
  f["label"] = data::Feature::of_ints({0});
  std::string rec;
  uint64_t total = 0;
  for (int64_t s = 0; s < shards; ++s) {
    const std::string path = shard_name(prefix, s, shards);
    data::TFRecordWriter wr(path, {.atomic = true, .compression = c});
    for (int64_t i = n * s / shards; i < n * (s + 1) / shards; ++i) {
      f["image"].bytes[0].assign(reinterpret_cast<const char*>(px) + i * image_bytes, image_bytes);
      f["label"].ints[0] = lab[i];
      rec.clear();
      data::encode_example(f, &rec);
      wr.write(rec);
    }
    wr.close();
    total += fs::file_size(path);
  }
  std::printf("%lld records [%lld x %lld] -> %s ... %s (%lld shards, %.1f MB, compression %s)\n",
              static_cast<long long>(n), static_cast<long long>(h), static_cast<long long>(w),
              shard_name(prefix, 0, shards).c_str(), shard_name(prefix, shards - 1, shards).c_str(),
              static_cast<long long>(shards), static_cast<double>(total) / 1e6, data::compression_name(c));
}

Compression writer_compression(const std::string& s) { return s == "auto" ? Compression::kNone : data::parse_compression(s); }

}  // namespace

int run_records(const RecordsArgs& a) {
  if (*a.show) return show(a);
  if (*a.from_idx) {
    auto parent = fs::path(a.out).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      throw NotFoundError("output directory " + parent.string() + " does not exist");
    write_shards(data::read_idx(a.images), data::read_idx(a.labels), a.images, a.labels, a.out, a.shards,
                 writer_compression(a.compression));
    return 0;
  }
  if (*a.fashion_mnist) {
    data::FashionMnist d = data::load_fashion_mnist(a.data_dir);
    fs::create_directories(a.out);
    Compression c = writer_compression(a.compression);
    write_shards(d.train_images, d.train_labels, "train images", "train labels", (fs::path(a.out) / "train").string(),
                 a.shards, c);
    write_shards(d.test_images, d.test_labels, "test images", "test labels", (fs::path(a.out) / "test").string(),
                 a.shards, c);
    return 0;
  }
  return 0;
}

}  // namespace kiln::tools
