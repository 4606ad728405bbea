// gpumem — what an out_of_memory says about the allocator. An ordinary out-of-memory and a
// preemptive rejection (throw_on_cudamalloc_oom) describe the request and the memory in use the
// same way; only the device's free bytes (asked for by the former only) and the rejection's
// limit differ, and the allocator adds those. report/oom_report.hpp words the message.
#pragma once

#include <cstddef>

#include "gpumem/core/detail/pool_counters.hpp"
#include "gpumem/core/detail/pools.hpp"
#include "gpumem/error.hpp"

namespace gpumem::detail {

/// The miss that failed: the caller's size, its rounding, and what the device was asked for (the
/// segment, or under a VMM policy the request rounded to pages).
struct oom_request {
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t device_request = 0;
};

/// Fills the request and the usage fields of `n`: the device's total (`device_total`, as the
/// caller knows it), allocated and reserved bytes, the free cache over every pool, the device.
inline void describe_usage(out_of_memory::details& n, const oom_request& r,
                           std::size_t device_total, const pool_counters& counts,
                           const free_cache_totals& free, int device) noexcept {
  n.requested_bytes = r.requested;
  n.rounded_bytes = r.rounded;
  n.device_request_bytes = r.device_request;
  n.device_total_bytes = device_total;
  n.allocated_bytes = static_cast<std::size_t>(counts.current(counter::allocated_bytes));
  n.reserved_bytes = static_cast<std::size_t>(counts.current(counter::reserved_bytes));
  n.largest_free_block_bytes = free.largest;
  n.free_cached_bytes = free.bytes;
  n.device = device;
}

}  // namespace gpumem::detail
