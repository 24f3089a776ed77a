#include "kiln/llm/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "kiln/llm/model.h"

namespace kiln::llm {

using detail::str_cat;

KvCache::KvCache(const ModelConfig& config, const KvCacheOptions& options)
    : n_layer_(config.n_layer), kv_dim_(config.kv_dim()), block_tokens_(options.block_tokens), layout_(options.layout) {
  if (block_tokens_ < 1 || options.max_tokens < 1)
    throw InvalidArgumentError(str_cat("KV cache: block_tokens (", block_tokens_, ") and max_tokens (", options.max_tokens,
                                       ") must be >= 1"));
  n_blocks_ = (options.max_tokens + block_tokens_ - 1) / block_tokens_;
  const int64_t n = n_blocks_ * n_layer_ * 2 * block_tokens_ * kv_dim_;
  try {
    pool_ = Tensor::empty({n}, DType::kF16, options.device);
  } catch (const ResourceExhaustedError& e) {
    throw ResourceExhaustedError(str_cat("KV cache of ", n_blocks_ * block_tokens_, " positions (",
                                         config::format_bytes(n * static_cast<int64_t>(sizeof(half))),
                                         "): ", e.message()));
  }
  const size_t nb = static_cast<size_t>(n_blocks_);
  free_.reserve(nb);
  for (int64_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  ref_.assign(nb, 0);
  hash_.assign(nb, 0);
  parent_.assign(nb, 0);
  is_published_.assign(nb, 0);
  tokens_.assign(nb * static_cast<size_t>(block_tokens_), 0);
  lru_pos_.assign(nb, lru_.end());
}

int64_t KvCache::bytes_per_token(const ModelConfig& config) {
  return config.n_layer * 2 * config.kv_dim() * static_cast<int64_t>(sizeof(half));
}

KvCache::SeqId KvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Seq{};
      seqs_[i].live = true;
      return static_cast<SeqId>(i);
    }
  seqs_.push_back(Seq{});
  seqs_.back().live = true;
  return static_cast<SeqId>(seqs_.size() - 1);
}

KvCache::Seq& KvCache::seq_ref(SeqId seq) {
  if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() || !seqs_[seq].live)
    throw NotFoundError(str_cat("KV cache: no sequence ", seq));
  return seqs_[seq];
}
const KvCache::Seq& KvCache::seq_ref(SeqId seq) const { return const_cast<KvCache*>(this)->seq_ref(seq); }

int32_t KvCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    // Evict the least recently released cached block.
    b = lru_.front();
    lru_.pop_front();
    lru_pos_[b] = lru_.end();
    unpublish(b);
  }
  ref_[b] = 1;
  return b;
}

void KvCache::release_block(int32_t b) {
  if (--ref_[b] > 0) return;
  if (is_published_[b]) {
    lru_pos_[b] = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

void KvCache::unpublish(int32_t b) {
  if (!is_published_[b]) return;
  auto it = by_hash_.find(hash_[b]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  is_published_[b] = 0;
}

uint64_t KvCache::chain_hash(uint64_t parent, std::span<const TokenId> tokens) const {
  // FNV-1a over the parent hash and the tokens, then a murmur finaliser.
  uint64_t h = 0xcbf29ce484222325ULL ^ parent;
  for (TokenId t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ULL;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h | 1;  // never 0
}

void KvCache::remove_sequence(SeqId seq) {
  Seq& s = seq_ref(seq);
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) release_block(*it);
  s = Seq{};
}

int64_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }

void KvCache::truncate(SeqId seq, int64_t n) {
  Seq& s = seq_ref(seq);
  if (n < 0 || n > s.length) throw InvalidArgumentError(str_cat("KV cache: cannot truncate a sequence of ", s.length, " to ", n));
  const size_t keep = static_cast<size_t>((n + block_tokens_ - 1) / block_tokens_);
  if (n % block_tokens_ != 0) {
    // The last kept block will be written again from position n: it must be this
    // sequence's own and unpublished.
    int32_t& last = s.blocks[keep - 1];
    if (ref_[last] > 1) {
      if (free_blocks() == 0)
        throw ResourceExhaustedError("KV cache full: no free block to copy a shared block into");
      const int32_t copy = take_block();
      Backend& backend = backend_for(pool_.device());
      for (int64_t l = 0; l < n_layer_; ++l)
        for (int kv = 0; kv < 2; ++kv)
          backend.copy_on_device(data() + offset(copy, l, kv, 0), data() + offset(last, l, kv, 0),
                                 static_cast<size_t>(block_tokens_ * kv_dim_) * sizeof(half), pool_.device().index);
      release_block(last);
      last = copy;
    } else {
      unpublish(last);
    }
  }
  s.length = n;
  while (s.blocks.size() > keep) {
    release_block(s.blocks.back());
    s.blocks.pop_back();
  }
  const size_t full = static_cast<size_t>(n / block_tokens_);
  if (s.published > full) {
    s.published = full;
    s.chain = full ? hash_[s.blocks[full - 1]] : 0;
    // A kept block that was never published under this chain: recompute lazily.
    if (full && !is_published_[s.blocks[full - 1]]) s.published = 0, s.chain = 0;
  }
}

int64_t KvCache::blocks_needed(SeqId seq, int64_t n) const {
  const Seq& s = seq_ref(seq);
  return std::max<int64_t>(0, (n + block_tokens_ - 1) / block_tokens_ - static_cast<int64_t>(s.blocks.size()));
}

void KvCache::grow(SeqId seq, int64_t n) {
  Seq& s = seq_ref(seq);
  const int64_t more = blocks_needed(seq, n);
  if (more > free_blocks())
    throw ResourceExhaustedError(str_cat("KV cache full: ", n, " positions need ", more, " more blocks of ", block_tokens_,
                                         ", ", free_blocks(), " of ", n_blocks_, " are free"));
  for (int64_t i = 0; i < more; ++i) s.blocks.push_back(take_block());
  if (n > s.length) s.length = n;
}

int64_t KvCache::attach_prefix(SeqId seq, std::span<const TokenId> tokens) {
  Seq& s = seq_ref(seq);
  if (s.length != 0) throw InvalidArgumentError("KV cache: attach_prefix needs an empty sequence");
  const size_t bt = static_cast<size_t>(block_tokens_);
  uint64_t chain = 0;
  for (size_t i = 0; (i + 1) * bt <= tokens.size(); ++i) {
    const auto block_tokens = tokens.subspan(i * bt, bt);
    const uint64_t h = chain_hash(chain, block_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t b = it->second;
    if (parent_[b] != chain || !std::equal(block_tokens.begin(), block_tokens.end(), tokens_.begin() + b * bt)) break;
    if (ref_[b]++ == 0) {  // was cached and unreferenced
      lru_.erase(lru_pos_[b]);
      lru_pos_[b] = lru_.end();
    }
    s.blocks.push_back(b);
    chain = h;
  }
  s.published = s.blocks.size();
  s.chain = chain;
  s.length = static_cast<int64_t>(s.blocks.size() * bt);
  return s.length;
}

void KvCache::publish(SeqId seq, std::span<const TokenId> tokens) {
  Seq& s = seq_ref(seq);
  if (static_cast<int64_t>(tokens.size()) < s.length)
    throw InvalidArgumentError(str_cat("KV cache: publish got ", tokens.size(), " tokens for a sequence of ", s.length));
  const size_t bt = static_cast<size_t>(block_tokens_);
  const size_t full = static_cast<size_t>(s.length) / bt;
  for (size_t i = s.published; i < full; ++i) {
    const auto block_tokens = tokens.subspan(i * bt, bt);
    const uint64_t h = chain_hash(s.chain, block_tokens);
    const int32_t b = s.blocks[i];
    if (!is_published_[b] && by_hash_.find(h) == by_hash_.end()) {
      hash_[b] = h;
      parent_[b] = s.chain;
      std::copy(block_tokens.begin(), block_tokens.end(), tokens_.begin() + b * bt);
      is_published_[b] = 1;
      by_hash_.emplace(h, b);
    }
    s.chain = h;
    s.published = i + 1;
  }
}

const std::vector<int32_t>& KvCache::blocks(SeqId seq) const { return seq_ref(seq).blocks; }

size_t KvCache::offset(int32_t block, int64_t layer, int kv, int64_t slot) const {
  if (layout_ == KvLayout::kRows)
    return static_cast<size_t>((((layer * 2 + kv) * n_blocks_ + block) * block_tokens_ + slot) * kv_dim_);
  return static_cast<size_t>((((block * n_layer_ + layer) * 2 + kv) * block_tokens_ + slot) * kv_dim_);
}

void KvCache::expect_layout(KvLayout layout, const char* what) const {
  if (layout_ != layout || (layout == KvLayout::kTransposedKeys && pool_.device() != Device::cpu()))
    throw InternalError(str_cat("KV cache: ", what, " does not apply to a cache in this layout on ", pool_.device().str()));
}

void KvCache::store_key(SeqId seq, int64_t layer, int64_t pos, const float* k) {
  expect_layout(KvLayout::kTransposedKeys, "store_key");
  const Seq& s = seq_ref(seq);
  half* rows = data() + offset(s.blocks[static_cast<size_t>(pos / block_tokens_)], layer, 0, 0) + pos % block_tokens_;
  thread_local std::vector<half> h;
  h.resize(static_cast<size_t>(kv_dim_));
  convert_float_to_half(k, h.data(), h.size());
  for (int64_t i = 0; i < kv_dim_; ++i) rows[i * block_tokens_] = h[static_cast<size_t>(i)];
}
half* KvCache::value(SeqId seq, int64_t layer, int64_t pos) {
  expect_layout(KvLayout::kTransposedKeys, "value");
  const Seq& s = seq_ref(seq);
  return data() + offset(s.blocks[static_cast<size_t>(pos / block_tokens_)], layer, 1, pos % block_tokens_);
}
const half* KvCache::block_keys(int32_t block, int64_t layer) const { return data() + offset(block, layer, 0, 0); }
const half* KvCache::block_values(int32_t block, int64_t layer) const { return data() + offset(block, layer, 1, 0); }

Tensor KvCache::layer_rows(int64_t layer, int kv) const {
  expect_layout(KvLayout::kRows, "layer_rows");
  return Tensor(pool_.storage(), offset(0, layer, kv, 0) * sizeof(half), Shape{n_blocks_, block_tokens_, kv_dim_}, DType::kF16);
}

}  // namespace kiln::llm
