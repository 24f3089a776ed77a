#include "kiln/data/csv.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "csv_internal.h"
#include "kiln/core/error.h"

namespace kiln::data {

const char* csv_type_name(CsvType t) {
  switch (t) {
    case CsvType::kF32: return "f32";
    case CsvType::kF64: return "f64";
    case CsvType::kI32: return "i32";
    case CsvType::kI64: return "i64";
    case CsvType::kString: return "string";
  }
  return "?";
}

namespace internal {
namespace {

// The text of a bad field for an error message: quoted, shortened, control bytes escaped.
std::string quote_text(std::string_view s) {
  constexpr size_t kMax = 48;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += s.size() > kMax ? "'..." : "'";
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Drops one leading '+' (std::from_chars does not take it).
std::string_view drop_plus(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '+' && s[1] != '-') s.remove_prefix(1);
  return s;
}

template <typename T>
bool parse_int(std::string_view s, T* out, bool* out_of_range) {
  s = drop_plus(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 10);
  *out_of_range = ec == std::errc::result_out_of_range;
  return ec == std::errc() && p == s.data() + s.size();
}

template <typename T>
bool parse_float(std::string_view s, T* out, bool* out_of_range) {
  s = drop_plus(s);
  *out_of_range = false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, std::chars_format::general);
  if (p != s.data() + s.size()) return false;
  if (ec == std::errc()) return true;
  if (ec != std::errc::result_out_of_range) return false;
  // Underflow reads as the nearest subnormal or zero (as strtod does); overflow fails.
  std::string copy(s);
  errno = 0;
  T v;
  if constexpr (std::is_same_v<T, float>) {
    v = std::strtof(copy.c_str(), nullptr);
  } else {
    v = std::strtod(copy.c_str(), nullptr);
  }
  if (std::isinf(v)) {
    *out_of_range = true;
    return false;
  }
  *out = v;
  return true;
}

// Parses a non-missing field as `type`. On failure returns an undefined Value and sets
// *why ("cannot parse ... as i32" / "... is out of range for i32").
Value parse_value(std::string_view text, CsvType type, std::string* why) {
  if (type == CsvType::kString) return Value(StringTensor::scalar(std::string(text)));
  std::string_view s = trim(text);
  bool range = false, ok = false;
  Value v;
  switch (type) {
    case CsvType::kF32: {
      float x;
      if ((ok = parse_float(s, &x, &range))) v = Value(Tensor::scalar<float>(x));
      break;
    }
    case CsvType::kF64: {
      double x;
      if ((ok = parse_float(s, &x, &range))) v = Value(Tensor::scalar<double>(x));
      break;
    }
    case CsvType::kI32: {
      int32_t x;
      if ((ok = parse_int(s, &x, &range))) v = Value(Tensor::scalar<int32_t>(x));
      break;
    }
    case CsvType::kI64: {
      int64_t x;
      if ((ok = parse_int(s, &x, &range))) v = Value(Tensor::scalar<int64_t>(x));
      break;
    }
    case CsvType::kString: break;
  }
  if (!ok)
    *why = quote_text(text) + (range ? " is out of range for " : " is not a valid ") + csv_type_name(type);
  return v;
}

bool is_missing(std::string_view text, CsvType type, const std::string& na_value) {
  if (text.empty() || text == na_value) return true;
  return type != CsvType::kString && trim(text).empty();
}

}  // namespace

// ---- CsvRecordReader ----

CsvRecordReader::CsvRecordReader(std::unique_ptr<ByteStream> in, char delimiter, bool quoting, bool skip_blank)
    : in_(std::move(in)), delimiter_(delimiter), quoting_(quoting), skip_blank_(skip_blank) {}

std::vector<std::string> CsvRecordReader::fields() const {
  std::vector<std::string> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); ++i) out.emplace_back(field(i));
  return out;
}

bool CsvRecordReader::next() {
  // kFieldStart: nothing of the field read yet; kUnquoted / kQuoted: inside a field;
  // kQuoteSeen: a '"' inside a quoted field (closing, or the first of a doubled pair);
  // kCr / kQuoteCr: a '\r' that ends the record if '\n' follows.
  enum State { kFieldStart, kUnquoted, kQuoted, kQuoteSeen, kCr, kQuoteCr } st = kFieldStart;
  buf_.clear();
  ends_.clear();
  field_quoted_ = false;
  record_line_ = line_;
  auto after_quote_error = [&](char c) {
    throw InvalidArgumentError(detail::str_cat(where(), " line ", line_, ": field ", ends_.size() + 1, ": ",
                                               quote_text(std::string_view(&c, 1)),
                                               " after a closing quote (expected the delimiter or a line end; a "
                                               "quote inside a quoted field is written as two)"));
  };
  // At a line end: true when the record is complete, false for a blank line skipped.
  auto end_record = [&]() {
    ++line_;
    if (skip_blank_ && ends_.empty() && buf_.empty() && !field_quoted_) {
      record_line_ = line_;
      return false;
    }
    end_field();
    return true;
  };
  for (;;) {
    if (pos_ == chunk_.size()) {
      chunk_ = in_->read();
      pos_ = 0;
      if (first_chunk_) {
        first_chunk_ = false;
        if (!chunk_.empty() && chunk_.size() < 3) {  // gather 3 bytes to look for a BOM
          head_.assign(chunk_);
          for (std::string_view more; head_.size() < 3 && !(more = in_->read()).empty();) head_.append(more);
          chunk_ = head_;
        }
        if (chunk_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // UTF-8 byte order mark
        if (pos_ == chunk_.size() && !chunk_.empty()) continue;  // only a BOM so far
      }
      if (chunk_.empty()) {  // the end
        if (st == kQuoted)
          throw DataLossError(detail::str_cat(where(), " line ", quote_line_, ": field ", ends_.size() + 1,
                                              ": the quoted field that starts there is not closed at the end of "
                                              "the file"));
        if (st == kFieldStart && ends_.empty() && !field_quoted_) return false;
        end_field();  // (a '\r' pending in kCr / kQuoteCr is the line end)
        return true;
      }
    }
    char c = chunk_[pos_++];
    switch (st) {
      case kFieldStart:
        if (quoting_ && c == '"') {
          st = kQuoted;
          field_quoted_ = true;
          quote_line_ = line_;
          break;
        }
        st = kUnquoted;
        [[fallthrough]];
      case kUnquoted:
        if (c == delimiter_) {
          end_field();
          st = kFieldStart;
        } else if (c == '\n') {
          if (end_record()) return true;
          st = kFieldStart;
        } else if (c == '\r') {
          st = kCr;
        } else {
          // Copy the run of ordinary bytes at once.
          size_t start = pos_ - 1, end = pos_;
          while (end < chunk_.size()) {
            char d = chunk_[end];
            if (d == delimiter_ || d == '\n' || d == '\r') break;
            ++end;
          }
          buf_.append(chunk_.data() + start, end - start);
          pos_ = end;
        }
        break;
      case kCr:
        if (c == '\n') {
          if (end_record()) return true;
          st = kFieldStart;
        } else {  // a lone '\r' is text
          buf_.push_back('\r');
          --pos_;
          st = kUnquoted;
        }
        break;
      case kQuoted: {
        if (c == '"') {
          st = kQuoteSeen;
          break;
        }
        size_t start = pos_ - 1, end = pos_;
        while (end < chunk_.size() && chunk_[end] != '"') ++end;
        for (size_t i = start; i < end; ++i) line_ += chunk_[i] == '\n';
        buf_.append(chunk_.data() + start, end - start);
        pos_ = end;
        break;
      }
      case kQuoteSeen:
        if (c == '"') {
          buf_.push_back('"');
          st = kQuoted;
        } else if (c == delimiter_) {
          end_field();
          st = kFieldStart;
        } else if (c == '\n') {
          if (end_record()) return true;
          st = kFieldStart;
        } else if (c == '\r') {
          st = kQuoteCr;
        } else {
          after_quote_error(c);
        }
        break;
      case kQuoteCr:
        if (c != '\n') after_quote_error('\r');
        if (end_record()) return true;
        st = kFieldStart;
        break;
    }
  }
}

// ---- CsvPlan ----

std::shared_ptr<const CsvPlan> make_csv_plan(const CsvOptions& options,
                                             const std::function<std::optional<std::vector<std::string>>()>& first_record,
                                             const std::string& first_where) {
  const char d = options.delimiter;
  KILN_CHECK_ARG(d != '\n' && d != '\r', "csv_dataset: the delimiter cannot be a line end");
  KILN_CHECK_ARG(!(options.quoting && d == '"'), "csv_dataset: the delimiter cannot be '\"' when quoting is on");
  auto c = options.compression;
  KILN_CHECK_ARG(c == Compression::kNone || c == Compression::kGzip || c == Compression::kZlib ||
                     c == Compression::kAuto,
                 "csv_dataset: unknown compression ", static_cast<int>(c));

  auto plan = std::make_shared<CsvPlan>();
  plan->options = options;
  bool need_first = options.columns.empty();
  for (const auto& col : options.columns) {
    KILN_CHECK_ARG(col.index >= -1, "csv_dataset: column '", col.name, "': index must be >= 0 or -1, got ", col.index);
    if (options.header && (col.name.empty() || col.index < 0)) need_first = true;  // names, or names to check
  }
  std::optional<std::vector<std::string>> first;
  if (need_first) first = first_record();
  const bool names_needed =
      options.columns.empty() ||
      (options.header && std::any_of(options.columns.begin(), options.columns.end(),
                                     [](const CsvColumn& col) { return col.name.empty(); }));
  if (names_needed && !first)
    throw InvalidArgumentError("csv_dataset: " + first_where + " has no records: cannot take column names from it");
  auto auto_name = [&](int64_t i) -> std::string {
    if (options.header && first && i < static_cast<int64_t>(first->size()) && !(*first)[i].empty()) return (*first)[i];
    return "column" + std::to_string(i);
  };

  if (options.columns.empty()) {
    for (size_t i = 0; i < first->size(); ++i) {
      CsvPlan::Column col;
      col.name = auto_name(static_cast<int64_t>(i));
      col.type = CsvType::kString;
      col.default_value = Value(StringTensor::scalar(""));
      col.by = CsvPlan::By::kIndex;
      col.index = static_cast<int64_t>(i);
      plan->columns.push_back(std::move(col));
    }
  }
  for (size_t i = 0; i < options.columns.size(); ++i) {
    const CsvColumn& in = options.columns[i];
    CsvPlan::Column col;
    col.type = in.type;
    if (in.index >= 0) {
      col.by = CsvPlan::By::kIndex;
      col.index = in.index;
    } else if (options.header && !in.name.empty()) {
      col.by = CsvPlan::By::kName;
      col.header_name = in.name;
      if (first && std::find(first->begin(), first->end(), in.name) == first->end()) {
        std::string have;
        for (const auto& h : *first) have += (have.empty() ? "" : ", ") + quote_text(h);
        throw InvalidArgumentError("csv_dataset: " + first_where + " line 1: the header has no column named " +
                                   quote_text(in.name) + " (it has " + have + ")");
      }
    } else {
      col.by = CsvPlan::By::kPosition;
      col.index = static_cast<int64_t>(i);
    }
    col.name = !in.name.empty() ? in.name : auto_name(col.index);
    if (in.default_value) {
      std::string why;
      Value v = parse_value(*in.default_value, in.type, &why);
      KILN_CHECK_ARG(v.defined(), "csv_dataset: column ", quote_text(col.name), ": the default ", why);
      col.default_value = std::move(v);
    }
    plan->columns.push_back(std::move(col));
  }
  KILN_CHECK_ARG(!plan->columns.empty(), "csv_dataset: no columns to produce (", first_where, " has an empty header)");

  std::vector<std::string> names;
  for (const auto& col : plan->columns) {
    for (const auto& n : names)
      KILN_CHECK_ARG(n != col.name, "csv_dataset: two columns are named ", quote_text(col.name),
                     " (give them distinct names)");
    names.push_back(col.name);
    plan->spec.components.push_back(col.type == CsvType::kString ? TypeSpec::string()
                                    : TypeSpec::tensor(col.type == CsvType::kF32   ? DType::kF32
                                                       : col.type == CsvType::kF64 ? DType::kF64
                                                       : col.type == CsvType::kI32 ? DType::kI32
                                                                                   : DType::kI64));
  }
  plan->spec.names = names;
  plan->names = Element(std::move(names), std::vector<Value>(plan->columns.size()));
  return plan;
}

// ---- CsvFileReader ----

CsvFileReader::CsvFileReader(std::shared_ptr<const CsvPlan> plan, std::unique_ptr<ByteStream> in)
    : plan_(std::move(plan)), records_(std::move(in), plan_->options.delimiter, plan_->options.quoting) {}

bool CsvFileReader::start() {
  started_ = true;
  if (!records_.next()) return false;  // an empty file
  const CsvOptions& opt = plan_->options;
  expected_fields_ = records_.size();
  index_.clear();
  for (const auto& col : plan_->columns) {
    size_t idx = 0;
    if (col.by == CsvPlan::By::kName) {
      for (idx = 0; idx < records_.size() && records_.field(idx) != col.header_name; ++idx) {
      }
      if (idx == records_.size()) {
        std::string have;
        for (size_t i = 0; i < records_.size(); ++i) have += (i ? ", " : "") + quote_text(records_.field(i));
        throw InvalidArgumentError(detail::str_cat(records_.where(), " line ", records_.line(),
                                                   ": the header has no column named ", quote_text(col.header_name),
                                                   " (it has ", have, ")"));
      }
    } else {
      idx = static_cast<size_t>(col.index);
      if (idx >= expected_fields_)
        throw InvalidArgumentError(detail::str_cat(
            records_.where(), " line ", records_.line(), ": column ", quote_text(col.name), " is field ", idx + 1,
            " but ", opt.header ? "the header has " : "the first record has ", expected_fields_, " fields"));
    }
    index_.push_back(idx);
  }
  pending_ = !opt.header;
  return true;
}

bool CsvFileReader::next(Element* out) {
  if (!started_ && !start()) return false;
  if (pending_) {
    pending_ = false;
  } else if (!records_.next()) {
    return false;
  }
  if (records_.size() != expected_fields_)
    throw InvalidArgumentError(detail::str_cat(records_.where(), " line ", records_.line(), ": expected ",
                                               expected_fields_, " fields (as in ",
                                               plan_->options.header ? "the header" : "the first record", "), got ",
                                               records_.size()));
  const auto& cols = plan_->columns;
  std::vector<Value> values(cols.size());
  std::string why;
  for (size_t i = 0; i < cols.size(); ++i) {
    std::string_view text = records_.field(index_[i]);
    if (is_missing(text, cols[i].type, plan_->options.na_value)) {
      if (!cols[i].default_value)
        throw InvalidArgumentError(detail::str_cat(records_.where(), " line ", records_.line(), ", column ",
                                                   quote_text(cols[i].name), ": missing value ", quote_text(text),
                                                   " and the column has no default"));
      values[i] = *cols[i].default_value;
      continue;
    }
    values[i] = parse_value(text, cols[i].type, &why);
    if (!values[i].defined())
      throw InvalidArgumentError(
          detail::str_cat(records_.where(), " line ", records_.line(), ", column ", quote_text(cols[i].name), ": ", why));
  }
  *out = Element::with_names_of(plan_->names, std::move(values));
  return true;
}

std::vector<Element> read_csv_string(std::string data, const CsvOptions& options, const std::string& name) {
  auto open = [&] {
    return ByteStream::from_string(data, name, "CSV file", options.compression, options.buffer_bytes);
  };
  auto plan = make_csv_plan(
      options,
      [&]() -> std::optional<std::vector<std::string>> {
        CsvRecordReader r(open(), options.delimiter, options.quoting);
        if (!r.next()) return std::nullopt;
        return r.fields();
      },
      "CSV file '" + name + "'");
  CsvFileReader reader(plan, open());
  std::vector<Element> out;
  Element e;
  while (reader.next(&e)) out.push_back(std::move(e));
  return out;
}

}  // namespace internal

Dataset csv_dataset(std::vector<std::string> files, CsvOptions options) {
  KILN_CHECK_ARG(!files.empty(), "csv_dataset: needs at least one file");
  for (const auto& f : files) {
    struct stat st{};
    if (::stat(f.c_str(), &st) != 0) {
      int err = errno;
      if (err == ENOENT || err == ENOTDIR) throw NotFoundError("csv_dataset: CSV file '" + f + "' not found");
      throw FailedPreconditionError("csv_dataset: CSV file '" + f + "': " + std::strerror(err));
    }
  }
  auto open = [options](const std::string& path) {
    return internal::ByteStream::open(path, "CSV file", options.compression, options.buffer_bytes);
  };
  auto plan = internal::make_csv_plan(
      options,
      [&]() -> std::optional<std::vector<std::string>> {
        internal::CsvRecordReader r(open(files[0]), options.delimiter, options.quoting);
        if (!r.next()) return std::nullopt;
        return r.fields();
      },
      "CSV file '" + files[0] + "'");
  auto shared_files = std::make_shared<const std::vector<std::string>>(std::move(files));
  auto make_pass = [shared_files, plan, open]() -> PullFn {
    struct State {
      size_t next_file = 0;
      std::optional<internal::CsvFileReader> reader;
    };
    auto st = std::make_shared<State>();
    return [st, shared_files, plan, open](Element* out) {
      for (;;) {
        if (!st->reader) {
          if (st->next_file == shared_files->size()) return false;
          st->reader.emplace(plan, open((*shared_files)[st->next_file++]));
        }
        if (st->reader->next(out)) return true;
        st->reader.reset();
      }
    };
  };
  return Dataset::from_generator(plan->spec, std::move(make_pass), kUnknownCardinality, "CsvDataset");
}

std::vector<std::string> parse_csv_line(std::string_view line, char delimiter, bool quoting) {
  KILN_CHECK_ARG(delimiter != '\n' && delimiter != '\r', "parse_csv_line: the delimiter cannot be a line end");
  KILN_CHECK_ARG(!(quoting && delimiter == '"'), "parse_csv_line: the delimiter cannot be '\"' when quoting is on");
  internal::CsvRecordReader r(
      internal::ByteStream::from_string(std::string(line), "<line>", "CSV text", Compression::kNone), delimiter,
      quoting, /*skip_blank=*/false);
  try {
    if (!r.next()) return {""};
    std::vector<std::string> out = r.fields();
    if (r.next())
      throw InvalidArgumentError(detail::str_cat("parse_csv_line: the text holds more than one record (another starts "
                                                 "at line ", r.line(), ")"));
    return out;
  } catch (const DataLossError& e) {  // an open quote: bad input rather than a damaged file
    throw InvalidArgumentError("parse_csv_line: " + e.message());
  }
}

}  // namespace kiln::data
