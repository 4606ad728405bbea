// gpumem — bit arithmetic shared by the configuration and the size policy.
#pragma once

#include <cstddef>
#include <cstdint>

// Forces inlining on the allocator's hot path, where GCC otherwise keeps small lambdas out of line.
#if defined(__GNUC__) || defined(__clang__)
#define GPUMEM_ALWAYS_INLINE __attribute__((always_inline))
#else
#define GPUMEM_ALWAYS_INLINE
#endif

namespace gpumem::detail {

inline constexpr bool is_power_of_two(std::uint64_t v) noexcept {
  return v != 0 && (v & (v - 1)) == 0;
}

/// floor(log2(v)) for v > 0.
inline constexpr std::size_t floor_log2(std::uint64_t v) noexcept {
  return static_cast<std::size_t>(63 - __builtin_clzll(static_cast<unsigned long long>(v)));
}

}  // namespace gpumem::detail
