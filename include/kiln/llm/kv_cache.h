#pragma once
// The paged KV cache: keys and values of every layer for many sequences, in a pool of
// fixed-size blocks (block_tokens positions each). A sequence holds a block table; its
// blocks need not be contiguous, so sequences of any lengths share one pool and a
// finished sequence's blocks go straight back to it (the serving engine batches
// sequences on it). Storage is f16.
//
// Thread-safety: none; one engine thread owns a cache. Forward passes write it.
#include <cstdint>
#include <vector>

#include "kiln/core/half.h"

namespace kiln::llm {

struct ModelConfig;

struct KvCacheOptions {
  int64_t max_tokens = 4096;   // capacity of the pool, in positions (rounded up to whole blocks)
  int64_t block_tokens = 16;   // positions per block
};

class KvCache {
 public:
  using SeqId = int32_t;
  KvCache(const ModelConfig& config, const KvCacheOptions& options);

  SeqId add_sequence();
  // Frees the sequence's blocks. NotFoundError for an unknown id.
  void remove_sequence(SeqId seq);
  int64_t length(SeqId seq) const;
  // Drops positions >= n (n <= length): a retry from an earlier point.
  void truncate(SeqId seq, int64_t n);
  // Makes positions [0, n) writable (allocating blocks) and sets the length to n if it
  // grows. ResourceExhaustedError, and no change, when the pool has too few free blocks.
  void grow(SeqId seq, int64_t n);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return n_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  size_t bytes() const { return data_.size() * sizeof(half); }

  // Keys / values of `layer` at position `pos` of `seq` (kv_dim halves, writable).
  half* key(SeqId seq, int64_t layer, int64_t pos);
  half* value(SeqId seq, int64_t layer, int64_t pos);
  // The block table of a sequence and the storage of one block (attention walks them):
  // block b holds, per layer, block_tokens keys then block_tokens values of kv_dim.
  const std::vector<int32_t>& blocks(SeqId seq) const;
  const half* block_keys(int32_t block, int64_t layer) const;
  const half* block_values(int32_t block, int64_t layer) const;
  int64_t kv_dim() const { return kv_dim_; }

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  Seq& seq_ref(SeqId seq);
  const Seq& seq_ref(SeqId seq) const;
  size_t offset(int32_t block, int64_t layer, int kv, int64_t slot) const;

  int64_t n_layer_, kv_dim_, block_tokens_, n_blocks_;
  std::vector<half> data_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
};

}  // namespace kiln::llm
