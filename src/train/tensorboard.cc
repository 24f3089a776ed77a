#include "kiln/train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "kiln/core/error.h"
#include "kiln/data/tfrecord.h"
#include "tensorboard/event.pb.h"

namespace kiln::train {
namespace {

// Records reach the file at least this often, so TensorBoard can follow a run live.
constexpr double kFlushSeconds = 2.0;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

struct SummaryWriter::Impl {
  std::unique_ptr<data::TFRecordWriter> writer;
  std::string path;
  double last_flush = 0;

  void write(const tensorflow::Event& e) {
    std::string bytes;
    if (!e.SerializeToString(&bytes)) throw InternalError("cannot serialise a tensorflow.Event");
    writer->write(bytes);
    double now = now_seconds();
    if (now - last_flush >= kFlushSeconds) {
      writer->flush();
      last_flush = now;
    }
  }
};

SummaryWriter::SummaryWriter(const std::string& logdir) : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec || !std::filesystem::is_directory(logdir))
    throw FailedPreconditionError("cannot create TensorBoard log directory " + logdir + ": " +
                                  (ec ? ec.message() : "exists and is not a directory"));
  double t = now_seconds();
  std::string stem = logdir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + hostname() +
                     "." + std::to_string(::getpid());
  // Two writers of one process in the same second would share the name: number the
  // later ones instead of truncating the first one's file.
  for (int n = 0;; ++n) {
    impl_->path = n == 0 ? stem + ".kiln" : stem + "." + std::to_string(n) + ".kiln";
    try {
      impl_->writer = std::make_unique<data::TFRecordWriter>(impl_->path, data::TFRecordWriterOptions{.exclusive = true});
      break;
    } catch (const FailedPreconditionError&) {
      if (n >= 1000 || !std::filesystem::exists(impl_->path)) throw;
    }
  }
  tensorflow::Event e;
  e.set_wall_time(t);
  e.set_file_version("brain.Event:2");
  impl_->write(e);
  // The header record goes out at once: TensorBoard then knows the file.
  flush();
}

SummaryWriter::~SummaryWriter() {
  try {
    impl_->writer->close();
  } catch (const Error&) {
  }
}

void SummaryWriter::scalar(const std::string& tag, double value, int64_t step) {
  tensorflow::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  tensorflow::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  impl_->write(e);
}

void SummaryWriter::flush() {
  impl_->writer->flush();
  impl_->last_flush = now_seconds();
}

const std::string& SummaryWriter::path() const { return impl_->path; }

}  // namespace kiln::train
