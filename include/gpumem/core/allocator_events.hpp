// gpumem — what a caching_allocator tells an event observer (set_event_observer): each action
// with its address, size and stream, PyTorch's allocator trace entries; and the memory that
// reserved memory counts (reserved_ranges), which the reserved view of segment events follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpumem {

/// A part of the device's memory that reserved memory counts (caching_allocator::reserved_ranges).
template <class Stream>
struct reserved_range {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream{};
  bool is_small = false;
  bool is_expandable = false;  ///< part of a range mapped page by page (expandable, stitch)
};

/// What the allocator did, as PyTorch's allocator trace records it (TraceEntry's actions).
enum class allocator_action {
  alloc,           ///< a block handed out (size: requested bytes)
  free_requested,  ///< a block given back (size: requested bytes)
  free_completed,  ///< a freed block reusable again (after its recorded streams' events)
  segment_alloc,   ///< memory obtained from the device (cudaMalloc; size: segment bytes)
  segment_free,    ///< memory returned to the device (cudaFree)
  segment_map,     ///< pages mapped into a VMM range (address and size of the mapped range)
  segment_unmap,   ///< pages unmapped from a VMM range
  oom              ///< an out_of_memory about to be thrown (address: device free bytes)
};

/// Which view of memory a segment event (segment_alloc / free / map / unmap) speaks for. The two
/// differ only under stitch, which may map a physical page at two addresses: the device sees two
/// mappings, reserved memory counts the page once, at the address that uses it.
enum class segment_view : std::uint8_t {
  both,      ///< a device call, and the same change in what reserved memory counts
  device,    ///< a device call only (caching_allocator::set_reserved_events on, under stitch)
  reserved,  ///< a change in what reserved memory counts only (the same, under stitch)
};

/// The action's name in PyTorch's trace entries ("alloc", "segment_map", ...).
constexpr std::string_view to_string(allocator_action a) noexcept {
  switch (a) {
    case allocator_action::alloc:
      return "alloc";
    case allocator_action::free_requested:
      return "free_requested";
    case allocator_action::free_completed:
      return "free_completed";
    case allocator_action::segment_alloc:
      return "segment_alloc";
    case allocator_action::segment_free:
      return "segment_free";
    case allocator_action::segment_map:
      return "segment_map";
    case allocator_action::segment_unmap:
      return "segment_unmap";
    case allocator_action::oom:
      return "oom";
  }
  return "oom";
}

/// One allocator_action with its address, size and stream, passed to an event observer.
template <class Stream>
struct allocator_event {
  allocator_action action = allocator_action::alloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream{};
  segment_view view = segment_view::both;  ///< for the segment actions
};

}  // namespace gpumem
