#include "kiln/core/error.h"
#include "kiln/data/idx.h"

namespace kiln::data {

Dataset idx_dataset(const std::vector<std::string>& files) {
  KILN_CHECK_ARG(!files.empty(), "idx_dataset: no files given");
  std::vector<Value> parts;
  for (const auto& f : files) {
    Tensor t = read_idx(f);
    KILN_CHECK_ARG(t.rank() >= 1, "idx_dataset: ", f, " holds a scalar; it needs a first dimension");
    if (!parts.empty())
      KILN_CHECK_ARG(t.dim(0) == parts[0].shape()[0], "idx_dataset: ", f, " has ", t.dim(0), " rows but ", files[0],
                     " has ", parts[0].shape()[0]);
    parts.emplace_back(std::move(t));
  }
  return Dataset::from_tensor_slices(Element(std::move(parts)));
}

}  // namespace kiln::data
