// Test helpers: simulated devices and allocators with explicit configurations.
#pragma once

#include <cstddef>
#include <string>

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"

namespace gpumem_test {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

inline gpumem::simulated_device::options device_options(
    std::size_t capacity,
    gpumem::event_completion completion = gpumem::event_completion::immediate) {
  gpumem::simulated_device::options o;
  o.capacity = capacity;
  o.completion = completion;
  return o;
}

using allocator = gpumem::caching_allocator<gpumem::simulated_device>;

/// A config parsed from `text` alone (the environment is ignored so tests are hermetic).
inline gpumem::allocator_config config(const std::string& text = "") {
  gpumem::allocator_config c = gpumem::allocator_config::parse(text);
  if (c.policy == gpumem::allocator_policy::automatic) c.policy = gpumem::allocator_policy::classic;
  return c;
}

inline std::int64_t reserved(const allocator& a) {
  return a.stats().reserved_bytes[0].current;
}
inline std::int64_t allocated(const allocator& a) {
  return a.stats().allocated_bytes[0].current;
}

}  // namespace gpumem_test
