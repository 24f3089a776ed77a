#include "distribute/gloo_worker_group.h"

#include <sys/stat.h>

#include <cctype>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "distribute/tcp_store.h"
#include "kiln/core/error.h"

namespace kiln::distribute {

GlooWorkerGroup::GlooWorkerGroup(const ClusterSpec& cluster, std::chrono::milliseconds timeout)
    : WorkerGroup(cluster), timeout_(timeout) {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would end this
  // process with SIGPIPE before the write's error could say so. Ignored unless the program
  // installed a handler of its own.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (!cluster.coordinator.empty()) {
    store_ = std::make_unique<TcpStore>(cluster.coordinator, cluster.rank == 0, timeout);
  } else if (!cluster.store_dir.empty()) {
    ::mkdir(cluster.store_dir.c_str(), 0700);  // every worker tries; one wins
    store_ = std::make_unique<gloo::rendezvous::FileStore>(cluster.store_dir);
  } else if (cluster.size > 1) {
    throw InvalidArgumentError("GlooWorkerGroup: no coordinator and no store directory for " +
                               std::to_string(cluster.size) + " workers");
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = cluster.host.empty() ? "127.0.0.1" : cluster.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout);
    if (size_ > 1) context->connectFullMesh(*store_, device);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    throw UnavailableError(detail::str_cat("worker ", rank_, " of ", size_, ": cannot connect the workers (",
                                           cluster.source, "): ", e.what()));
  }
  // Connected: the rendezvous is over (its port and files are not needed any more).
  barrier();
  learn_peer_addresses();
  store_.reset();
  if (rank_ == 0 && !cluster.store_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(cluster.store_dir, ec);
  }
}

struct GlooWorkerGroup::Cached {
  std::vector<char> in, out;
  std::unique_ptr<gloo::Algorithm> algo;
};

GlooWorkerGroup::~GlooWorkerGroup() = default;

GlooWorkerGroup::Cached& GlooWorkerGroup::cached(const std::string& key, const std::function<void(Cached&)>& make) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto c = std::make_unique<Cached>();
  guarded("setting up a collective", [&](uint32_t) { make(*c); });
  return *cache_.emplace(key, std::move(c)).first->second;
}

void GlooWorkerGroup::learn_peer_addresses() {
  if (size_ == 1) return;
  // A Gloo error names the peer's end of the pair's connection, either as the peer
  // advertised it at the rendezvous (its listening socket's address, in the store under its
  // rank: one address per pair, in rank order) or as the socket reports it once connected
  // (the peer's outgoing port where the peer connected): keep both for every peer.
  peer_addresses_.assign(static_cast<size_t>(size_), {});
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::vector<char> advertised = store_->get(std::to_string(r));
    const size_t each = advertised.size() / static_cast<size_t>(size_ - 1);
    const auto at = static_cast<std::ptrdiff_t>(static_cast<size_t>(rank_ > r ? rank_ - 1 : rank_) * each);
    if (each > 0 && static_cast<size_t>(at) + each <= advertised.size())
      peer_addresses_[static_cast<size_t>(r)].push_back(
          gloo::transport::tcp::Address(std::vector<char>(advertised.begin() + at, advertised.begin() + at + static_cast<std::ptrdiff_t>(each)))
              .str());
  }
  // Line p: this worker's connected address toward worker p. The gather is also what tells
  // worker 0 that every worker is done with the store it serves.
  std::string mine;
  for (int p = 0; p < size_; ++p) mine += (p == rank_ ? std::string() : context_->getPair(p)->address().str()) + "\n";
  const std::vector<std::string> all = all_gather(mine);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    std::istringstream in(all[static_cast<size_t>(r)]);
    std::string line;
    for (int p = 0; p <= rank_ && std::getline(in, line); ++p)
      if (p == rank_ && !line.empty()) peer_addresses_[static_cast<size_t>(r)].push_back(line);
  }
}

int GlooWorkerGroup::peer_named_in(const std::string& message) const {
  // One of the peer's "[host]:port" ends, else a host that only one peer has (workers on
  // different machines), else the only peer of two workers.
  int by_host = -1, hosts = 0;
  for (size_t r = 0; r < peer_addresses_.size(); ++r) {
    bool host_named = false;
    for (const std::string& a : peer_addresses_[r]) {
      for (size_t at = message.find(a); at != std::string::npos; at = message.find(a, at + 1)) {
        const size_t end = at + a.size();  // not a longer port
        if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) return static_cast<int>(r);
      }
      const size_t colon = a.rfind(':');
      if (colon != std::string::npos && message.find(a.substr(0, colon + 1)) != std::string::npos) host_named = true;
    }
    if (host_named) {
      by_host = static_cast<int>(r);
      ++hosts;
    }
  }
  if (hosts == 1) return by_host;
  return size_ == 2 ? 1 - rank_ : -1;
}

template <class F>
void GlooWorkerGroup::guarded(const char* what, F&& op) {
  if (size_ == 1) return;
  try {
    op(tag_++);
  } catch (const gloo::Exception& e) {
    // Gloo's message names the peer's address: say which worker that is, what kiln was
    // doing and what it means.
    const int lost = peer_named_in(e.what());
    const std::string who = lost < 0 ? std::string("another worker") : detail::str_cat("worker ", lost);
    throw UnavailableError(detail::str_cat("worker ", rank_, " of ", size_, ": ", what, " failed within ",
                                           timeout_.count() / 1000.0, " s: ", who,
                                           " died, hangs or lost the network (", e.what(), ")"));
  }
}

void GlooWorkerGroup::all_reduce_sum(std::vector<Tensor>& tensors) {
  // One flat buffer per dtype: one collective per step, not one per tensor.
  for (DType dt : {DType::kF32, DType::kF64}) {
    const int64_t total = elements_of(tensors, dt);
    if (total == 0) continue;
    Cached& c = cached(detail::str_cat("all_reduce ", dtype_name(dt), " ", total), [&](Cached& c) {
      c.out.resize(static_cast<size_t>(total) * dtype_size(dt));
      if (dt == DType::kF32)
        c.algo = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
            context_, std::vector<float*>{reinterpret_cast<float*>(c.out.data())}, static_cast<int>(total));
      else
        c.algo = std::make_unique<gloo::AllreduceHalvingDoubling<double>>(
            context_, std::vector<double*>{reinterpret_cast<double*>(c.out.data())}, static_cast<int>(total));
    });
    pack(tensors, dt, c.out.data());
    guarded("all_reduce", [&](uint32_t) { c.algo->run(); });
    unpack(c.out.data(), dt, tensors);
  }
}

void GlooWorkerGroup::broadcast(std::vector<Tensor>& tensors, int root) {
  for (Tensor& t : tensors) {
    if (t.nbytes() == 0) continue;
    guarded("broadcast", [&](uint32_t tag) {
      gloo::BroadcastOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      opts.setRoot(root);
      opts.setOutput(static_cast<char*>(t.raw_data()), t.nbytes());
      gloo::broadcast(opts);
    });
  }
}

std::vector<std::string> GlooWorkerGroup::all_gather(const std::string& value) {
  if (size_ == 1) return {value};
  // The lengths first (every worker then knows the longest), then the padded values.
  Cached& lc = cached("all_gather lengths", [&](Cached& c) {
    c.in.resize(sizeof(int64_t));
    c.out.resize(sizeof(int64_t) * static_cast<size_t>(size_));
    c.algo = std::make_unique<gloo::AllgatherRing<int64_t>>(
        context_, std::vector<const int64_t*>{reinterpret_cast<const int64_t*>(c.in.data())},
        reinterpret_cast<int64_t*>(c.out.data()), 1);
  });
  const int64_t mine = static_cast<int64_t>(value.size());
  std::memcpy(lc.in.data(), &mine, sizeof mine);
  guarded("all_gather", [&](uint32_t) { lc.algo->run(); });
  std::vector<int64_t> lens(static_cast<size_t>(size_));
  std::memcpy(lens.data(), lc.out.data(), lc.out.size());
  int64_t longest = 1;
  for (int64_t l : lens) longest = std::max(longest, l);
  Cached& dc = cached(detail::str_cat("all_gather ", longest), [&](Cached& c) {
    c.in.resize(static_cast<size_t>(longest));
    c.out.resize(static_cast<size_t>(longest) * static_cast<size_t>(size_));
    c.algo = std::make_unique<gloo::AllgatherRing<char>>(context_, std::vector<const char*>{c.in.data()}, c.out.data(),
                                                         static_cast<int>(longest));
  });
  std::memset(dc.in.data(), 0, dc.in.size());
  std::memcpy(dc.in.data(), value.data(), value.size());
  guarded("all_gather", [&](uint32_t) { dc.algo->run(); });
  std::vector<std::string> all;
  for (int r = 0; r < size_; ++r)
    all.emplace_back(dc.out.data() + static_cast<size_t>(r) * static_cast<size_t>(longest),
                     static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return all;
}

void GlooWorkerGroup::barrier() {
  guarded("barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace kiln::distribute
