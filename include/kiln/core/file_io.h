#pragma once
// Whole-file reads and atomic writes (temp name, fsync, rename), with typed errors.
#include <string>
#include <string_view>

namespace kiln {

// Throws NotFoundError when the file does not exist, DataLossError on read errors.
std::string read_file(const std::string& path);
// Writes to "<path>.tmp.<pid>", fsyncs, renames over `path`, fsyncs the directory.
// On failure the old file is untouched and the temp file removed; throws
// FailedPreconditionError / DataLossError.
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace kiln
