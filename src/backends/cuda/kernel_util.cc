#include "kernel_util.h"

#include <string>

namespace kiln::cuda {

BroadcastMap make_broadcast_map(const Shape& out, const Shape& in) {
  const int r = out.rank();
  KILN_CHECK_ARG(in.rank() <= r, "cannot broadcast ", in.str(), " to ", out.str());
  // Per output dim: size and the input's stride (0 when broadcast).
  std::vector<int64_t> sizes(r), strides(r);
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    int id = d - (r - in.rank());
    int64_t isz = id >= 0 ? in.dim(id) : 1;
    KILN_CHECK_ARG(isz == out.dim(d) || isz == 1, "cannot broadcast ", in.str(), " to ", out.str());
    sizes[d] = out.dim(d);
    strides[d] = (isz == 1 && out.dim(d) != 1) ? 0 : stride;
    stride *= isz;
  }
  // Merge dim d into d+1 (inner) when the pair is laid out contiguously for this
  // input: both broadcast, or stride[d] == stride[d+1] * size[d+1]. Size-1 dims vanish.
  std::vector<int64_t> ms, mt;
  for (int d = 0; d < r; ++d) {
    if (sizes[d] == 1) continue;
    if (!ms.empty()) {
      int64_t& ps = ms.back();
      int64_t& pt = mt.back();
      bool both_bcast = pt == 0 && strides[d] == 0;
      bool contiguous = pt != 0 && strides[d] != 0 && pt == strides[d] * sizes[d];
      if (both_bcast || contiguous) {
        ps *= sizes[d];
        pt = strides[d];
        continue;
      }
    }
    ms.push_back(sizes[d]);
    mt.push_back(strides[d]);
  }
  if (ms.empty()) {
    ms.push_back(1);
    mt.push_back(0);
  }
  if (ms.size() > static_cast<size_t>(kMaxDims))
    throw UnimplementedError("CUDA kernels broadcast at most " + std::to_string(kMaxDims) + " dimensions, got " +
                             out.str());
  BroadcastMap m;
  m.rank = static_cast<int>(ms.size());
  for (int i = 0; i < m.rank; ++i) {
    m.sizes[i] = ms[i];
    m.strides[i] = mt[i];
  }
  return m;
}

}  // namespace kiln::cuda
