// gpumem — size and count formatting helpers shared by the reports.
//
// Two families live here:
//  * pytorch_table_size / pytorch_table_count reproduce the cell formatters of
//    torch.cuda.memory_summary() (Python's _format_size / _format_count) bit for bit, including
//    Python's floor division and its int-then-float comparisons, so that gpumem's table can be
//    diffed against PyTorch's;
//  * format_size reproduces c10's size pretty-printer ("62.00 MiB"), the one PyTorch's OOM
//    message uses, so that prose numbers read the way PyTorch users expect.
// Nothing here is part of the public API; call the report functions instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpumem/detail/size_units.hpp"

namespace gpumem::detail {

/// Python's `a // b` for b > 0: rounds towards negative infinity where C++ truncates towards zero.
/// Thread-safe; never throws.
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/// One size cell of memory_summary's table (10 characters for any value below 10^6 of its unit):
/// `value` in the largest unit (B, KiB, ... PiB) that keeps `preferred` (the "all" row of the same
/// column) at least 768 of that unit, integer-divided. Thread-safe; throws std::bad_alloc only.
inline std::string pytorch_table_size(std::int64_t value, std::int64_t preferred) {
  static constexpr const char* units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr std::size_t num_units = sizeof(units) / sizeof(units[0]);
  constexpr std::int64_t threshold = 768 * 1024;
  std::size_t unit = 0;
  // PyTorch compares the integer before the first step and a float afterwards (pref_sz /= 1024).
  // double(preferred) / 1024 is the correctly rounded quotient Python computes (dividing by a power
  // of two commutes with rounding), so the result agrees even beyond 2^53.
  if (preferred >= threshold) {
    double pref = static_cast<double>(preferred);
    do {
      ++unit;
      value = floor_div(value, 1024);
      pref /= 1024.0;
    } while (unit + 1 < num_units && !(pref < static_cast<double>(threshold)));
  }
  return fmt::format("{:6d} {}", value, units[unit]);
}

/// One count cell of memory_summary's table: `value` in units of 1, K (10^3) or M (10^6), the
/// largest that keeps `preferred` at least 750 of that unit, integer-divided. Thread-safe; throws
/// std::bad_alloc only.
inline std::string pytorch_table_count(std::int64_t value, std::int64_t preferred) {
  static constexpr const char* units[] = {" ", "K", "M"};
  constexpr std::size_t num_units = sizeof(units) / sizeof(units[0]);
  constexpr std::int64_t threshold = 750 * 1000;
  std::size_t unit = 0;
  // Python divides by 1000 as a float. double(preferred) / 1000 can differ from Python's correctly
  // rounded quotient only above 2^53, where the quotient is far above the threshold either way.
  if (preferred >= threshold) {
    double pref = static_cast<double>(preferred);
    do {
      ++unit;
      value = floor_div(value, 1000);
      pref /= 1000.0;
    } while (unit + 1 < num_units && !(pref < static_cast<double>(threshold)));
  }
  return fmt::format("{:7d} {} ", value, units[unit]);
}

/// A byte count the way c10's format_size prints it in PyTorch's OOM message: "N bytes" up to
/// 1 KiB, then two decimals of KiB (up to 1 MiB), MiB (up to 1 GiB) or GiB. Thread-safe; throws
/// std::bad_alloc only.
inline std::string format_size(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes <= kib) return fmt::format("{} bytes", bytes);
  if (bytes <= mib) return fmt::format("{:.2f} KiB", b / static_cast<double>(kib));
  if (bytes <= gib) return fmt::format("{:.2f} MiB", b / static_cast<double>(mib));
  return fmt::format("{:.2f} GiB", b / static_cast<double>(gib));
}

/// Splits `text` into lines of at most `width` characters (width > 0). Prefers to break after a
/// comma or at a space (the space is dropped), so that config strings like "a:1,b:[c:2,d:3]" wrap
/// between entries; a run without such a break point is cut at `width`. Returns one empty line for
/// empty text. Thread-safe; throws std::bad_alloc only.
inline std::vector<std::string> wrap_text(std::string_view text, std::size_t width) {
  std::vector<std::string> lines;
  if (width == 0) width = 1;
  while (text.size() > width) {
    std::size_t cut = 0;     // characters that stay on this line
    std::size_t resume = 0;  // where the next line starts
    for (std::size_t i = width; i > 0; --i) {
      if (text[i] == ' ') {  // break at the space and drop it
        cut = i;
        resume = i + 1;
        break;
      }
      if (text[i - 1] == ',') {  // break after the comma
        cut = i;
        resume = i;
        break;
      }
    }
    if (cut == 0) cut = resume = width;
    lines.emplace_back(text.substr(0, cut));
    text.remove_prefix(resume);
  }
  lines.emplace_back(text);
  return lines;
}

}  // namespace gpumem::detail
