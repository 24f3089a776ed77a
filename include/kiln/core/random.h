#pragma once
// Philox4x32-10 counter-based random numbers (Salmon et al., SC'11), the generator
// TensorFlow and PyTorch use on GPUs. Element i of a draw depends only on the seed
// and i, so results are identical whatever the number of threads.
#include <array>
#include <atomic>
#include <cstdint>

namespace kiln {

struct Philox {
  // Returns 4 random 32-bit words for block `counter` under `key`.
  static std::array<uint32_t, 4> block(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);
};

// A stream of draws: the key is the seed, each draw consumes a range of counters.
// Thread-safe.
class Generator {
 public:
  explicit Generator(uint64_t seed) : seed_(seed) {}
  uint64_t seed() const { return seed_.load(); }
  // Restarts the stream from `seed`.
  void reset(uint64_t seed) {
    seed_.store(seed);
    offset_.store(0);
  }
  // Reserves `n` 32-bit words; returns the starting counter (in units of 4-word blocks).
  uint64_t reserve(uint64_t n_words) { return offset_.fetch_add((n_words + 3) / 4); }

 private:
  std::atomic<uint64_t> seed_;
  std::atomic<uint64_t> offset_{0};
};

// The process-wide default generator (seeded with 0 until set_seed is called).
Generator& default_generator();
void set_seed(uint64_t seed);
// A fresh 64-bit seed drawn from the default generator (it reserves counters, so the
// draw is disjoint from every other draw): a dropout mask's key, or the seed a
// stateful random op of a traced graph takes for one run.
uint64_t draw_seed();

// Uniform float in [0, 1) from a 32-bit word (24 significant bits).
inline float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
inline double uints_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace kiln
