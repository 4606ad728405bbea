// Test helpers for the allocator's components (core/detail): their records over the simulated
// device's streams, and one allocator per policy.
#pragma once

#include <string>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/core/detail/pools.hpp"
#include "sim.hpp"

namespace gpumem_test {

using sim_stream = gpumem::simulated_device::stream_type;
using sim_block = gpumem::detail::block<sim_stream>;
using sim_segment = gpumem::detail::segment<sim_stream>;
using sim_pool = gpumem::detail::pool<sim_stream>;

/// Calls f(allocator&, simulated_device&, policy) with a fresh allocator of each policy
/// ("policy:classic", "policy:expandable", "policy:stitch") on a fresh device of 1 GiB.
template <class F>
void for_each_policy(F&& f) {
  for (const char* policy : {"policy:classic", "policy:expandable", "policy:stitch"}) {
    gpumem::simulated_device dev{device_options(GiB)};
    allocator a(dev, config(policy));
    f(a, dev, std::string(policy));
  }
}

}  // namespace gpumem_test
