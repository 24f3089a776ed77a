#pragma once
// The paged KV cache: keys and values of every layer for many sequences, in a pool of
// fixed-size blocks (block_tokens positions each). A sequence holds a block table; its
// blocks need not be contiguous, so sequences of any lengths share one pool and a
// finished sequence's blocks go straight back to it (the serving engine batches
// sequences on it). Storage is f16, on the device the model runs on, in the layout its
// forward pass reads (KvLayout; Model::make_cache picks both).
//
// Prefix caching: a full block whose tokens are known can be published under the hash
// of all tokens from the sequence's start to its end. A new sequence attaches the
// longest published run of blocks that begins its prompt and skips computing them;
// blocks are reference-counted and shared read-only. Positions are only ever written at
// or past a sequence's length, and only full blocks are published or attached, so a
// shared block is never written; truncate() copies a shared block it would cut into
// (copy-on-write). Unreferenced published blocks stay cached and are reused, least
// recently released first, only when no never-published block is free.
//
// Thread-safety: none; one engine thread owns a cache. Forward passes write it.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/half.h"
#include "kiln/core/tensor.h"
#include "kiln/llm/tokenizer.h"

namespace kiln::llm {

struct ModelConfig;

// Where a block's keys and values are (offsets in halves):
enum class KvLayout : uint8_t {
  // The CPU kernels' layout: block-major; per block and layer, the keys transposed
  // (kv_dim rows of block_tokens: dimension i of slot s at i * block_tokens + s, so a
  // head's keys are the rows of a matrix whose columns are positions), then the values
  // (block_tokens rows of kv_dim).
  kTransposedKeys,
  // The tensor path's layout (kiln ops on any device): layer-major; per layer, the keys
  // of every block, then the values of every block, each a row of kv_dim per position
  // ([n_layer][2][n_blocks][block_tokens][kv_dim]): a layer's keys or values are one
  // tensor [n_blocks, block_tokens, kv_dim], which ops::index_copy writes a row per
  // position into and ops::paged_attention reads through the block tables.
  kRows,
};

struct KvCacheOptions {
  int64_t max_tokens = 4096;   // capacity of the pool, in positions (rounded up to whole blocks)
  int64_t block_tokens = 16;   // positions per block
  KvLayout layout = KvLayout::kTransposedKeys;
  Device device = Device::cpu();  // where the pool is allocated (from that device's allocator)
};

class KvCache {
 public:
  using SeqId = int32_t;
  KvCache(const ModelConfig& config, const KvCacheOptions& options);
  // Bytes one position takes (keys and values of every layer).
  static int64_t bytes_per_token(const ModelConfig& config);

  SeqId add_sequence();
  // Releases the sequence's blocks (published ones stay cached). NotFoundError for an
  // unknown id.
  void remove_sequence(SeqId seq);
  int64_t length(SeqId seq) const;
  // Drops positions >= n (n <= length): a retry from an earlier point.
  void truncate(SeqId seq, int64_t n);
  // Makes positions [0, n) writable (allocating blocks) and sets the length to n if it
  // grows. ResourceExhaustedError, and no change, when the pool has too few free blocks.
  void grow(SeqId seq, int64_t n);
  // Blocks grow(seq, n) would have to allocate.
  int64_t blocks_needed(SeqId seq, int64_t n) const;

  // Prefix caching. attach_prefix: on an empty sequence, attaches the longest run of
  // published blocks that holds tokens[0, k * block_tokens) for some k; returns the
  // positions attached (the sequence's new length). publish: registers the full blocks
  // of the sequence that are not yet published; `tokens` are the tokens at its positions
  // (at least `length` of them).
  int64_t attach_prefix(SeqId seq, std::span<const TokenId> tokens);
  void publish(SeqId seq, std::span<const TokenId> tokens);
  int64_t cached_blocks() const { return static_cast<int64_t>(lru_.size()); }  // unreferenced, published

  int64_t block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return n_blocks_; }
  // Blocks a sequence can get: never used, or cached and unreferenced.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used_blocks() const { return n_blocks_ - free_blocks(); }
  size_t bytes() const { return static_cast<size_t>(pool_.nbytes()); }

  // kTransposedKeys on the CPU (the CPU kernels' accessors; InternalError otherwise):
  // Stores the key of `layer` at position `pos` of `seq` (kv_dim floats, rounded to f16).
  void store_key(SeqId seq, int64_t layer, int64_t pos, const float* k);
  // The value of `layer` at position `pos` of `seq` (kv_dim halves, writable).
  half* value(SeqId seq, int64_t layer, int64_t pos);
  // The storage of one block's keys or values of a layer (attention walks them).
  const half* block_keys(int32_t block, int64_t layer) const;
  const half* block_values(int32_t block, int64_t layer) const;

  // kRows (InternalError otherwise): the keys (kv = 0) or values (kv = 1) of `layer`
  // as a tensor [n_blocks, block_tokens, kv_dim] sharing the pool's storage (the tensor
  // path writes and reads it with ops).
  Tensor layer_rows(int64_t layer, int kv) const;

  // The block table of a sequence.
  const std::vector<int32_t>& blocks(SeqId seq) const;
  int64_t kv_dim() const { return kv_dim_; }
  KvLayout layout() const { return layout_; }
  Device device() const { return pool_.device(); }

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
    size_t published = 0;   // leading blocks whose chain hash is known
    uint64_t chain = 0;     // hash through block `published - 1`
  };
  Seq& seq_ref(SeqId seq);
  const Seq& seq_ref(SeqId seq) const;
  size_t offset(int32_t block, int64_t layer, int kv, int64_t slot) const;
  int32_t take_block();
  void release_block(int32_t block);
  void unpublish(int32_t block);
  uint64_t chain_hash(uint64_t parent, std::span<const TokenId> tokens) const;

  void expect_layout(KvLayout layout, const char* what) const;

  int64_t n_layer_, kv_dim_, block_tokens_, n_blocks_;
  KvLayout layout_;
  // The blocks' storage, from the device's allocator (kiln/core/allocator.h): it counts
  // in the device's memory statistics and limit.
  Tensor pool_;
  half* data() const { return static_cast<half*>(pool_.raw_data()); }
  std::vector<int32_t> free_;  // unreferenced, not published
  std::vector<int32_t> ref_;
  // Published blocks: hash, parent hash, tokens; hash -> block.
  std::vector<uint64_t> hash_, parent_;
  std::vector<uint8_t> is_published_;
  std::vector<TokenId> tokens_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;  // unreferenced published blocks, least recently released first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<Seq> seqs_;
};

}  // namespace kiln::llm
