// gpumem — the allocator's per-pool statistics, kept in the cheapest form for the hot path.
//
// PyTorch's stat arrays have an "all" entry beside the small- and large-pool entries. Its current,
// allocated and freed values are the sums of the two pools', so only the pools are updated on
// every allocation and free; the "all" peak, which is not a sum, is tracked on its own. The full
// device_stats arrays are assembled when someone asks for them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "gpumem/detail/bits.hpp"
#include "gpumem/stats.hpp"

namespace gpumem::detail {

/// The nine per-pool stats of device_stats, in its order.
enum class counter : unsigned {
  allocation,
  segment,
  active,
  inactive_split,
  allocated_bytes,
  reserved_bytes,
  active_bytes,
  inactive_split_bytes,
  requested_bytes,
};
inline constexpr std::size_t num_counters = 9;

/// The counter's name in device_stats (and in the invariant checker's messages).
constexpr const char* counter_name(counter c) noexcept {
  constexpr const char* names[num_counters] = {
      "allocation",      "segment",        "active",       "inactive_split",
      "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
      "requested_bytes"};
  return names[static_cast<std::size_t>(c)];
}

class pool_counters {
 public:
  GPUMEM_ALWAYS_INLINE void increase(bool small_pool, counter c, std::int64_t amount) noexcept {
    const auto i = static_cast<std::size_t>(c);
    stat& s = pools_[small_pool ? 0 : 1][i];
    s.increase(amount);
    const std::int64_t total = s.current + pools_[small_pool ? 1 : 0][i].current;
    if (total > all_peak_[i]) all_peak_[i] = total;
  }
  GPUMEM_ALWAYS_INLINE void decrease(bool small_pool, counter c, std::int64_t amount) noexcept {
    pools_[small_pool ? 0 : 1][static_cast<std::size_t>(c)].decrease(amount);
  }
  /// increase by `delta` when positive, decrease by -delta when negative, nothing when 0.
  GPUMEM_ALWAYS_INLINE void change(bool small_pool, counter c, std::int64_t delta) noexcept {
    if (delta > 0) increase(small_pool, c, delta);
    if (delta < 0) decrease(small_pool, c, -delta);
  }

  /// The "all" entry's current value.
  std::int64_t current(counter c) const noexcept {
    const auto i = static_cast<std::size_t>(c);
    return pools_[0][i].current + pools_[1][i].current;
  }
  std::int64_t peak(counter c) const noexcept { return all_peak_[static_cast<std::size_t>(c)]; }

  /// PyTorch's array for one stat: [all, small pool, large pool].
  stat_array get(counter c) const noexcept {
    const auto i = static_cast<std::size_t>(c);
    const stat& small = pools_[0][i];
    const stat& large = pools_[1][i];
    stat all;
    all.current = small.current + large.current;
    all.peak = all_peak_[i];
    all.allocated = small.allocated + large.allocated;
    all.freed = small.freed + large.freed;
    return {all, small, large};
  }

  void export_to(device_stats& out) const noexcept {
    out.allocation = get(counter::allocation);
    out.segment = get(counter::segment);
    out.active = get(counter::active);
    out.inactive_split = get(counter::inactive_split);
    out.allocated_bytes = get(counter::allocated_bytes);
    out.reserved_bytes = get(counter::reserved_bytes);
    out.active_bytes = get(counter::active_bytes);
    out.inactive_split_bytes = get(counter::inactive_split_bytes);
    out.requested_bytes = get(counter::requested_bytes);
  }

  void reset_peak() noexcept {
    for (std::size_t i = 0; i < num_counters; ++i) {
      pools_[0][i].reset_peak();
      pools_[1][i].reset_peak();
      all_peak_[i] = pools_[0][i].current + pools_[1][i].current;
    }
  }
  void reset_accumulated() noexcept {
    for (auto& pool : pools_) {
      for (stat& s : pool) s.reset_accumulated();
    }
  }

  /// What the blocks say each counter should be: [counter][all, small pool, large pool].
  using recount = std::array<std::array<std::int64_t, num_stat_types>, num_counters>;

  /// Every counter equals `expected` and is at most its peak. Throws std::logic_error naming the
  /// first that is not.
  void check(const recount& expected) const {
    for (std::size_t i = 0; i < num_counters; ++i) {
      const auto c = static_cast<counter>(i);
      const stat_array a = get(c);
      for (std::size_t t = 0; t < num_stat_types; ++t) {
        if (a[t].current != expected[i][t]) {
          throw std::logic_error(
              fmt::format("gpumem invariant violated: stat {}[{}] is {} but the blocks say {}",
                          counter_name(c), t, a[t].current, expected[i][t]));
        }
        if (a[t].current > a[t].peak) {
          throw std::logic_error(fmt::format(
              "gpumem invariant violated: stat {}[{}] is above its peak", counter_name(c), t));
        }
      }
    }
  }

 private:
  std::array<std::array<stat, num_counters>, 2> pools_{};  // [small, large]
  std::array<std::int64_t, num_counters> all_peak_{};
};

}  // namespace gpumem::detail
