// gpumem — what the three policies do differently, as named rules. caching_allocator follows
// the rules, never the policy's name: a policy is the set of rules it turns on, chosen once in the
// constructor (docs/architecture.md, "Where each policy lives" and "How to add a policy").
#pragma once

#include "gpumem/config.hpp"

namespace gpumem::detail {

struct policy_rules {
  /// expandable, stitch: segments are address ranges mapped page by page (vmm_pages.hpp); a miss
  /// maps pages (vmm_allocate_new_block), a split leaves any remainder of 512 B or more, blocks
  /// are not counted in inactive_split, garbage collection and the release of oversize blocks
  /// leave them alone, and giving memory back unmaps pages (release_vmm_cache). What the two
  /// policies do differently on a miss, vmm_growth.hpp answers from the two rules below.
  bool maps_pages = false;
  /// expandable: one range per pool, of 9/8 of the device, grown by pages of 2 MiB (small pool)
  /// or large_segment_size; a hit takes the fit that could grow least (least_expandable).
  bool grows_one_range = false;
  /// stitch: pages of the device's granularity; large requests go to one pool per size class,
  /// which borrow free blocks of each other (borrow_block); a miss may share the free pages of
  /// cached blocks and prefer a new range (better_in_new_range), ranges sized by stitch_policy;
  /// set_no_split is refused; set_reserved_events reports the reserved view apart.
  bool stitches = false;

  static constexpr policy_rules of(allocator_policy p) noexcept {
    policy_rules r;
    r.maps_pages = p != allocator_policy::classic;  // effective_policy never gives automatic
    r.grows_one_range = p == allocator_policy::expandable;
    r.stitches = p == allocator_policy::stitch;
    return r;
  }
};

}  // namespace gpumem::detail
