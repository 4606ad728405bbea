// gpumem — byte sizes as people write them ("80GiB", "512MiB", "1.5GiB", "1024") and back.
//
// Used for device capacities (replay tool, simulated device) and anywhere a size is read from text.
// Units are binary (IEC). Decimal units (KB, MB, GB, TB) are rejected on purpose: GPU vendors sell
// "80GB" cards that hold 80 GiB, so guessing either way would silently size a simulated device 7 %
// wrong; the error message says what to write instead.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpumem/detail/utf8.hpp"

namespace gpumem {

namespace detail {

inline constexpr std::size_t kib = std::size_t{1} << 10;
inline constexpr std::size_t mib = std::size_t{1} << 20;
inline constexpr std::size_t gib = std::size_t{1} << 30;
inline constexpr std::size_t tib = std::size_t{1} << 40;
inline constexpr std::size_t pib = std::size_t{1} << 50;

/// ASCII lower-casing of a short unit string (locale-independent on purpose).
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

[[noreturn]] inline void throw_bad_size(std::string_view text, std::string_view why) {
  throw std::invalid_argument(fmt::format(
      "invalid size \"{}\": {} (expected a non-negative number with an optional binary unit, "
      "e.g. \"80GiB\", \"512MiB\", \"1.5GiB\", \"64K\", \"1024\")",
      printable_excerpt(text), why));
}

}  // namespace detail

/// Parses a byte size: a decimal number (digits, optionally a fraction such as "1.5") followed,
/// optionally after spaces, by a unit. Units (case-insensitive): none or "B" = bytes; "K", "KiB";
/// "M", "MiB"; "G", "GiB"; "T", "TiB"; "P", "PiB" — all powers of 1024. Leading and trailing spaces
/// are ignored. A fractional result is rounded down to a whole byte ("0.1KiB" = 102).
/// Thread-safe. Throws std::invalid_argument naming the text and the problem for an empty string,
/// a missing or malformed number, a sign, an exponent, an unknown or decimal unit (KB, MB, GB, TB),
/// or a value above SIZE_MAX.
inline std::size_t parse_size(std::string_view text) {
  const std::string_view original = text;
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  if (text.empty()) detail::throw_bad_size(original, "empty");
  if (text.front() == '-' || text.front() == '+') {
    detail::throw_bad_size(original, "signs are not allowed");
  }

  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  std::size_t pos = 0;
  std::size_t integer = 0;
  bool overflow = false;
  std::size_t digits = 0;
  for (; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]));
       ++pos, ++digits) {
    const auto d = static_cast<std::size_t>(text[pos] - '0');
    if (integer > (max - d) / 10) overflow = true;
    if (!overflow) integer = integer * 10 + d;
  }
  // The fraction is kept as a long double; it only ever contributes less than one unit.
  long double fraction = 0.0L;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    long double scale = 0.1L;
    for (; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]));
         ++pos, ++digits) {
      fraction += static_cast<long double>(text[pos] - '0') * scale;
      scale /= 10.0L;
    }
  }
  if (digits == 0) detail::throw_bad_size(original, "no number");

  std::string_view unit_text = text.substr(pos);
  while (!unit_text.empty() && std::isspace(static_cast<unsigned char>(unit_text.front()))) {
    unit_text.remove_prefix(1);
  }
  const std::string unit_name = detail::ascii_lower(unit_text);
  std::size_t unit = 0;
  if (unit_name.empty() || unit_name == "b") {
    unit = 1;
  } else if (unit_name == "k" || unit_name == "kib") {
    unit = detail::kib;
  } else if (unit_name == "m" || unit_name == "mib") {
    unit = detail::mib;
  } else if (unit_name == "g" || unit_name == "gib") {
    unit = detail::gib;
  } else if (unit_name == "t" || unit_name == "tib") {
    unit = detail::tib;
  } else if (unit_name == "p" || unit_name == "pib") {
    unit = detail::pib;
  } else if (unit_name == "kb" || unit_name == "mb" || unit_name == "gb" || unit_name == "tb" ||
             unit_name == "pb") {
    detail::throw_bad_size(
        original, fmt::format("decimal unit \"{}\" is ambiguous; write \"{}iB\" for powers of 1024 "
                              "or give the exact number of bytes",
                              unit_text, unit_text.substr(0, 1)));
  } else {
    detail::throw_bad_size(
        original, fmt::format("unknown unit \"{}\"", detail::printable_excerpt(unit_text)));
  }

  if (overflow || (integer != 0 && integer > max / unit)) {
    detail::throw_bad_size(original, "larger than SIZE_MAX");
  }
  std::size_t bytes = integer * unit;
  const long double extra = fraction * static_cast<long double>(unit);  // < unit, fits
  const auto extra_bytes = static_cast<std::size_t>(extra);
  if (extra_bytes > max - bytes) detail::throw_bad_size(original, "larger than SIZE_MAX");
  bytes += extra_bytes;
  return bytes;
}

/// Formats a byte count with the largest binary unit it reaches: "1024 B" stays "1 KiB",
/// "80 GiB" exactly, "1.50 GiB" with two decimals when not a whole number of that unit. Whole
/// results round-trip through parse_size. Thread-safe; throws std::bad_alloc only.
inline std::string format_bytes(std::size_t bytes) {
  static constexpr const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t unit = 1;
  std::size_t index = 0;
  while (index + 1 < sizeof(names) / sizeof(names[0]) && bytes / 1024 >= unit) {
    unit *= 1024;
    ++index;
  }
  if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, names[index]);
  return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(unit),
                     names[index]);
}

}  // namespace gpumem
