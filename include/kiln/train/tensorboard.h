#pragma once
// TensorBoard event files: "events.out.tfevents.<unix time>.<host>.<pid>.kiln" in a log
// directory, TFRecord-framed tensorflow.Event protos; the first record carries
// file_version "brain.Event:2", then one Event per scalar with a simple_value
// Summary. Stock TensorBoard reads them. Format: docs/formats/event-file.md.
//
// Thread-safety: none.
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::train {

class SummaryWriter {
 public:
  // Creates `logdir` (and parents) if needed; throws kiln::Error if it cannot.
  explicit SummaryWriter(const std::string& logdir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;
  void scalar(const std::string& tag, double value, int64_t step);
  // Pushes buffered records to the file (also done by the destructor).
  void flush();
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::train
