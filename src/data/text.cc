#include "kiln/data/text.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "byte_stream.h"
#include "kiln/core/error.h"

namespace kiln::data {

struct TextLineReader::Impl {
  std::unique_ptr<internal::ByteStream> stream;
  std::string_view chunk;
  size_t pos = 0;
};

namespace {

void check_options(const TextLineOptions& options, const char* what) {
  KILN_CHECK_ARG(options.skip_header_lines >= 0, what, ": skip_header_lines must be >= 0, got ",
                 options.skip_header_lines);
  auto c = options.compression;
  KILN_CHECK_ARG(c == Compression::kNone || c == Compression::kGzip || c == Compression::kZlib ||
                     c == Compression::kAuto,
                 what, ": unknown compression ", static_cast<int>(c));
}

}  // namespace

TextLineReader::TextLineReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TextLineReader::TextLineReader(const std::string& path, const TextLineOptions& options) {
  check_options(options, "TextLineReader");
  impl_ = std::make_unique<Impl>();
  impl_->stream = internal::ByteStream::open(path, "text file", options.compression, options.buffer_bytes);
}

TextLineReader TextLineReader::from_string(std::string data, std::string name, const TextLineOptions& options) {
  check_options(options, "TextLineReader");
  auto impl = std::make_unique<Impl>();
  impl->stream = internal::ByteStream::from_string(std::move(data), std::move(name), "text file",
                                                   options.compression, options.buffer_bytes);
  return TextLineReader(std::move(impl));
}

TextLineReader::~TextLineReader() = default;
TextLineReader::TextLineReader(TextLineReader&&) noexcept = default;
TextLineReader& TextLineReader::operator=(TextLineReader&&) noexcept = default;

bool TextLineReader::next(std::string* line) {
  Impl& s = *impl_;
  line->clear();
  bool any = false;
  for (;;) {
    if (s.pos == s.chunk.size()) {
      s.chunk = s.stream->read();
      s.pos = 0;
      if (s.chunk.empty()) {
        if (!any) return false;
        break;  // a last line without "\n"
      }
    }
    any = true;
    const char* begin = s.chunk.data() + s.pos;
    const char* nl = static_cast<const char*>(std::memchr(begin, '\n', s.chunk.size() - s.pos));
    if (nl == nullptr) {
      line->append(begin, s.chunk.size() - s.pos);
      s.pos = s.chunk.size();
      continue;
    }
    line->append(begin, static_cast<size_t>(nl - begin));
    s.pos = static_cast<size_t>(nl - s.chunk.data()) + 1;
    break;
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  ++line_number_;
  return true;
}

Dataset text_line_dataset(std::vector<std::string> files, TextLineOptions options) {
  KILN_CHECK_ARG(!files.empty(), "text_line_dataset: needs at least one file");
  check_options(options, "text_line_dataset");
  for (const auto& f : files) {
    struct stat st{};
    if (::stat(f.c_str(), &st) != 0) {
      int err = errno;
      if (err == ENOENT || err == ENOTDIR) throw NotFoundError("text_line_dataset: text file '" + f + "' not found");
      throw FailedPreconditionError("text_line_dataset: text file '" + f + "': " + std::strerror(err));
    }
  }
  auto shared_files = std::make_shared<const std::vector<std::string>>(std::move(files));
  auto make_pass = [shared_files, options]() -> PullFn {
    struct State {
      size_t next_file = 0;
      std::optional<TextLineReader> reader;
      std::string line;
    };
    auto st = std::make_shared<State>();
    return [st, shared_files, options](Element* out) {
      const std::vector<std::string>& files = *shared_files;
      for (;;) {
        if (!st->reader) {
          if (st->next_file == files.size()) return false;
          st->reader.emplace(files[st->next_file++], options);
          for (int64_t i = 0; i < options.skip_header_lines && st->reader->next(&st->line); ++i) {
          }
        }
        if (st->reader->next(&st->line)) {
          *out = Element{Value(StringTensor::scalar(st->line))};
          return true;
        }
        st->reader.reset();
      }
    };
  };
  return Dataset::from_generator(ElementSpec{{}, {TypeSpec::string()}}, std::move(make_pass), kUnknownCardinality,
                                 "TextLineDataset");
}

}  // namespace kiln::data
