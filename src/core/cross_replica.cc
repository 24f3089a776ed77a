#include "kiln/core/cross_replica.h"

namespace kiln {
namespace {
thread_local const CrossReplicaSumFn* t_fn = nullptr;
}  // namespace

const CrossReplicaSumFn* cross_replica_sum_fn() { return t_fn; }

CrossReplicaSumScope::CrossReplicaSumScope(CrossReplicaSumFn fn) : fn_(std::move(fn)), previous_(t_fn) { t_fn = &fn_; }
CrossReplicaSumScope::~CrossReplicaSumScope() { t_fn = previous_; }

}  // namespace kiln
