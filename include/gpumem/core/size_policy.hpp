// gpumem — the classic policy's size rules, exactly PyTorch's CUDACachingAllocator constants.
//
// round_size: what a request becomes before it is looked up (512 B granules, or power-of-two
// divisions); segment_size_for: how large a segment is obtained for a request that misses the
// cache; should_split: whether the remainder of a larger cached block is kept as a free block.
// stitch_size_class: the stitch policy's size classes, one pool per class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "gpumem/detail/bits.hpp"

namespace gpumem::detail {

inline constexpr std::size_t k_min_block_size = 512;         // every size is a multiple of this
inline constexpr std::size_t k_small_size = 1u << 20;        // largest request for the small pool
inline constexpr std::size_t k_small_buffer = 2u << 20;      // small-pool segment size
inline constexpr std::size_t k_large_buffer = 20u << 20;     // segment for requests < 10 MiB
inline constexpr std::size_t k_min_large_alloc = 10u << 20;  // below this, take a 20 MiB segment
inline constexpr std::size_t k_round_large = 2u << 20;       // larger segments round to this
// Requests above this cannot be rounded without overflow; they are reported as out of memory.
inline constexpr std::size_t k_max_request = std::size_t{1} << 60;

/// The next of `divisions` equal steps between the powers of two around `size` (PyTorch's
/// roundup_power2_next_division). 1200 with 4 divisions: steps of 256 above 1024 -> 1280.
inline constexpr std::size_t roundup_power2_next_division(std::size_t size,
                                                          std::size_t divisions) noexcept {
  if (is_power_of_two(size)) return size;
  const std::size_t power2_floor = std::size_t{1} << floor_log2(size);
  const std::size_t step = power2_floor >> floor_log2(divisions);
  if (step == 0) return power2_floor << 1;
  const std::size_t floor = size & ~(step - 1);
  return floor == size ? size : floor + step;
}

/// PyTorch's round_size. Note PyTorch applies the power-of-two divisions only when the size is
/// above 512 B x divisions; below that it keeps 512 B granules (so 1200 B with 4 divisions is
/// 1536 B in PyTorch's code, although its documentation's example says 1280 B). gpumem follows
/// the code, because replays must reproduce what PyTorch really does.
inline constexpr std::size_t round_size(std::size_t size, std::size_t divisions) noexcept {
  if (size < k_min_block_size) return k_min_block_size;
  if (divisions > 1 && size > k_min_block_size * divisions) {
    return roundup_power2_next_division(size, divisions);
  }
  return k_min_block_size * ((size + k_min_block_size - 1) / k_min_block_size);
}

/// Whether a (rounded) request is served from the small pool.
inline constexpr bool is_small_request(std::size_t rounded) noexcept {
  return rounded <= k_small_size;
}

/// Size of the segment obtained from the device when a rounded request misses the cache.
/// `large_segment_size` is PyTorch 2.11's large_segment_size_mb (20 MiB by default).
inline constexpr std::size_t segment_size_for(
    std::size_t rounded, std::size_t large_segment_size = k_large_buffer) noexcept {
  if (rounded <= k_small_size) return k_small_buffer;
  if (rounded < k_min_large_alloc) return large_segment_size;
  return k_round_large * ((rounded + k_round_large - 1) / k_round_large);
}

/// The stitch policy's size classes of large requests (rounded > 1 MiB): four per power of two,
/// [2^k, 1.25 x 2^k), [1.25 x 2^k, 1.5 x 2^k), [1.5 x 2^k, 1.75 x 2^k), [1.75 x 2^k, 2^(k+1)).
/// Stitch keeps a pool, with address ranges of its own, per stream and class.
inline constexpr std::size_t k_stitch_class_bits = 2;
inline constexpr std::size_t k_stitch_classes =
    (floor_log2(k_max_request) - floor_log2(k_small_size) + 1) << k_stitch_class_bits;

/// The stitch size class of a rounded large request (k_small_size < rounded <= k_max_request).
inline constexpr std::size_t stitch_size_class(std::size_t rounded) noexcept {
  const std::size_t level = floor_log2(rounded);
  const std::size_t sub =
      (rounded >> (level - k_stitch_class_bits)) & ((std::size_t{1} << k_stitch_class_bits) - 1);
  return ((level - floor_log2(k_small_size)) << k_stitch_class_bits) | sub;
}

/// Whether a cached block of `block_size` serving `rounded` keeps its remainder as a free block.
inline constexpr bool should_split(std::size_t block_size, std::size_t rounded, bool small_pool,
                                   std::size_t max_split_size) noexcept {
  const std::size_t remaining = block_size - rounded;
  if (small_pool) return remaining >= k_min_block_size;
  return rounded < max_split_size && remaining > k_small_size;
}

}  // namespace gpumem::detail
