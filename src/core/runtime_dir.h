#pragma once
// Where kiln's plugins are found (internal): the directory libkiln_runtime was loaded
// from, with a trailing '/' ("" when unknown). The libraries and their plugins
// (libkiln_cuda, libkiln_mpi) are built and installed side by side.
#include <string>

namespace kiln::detail {

std::string runtime_dir();

}  // namespace kiln::detail
