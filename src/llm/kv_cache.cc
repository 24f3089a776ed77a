#include "kiln/llm/kv_cache.h"

#include "kiln/core/error.h"
#include "kiln/llm/model.h"

namespace kiln::llm {

using detail::str_cat;

KvCache::KvCache(const ModelConfig& config, const KvCacheOptions& options)
    : n_layer_(config.n_layer), kv_dim_(config.kv_dim()), block_tokens_(options.block_tokens) {
  if (block_tokens_ < 1 || options.max_tokens < 1)
    throw InvalidArgumentError(str_cat("KV cache: block_tokens (", block_tokens_, ") and max_tokens (", options.max_tokens,
                                       ") must be >= 1"));
  n_blocks_ = (options.max_tokens + block_tokens_ - 1) / block_tokens_;
  data_.resize(static_cast<size_t>(n_blocks_ * n_layer_ * 2 * block_tokens_ * kv_dim_));
  free_.reserve(static_cast<size_t>(n_blocks_));
  for (int64_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

KvCache::SeqId KvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Seq{true, 0, {}};
      return static_cast<SeqId>(i);
    }
  seqs_.push_back(Seq{true, 0, {}});
  return static_cast<SeqId>(seqs_.size() - 1);
}

KvCache::Seq& KvCache::seq_ref(SeqId seq) {
  if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() || !seqs_[seq].live)
    throw NotFoundError(str_cat("KV cache: no sequence ", seq));
  return seqs_[seq];
}
const KvCache::Seq& KvCache::seq_ref(SeqId seq) const { return const_cast<KvCache*>(this)->seq_ref(seq); }

void KvCache::remove_sequence(SeqId seq) {
  Seq& s = seq_ref(seq);
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s = Seq{};
}

int64_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }

void KvCache::truncate(SeqId seq, int64_t n) {
  Seq& s = seq_ref(seq);
  if (n < 0 || n > s.length) throw InvalidArgumentError(str_cat("KV cache: cannot truncate a sequence of ", s.length, " to ", n));
  s.length = n;
  const size_t keep = static_cast<size_t>((n + block_tokens_ - 1) / block_tokens_);
  while (s.blocks.size() > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
}

void KvCache::grow(SeqId seq, int64_t n) {
  Seq& s = seq_ref(seq);
  const size_t need = static_cast<size_t>((n + block_tokens_ - 1) / block_tokens_);
  if (need > s.blocks.size()) {
    const size_t more = need - s.blocks.size();
    if (more > free_.size())
      throw ResourceExhaustedError(str_cat("KV cache full: ", n, " positions need ", more, " more blocks of ", block_tokens_,
                                           ", ", free_.size(), " of ", n_blocks_, " are free"));
    for (size_t i = 0; i < more; ++i) {
      s.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }
  if (n > s.length) s.length = n;
}

const std::vector<int32_t>& KvCache::blocks(SeqId seq) const { return seq_ref(seq).blocks; }

size_t KvCache::offset(int32_t block, int64_t layer, int kv, int64_t slot) const {
  return static_cast<size_t>((((block * n_layer_ + layer) * 2 + kv) * block_tokens_ + slot) * kv_dim_);
}

half* KvCache::key(SeqId seq, int64_t layer, int64_t pos) {
  const Seq& s = seq_ref(seq);
  return data_.data() + offset(s.blocks[static_cast<size_t>(pos / block_tokens_)], layer, 0, pos % block_tokens_);
}
half* KvCache::value(SeqId seq, int64_t layer, int64_t pos) {
  const Seq& s = seq_ref(seq);
  return data_.data() + offset(s.blocks[static_cast<size_t>(pos / block_tokens_)], layer, 1, pos % block_tokens_);
}
const half* KvCache::block_keys(int32_t block, int64_t layer) const { return data_.data() + offset(block, layer, 0, 0); }
const half* KvCache::block_values(int32_t block, int64_t layer) const { return data_.data() + offset(block, layer, 1, 0); }

}  // namespace kiln::llm
