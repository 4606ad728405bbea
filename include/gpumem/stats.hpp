// gpumem — allocator statistics with exactly PyTorch's fields and key names.
//
// Vocabulary: a *stat* is a gauge with four numbers (current, peak, allocated = total increases,
// freed = total decreases), as in c10::CachingAllocator::Stat. Array stats have one entry per
// stat_type: all pools, the small pool (blocks <= 1 MiB), the large pool.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpumem {

/// One gauge: current value, peak since the last reset_peak, and totals of increases/decreases.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) noexcept {
    current += amount;
    peak = std::max(current, peak);
    allocated += amount;
  }
  void decrease(std::int64_t amount) noexcept {
    current -= amount;
    freed += amount;
  }
  void reset_accumulated() noexcept { allocated = freed = 0; }
  void reset_peak() noexcept { peak = current; }
  friend bool operator==(const stat& a, const stat& b) noexcept {
    return a.current == b.current && a.peak == b.peak && a.allocated == b.allocated &&
           a.freed == b.freed;
  }
  friend bool operator!=(const stat& a, const stat& b) noexcept { return !(a == b); }
};

/// Index into the per-pool stat arrays, in PyTorch's order.
enum class stat_type : std::size_t { all = 0, small_pool = 1, large_pool = 2 };
inline constexpr std::size_t num_stat_types = 3;
using stat_array = std::array<stat, num_stat_types>;

/// The allocator's statistics; the same fields as c10::CachingAllocator::DeviceStats.
struct device_stats {
  stat_array allocation;       ///< number of allocated blocks
  stat_array segment;          ///< number of segments obtained from the device
  stat_array active;           ///< allocated blocks plus blocks awaiting stream events
  stat_array inactive_split;   ///< free blocks that cannot be released (part of a split segment)
  stat_array allocated_bytes;  ///< bytes in allocated blocks (rounded sizes)
  stat_array reserved_bytes;   ///< bytes obtained from the device
  stat_array active_bytes;     ///< bytes in active blocks
  stat_array inactive_split_bytes;  ///< bytes in inactive split blocks
  stat_array requested_bytes;       ///< bytes the user asked for (before rounding)

  std::int64_t num_alloc_retries = 0;     ///< device allocations retried after freeing the cache
  std::int64_t num_ooms = 0;              ///< out_of_memory errors thrown
  std::int64_t num_sync_all_streams = 0;  ///< full synchronisations before releasing memory
  std::int64_t num_device_alloc = 0;      ///< device allocation calls (cudaMalloc, cuMemCreate)
  std::int64_t num_device_free = 0;       ///< device release calls (cudaFree, cuMemRelease)
  std::int64_t num_oom_rejections = 0;    ///< misses refused by throw_on_cudamalloc_oom

  stat oversize_allocations;  ///< allocated blocks of at least max_split_size
  stat oversize_segments;     ///< segments of at least max_split_size

  std::int64_t max_split_size = 0;  ///< max_split_size in bytes; -1 (SIZE_MAX cast) when unset

  static stat& get(stat_array& arr, stat_type t) noexcept {
    return arr[static_cast<std::size_t>(t)];
  }
  static const stat& get(const stat_array& arr, stat_type t) noexcept {
    return arr[static_cast<std::size_t>(t)];
  }
};

}  // namespace gpumem
