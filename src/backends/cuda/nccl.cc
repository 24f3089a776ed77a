// NCCL communicators and collectives (kiln/cuda/nccl.h).
#include "kiln/cuda/nccl.h"

#include <nccl.h>

#include <string>

#include "cuda_context.h"
#include "cuda_error.h"
#include "kiln/core/device.h"
#include "kiln/core/device_group.h"
#include "kiln/core/error.h"

namespace kiln::cuda {
namespace {

void check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  std::string msg = std::string("NCCL error in ") + call + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last && *last) msg += std::string(" (") + last + ")";
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) throw InvalidArgumentError(msg);
  throw InternalError(msg);
}
#define KILN_NCCL_CHECK(call) check((call), #call)

void require_devices(const std::vector<int>& devices) {
  Backend* b = find_backend(DeviceType::kCUDA);
  const int n = b ? b->device_count() : 0;
  if (n == 0)
    throw FailedPreconditionError("NCCL needs a CUDA device: " +
                                  (b ? b->no_device_reason() : backend_unavailable_reason(DeviceType::kCUDA)));
  for (int d : devices)
    if (d < 0 || d >= n)
      throw InvalidArgumentError("NCCL: no device cuda:" + std::to_string(d) + " (" + std::to_string(n) +
                                 " CUDA device(s))");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
    case DType::kI8: return ncclInt8;
    default: throw InvalidArgumentError("NCCL: no collective for dtype " + std::string(dtype_name(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  return ncclSum;
}

}  // namespace

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
  int device = 0;  // logical
  ~Impl() {
    if (comm) ncclCommDestroy(comm);
  }
  DeviceContext& ctx() { return device_context(device); }
  void check_tensor(const Tensor& t) const {
    if (t.device() != Device{DeviceType::kCUDA, device})
      throw InvalidArgumentError("NCCL: tensor " + t.desc() + " is not on this communicator's device cuda:" +
                                 std::to_string(device));
  }
};

UniqueId UniqueId::create() {
  require_devices({});
  ncclUniqueId id;
  KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  UniqueId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::copy(std::begin(id.internal), std::end(id.internal), out.bytes.begin());
  return out;
}

Communicator::Communicator(const UniqueId& id, int nranks, int rank, int device) : impl_(std::make_unique<Impl>()) {
  KILN_CHECK_ARG(nranks > 0 && rank >= 0 && rank < nranks, "NCCL: rank ", rank, " of ", nranks);
  require_devices({device});
  impl_->device = device;
  DeviceContext& ctx = impl_->ctx();
  DeviceGuard guard(ctx.physical);
  ncclUniqueId nid;
  std::copy(id.bytes.begin(), id.bytes.end(), std::begin(nid.internal));
  KILN_NCCL_CHECK(ncclCommInitRank(&impl_->comm, nranks, nid, rank));
}

std::vector<Communicator> Communicator::for_devices(const std::vector<int>& devices) {
  KILN_CHECK_ARG(!devices.empty(), "NCCL: for_devices needs at least one device");
  require_devices(devices);
  std::vector<int> physical;
  for (int d : devices) physical.push_back(device_context(d).physical);
  std::vector<ncclComm_t> comms(devices.size());
  KILN_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), physical.data()));
  std::vector<Communicator> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    Communicator c;
    c.impl_ = std::make_unique<Impl>();
    c.impl_->comm = comms[i];
    c.impl_->device = devices[i];
    out.push_back(std::move(c));
  }
  return out;
}

Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const {
  int r = 0;
  KILN_NCCL_CHECK(ncclCommUserRank(impl_->comm, &r));
  return r;
}
int Communicator::size() const {
  int n = 0;
  KILN_NCCL_CHECK(ncclCommCount(impl_->comm, &n));
  return n;
}
Device Communicator::device() const { return {DeviceType::kCUDA, impl_->device}; }

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  impl_->check_tensor(t);
  DeviceContext& ctx = impl_->ctx();
  DeviceGuard guard(ctx.physical);
  KILN_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                nccl_op(op), impl_->comm, ctx.stream));
}

void Communicator::broadcast(Tensor& t, int root) {
  impl_->check_tensor(t);
  KILN_CHECK_ARG(root >= 0 && root < size(), "NCCL: broadcast root ", root, " of ", size(), " ranks");
  DeviceContext& ctx = impl_->ctx();
  DeviceGuard guard(ctx.physical);
  KILN_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                root, impl_->comm, ctx.stream));
}

namespace {
template <typename F>
void grouped(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, F each) {
  KILN_CHECK_ARG(comms.size() == tensors.size(), "NCCL: ", comms.size(), " communicators but ", tensors.size(),
                 " tensors");
  for (size_t i = 1; i < tensors.size(); ++i)
    KILN_CHECK_ARG(tensors[i].shape() == tensors[0].shape() && tensors[i].dtype() == tensors[0].dtype(),
                   "NCCL: tensors differ: ", tensors[0].desc(), " vs ", tensors[i].desc());
  KILN_NCCL_CHECK(ncclGroupStart());
  try {
    for (size_t i = 0; i < comms.size(); ++i) each(comms[i], tensors[i]);
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
}
}  // namespace

void all_reduce(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, ReduceOp op) {
  grouped(comms, tensors, [op](Communicator& c, Tensor& t) { c.all_reduce(t, op); });
}

void broadcast(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, int root) {
  grouped(comms, tensors, [root](Communicator& c, Tensor& t) { c.broadcast(t, root); });
}

namespace {

// The GPU replicas of a distribution strategy (kiln/core/device_group.h): one
// communicator per device of the group, each driven by its replica's thread; a member's
// tensors go in one NCCL group.
class NcclDeviceGroup final : public DeviceGroup {
 public:
  explicit NcclDeviceGroup(std::vector<Communicator> comms) : comms_(std::move(comms)) {}
  void all_reduce_sum(int member, std::vector<Tensor>& tensors) override {
    Communicator& c = comms_.at(static_cast<size_t>(member));
    KILN_NCCL_CHECK(ncclGroupStart());
    try {
      for (Tensor& t : tensors) c.all_reduce(t, ReduceOp::kSum);
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    KILN_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  std::vector<Communicator> comms_;
};

[[maybe_unused]] const bool g_device_group_registered = [] {
  register_device_group_factory(
      DeviceType::kCUDA, [](const std::vector<int>& devices, const DeviceGroupSpan& span) -> std::unique_ptr<DeviceGroup> {
        if (span.size == 0) return std::make_unique<NcclDeviceGroup>(Communicator::for_devices(devices));
        // Across processes: member 0's process makes the unique id, every process joins
        // its devices as ranks first, first + 1, ... of one communicator (one NCCL group
        // when a process holds several).
        KILN_CHECK_ARG(span.first >= 0 && span.first + static_cast<int>(devices.size()) <= span.size && span.share,
                       "NCCL: members ", span.first, "..", span.first + static_cast<int>(devices.size()), " of ",
                       span.size);
        std::string mine;
        if (span.first == 0) {
          const UniqueId id = UniqueId::create();
          mine.assign(id.bytes.begin(), id.bytes.end());
        }
        const std::string shared = span.share(mine);
        UniqueId id;
        KILN_CHECK_ARG(shared.size() == id.bytes.size(), "NCCL: the unique id from member 0 has ", shared.size(),
                       " bytes, not ", id.bytes.size());
        std::copy(shared.begin(), shared.end(), id.bytes.begin());
        std::vector<Communicator> comms;
        KILN_NCCL_CHECK(ncclGroupStart());
        try {
          for (size_t i = 0; i < devices.size(); ++i)
            comms.emplace_back(id, span.size, span.first + static_cast<int>(i), devices[i]);
        } catch (...) {
          ncclGroupEnd();
          throw;
        }
        KILN_NCCL_CHECK(ncclGroupEnd());
        return std::make_unique<NcclDeviceGroup>(std::move(comms));
      });
  return true;
}();

}  // namespace

}  // namespace kiln::cuda
