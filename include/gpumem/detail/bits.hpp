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

/// `value` rounded up to a multiple of `unit` (> 0) in `out`; false, `out` untouched, when the
/// result does not fit in size_t. Every rounding of a size that comes from outside (a request, a
/// setting, a device's capacity) goes through here.
inline constexpr bool checked_round_up(std::size_t value, std::size_t unit,
                                       std::size_t& out) noexcept {
  const std::size_t rem = value % unit;
  if (rem == 0) {
    out = value;
    return true;
  }
  if (value > static_cast<std::size_t>(-1) - (unit - rem)) return false;
  out = value + (unit - rem);
  return true;
}

}  // namespace gpumem::detail
