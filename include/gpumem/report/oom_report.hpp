// gpumem — the out-of-memory message: PyTorch's familiar sentence, then a diagnosis.
//
// Depends only on error.hpp: the allocator gathers the numbers, this header words them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "gpumem/detail/format.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

/// PyTorch's format_size ("512 bytes", "1.50 KiB", "20.00 MiB", "1.25 GiB"), as in its OOM message.
using detail::format_size;

/// Everything the diagnosis needs, gathered by the allocator at the moment of the failure.
struct oom_facts {
  out_of_memory::details numbers;
  std::size_t largest_free_block_in_pool = 0;  // in the pool (stream, small/large) of the request
  std::size_t free_cached_blocks = 0;          // number of free cached blocks
  bool fraction_set = false;
  double fraction = 1.0;
  std::size_t fraction_cap_bytes = 0;  // fraction x device total
  bool fraction_was_limit = false;     // the cap, not the device, refused the segment
  std::size_t max_split_size = 0;      // SIZE_MAX when unset
  std::string policy;                  // "classic", ...
};

namespace detail {

inline std::string oom_suggestion(const oom_facts& f) {
  const auto& n = f.numbers;
  const std::size_t unallocated = n.reserved_bytes - n.allocated_bytes;
  if (f.fraction_was_limit && n.device_free_bytes >= n.device_request_bytes) {
    return fmt::format(
        "the memory fraction ({:.3g}) refused it while the device still had {} free: raise it "
        "(per_process_memory_fraction:<f> or set_memory_fraction)",
        f.fraction, format_size(n.device_free_bytes));
  }
  if (unallocated >= n.rounded_bytes) {
    if (f.policy == "stitch") {
      return fmt::format(
          "{} is reserved but unallocated, yet the free pages could not be stitched into this "
          "request: what is left is partial pages at the edges of live blocks and the small "
          "pool's 2 MiB segments; reduce the memory the program keeps alive",
          format_size(unallocated));
    }
    std::string s = fmt::format(
        "{} is reserved but unallocated, enough for this request, yet no free block is large "
        "enough: this is fragmentation. policy:stitch{} lets the free pages of cached blocks "
        "serve new requests",
        format_size(unallocated), f.policy == "classic" ? " (or expandable_segments:True)" : "");
    if (f.policy == "classic" && f.max_split_size == SIZE_MAX && n.rounded_bytes > (20u << 20)) {
      s += "; max_split_size_mb:<MiB> stops large cached blocks from being split for small "
           "requests";
    }
    return s;
  }
  if (unallocated + n.device_free_bytes >= n.rounded_bytes) {
    // Enough memory in all, but split between the cache and the device: neither holds it whole.
    if (f.policy == "stitch") {
      return fmt::format(
          "{} is cached and {} is free on the device, enough together, yet the cached pages could "
          "not be stitched into this request: what is left is partial pages at the edges of live "
          "blocks and the small pool's 2 MiB segments; reduce the memory the program keeps alive",
          format_size(unallocated), format_size(n.device_free_bytes));
    }
    return fmt::format(
        "{} is cached but unallocated and {} is free on the device: enough together for this "
        "request, but the cached memory sits in segments that live blocks keep (they cannot be "
        "released) and is not in one piece: this is fragmentation. policy:stitch{} lets the free "
        "pages of cached blocks serve new requests",
        format_size(unallocated), format_size(n.device_free_bytes),
        f.policy == "classic" ? " (or expandable_segments:True)" : "");
  }
  return fmt::format(
      "the live allocations ({}) plus this request exceed what the device can hold: reduce "
      "the memory the program keeps alive (smaller batches, activation checkpointing, gradient "
      "accumulation)",
      format_size(n.allocated_bytes));
}

}  // namespace detail

/// Builds out_of_memory's message. Thread safety: pure function.
inline std::string oom_message(const oom_facts& f) {
  const auto& n = f.numbers;
  std::string allowed;
  if (f.fraction_set) allowed = format_size(f.fraction_cap_bytes) + " allowed; ";
  std::string msg = fmt::format(
      "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} "
      "is free. {}Of the allocated memory {} is allocated by gpumem, and {} is reserved by gpumem "
      "but unallocated.",
      format_size(n.device_request_bytes), n.device, format_size(n.device_total_bytes),
      format_size(n.device_free_bytes), allowed, format_size(n.allocated_bytes),
      format_size(n.reserved_bytes - n.allocated_bytes));
  const std::size_t unallocated = n.reserved_bytes - n.allocated_bytes;
  const double frag_pct = n.reserved_bytes == 0 ? 0.0
                                                : 100.0 * static_cast<double>(unallocated) /
                                                      static_cast<double>(n.reserved_bytes);
  msg += fmt::format(
      "\ngpumem diagnosis ({} policy):\n"
      "  request: {} requested, {} after rounding, a {} segment asked of the device\n"
      "  largest free block: {} overall, {} in this request's pool\n"
      "  free cached: {} in {} blocks\n"
      "  fragmentation: {} of the {} reserved ({:.1f}%) is cached but unallocated\n",
      f.policy, format_size(n.requested_bytes), format_size(n.rounded_bytes),
      format_size(n.device_request_bytes), format_size(n.largest_free_block_bytes),
      format_size(f.largest_free_block_in_pool), format_size(n.free_cached_bytes),
      f.free_cached_blocks, format_size(unallocated), format_size(n.reserved_bytes), frag_pct);
  if (f.fraction_set) {
    msg += fmt::format("  memory fraction: {:.3g} caps reserved memory at {}\n", f.fraction,
                       format_size(f.fraction_cap_bytes));
  }
  msg += "  suggestion: " + detail::oom_suggestion(f);
  return msg;
}

/// The message of a preemptive rejection (throw_on_cudamalloc_oom): PyTorch's sentence, then
/// why: the reserved bytes counted, the segment the miss needed, and the limit with the fraction
/// and device total it comes from. Thread safety: pure function.
inline std::string oom_rejection_message(const out_of_memory::details& n, double fraction) {
  return fmt::format(
      "CUDA out of memory. Allocation was preemptively rejected because it would exceed "
      "per_process_memory_fraction limit. Requested size: {}.\n"
      "gpumem: throw_on_cudamalloc_oom refused this request before asking the device: {} "
      "reserved + a {} segment would exceed the limit of {} (per_process_memory_fraction {:.3g} "
      "of the device's {}). The cache was not released; empty_cache() or freeing tensors makes "
      "room, or set throw_on_cudamalloc_oom:False to release the cache and retry instead.",
      format_size(n.requested_bytes), format_size(n.counted_reserved_bytes),
      format_size(n.device_request_bytes), format_size(n.limit_bytes), fraction,
      format_size(n.device_total_bytes));
}

}  // namespace gpumem
