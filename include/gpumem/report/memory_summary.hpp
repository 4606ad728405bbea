// gpumem — memory_summary(): torch.cuda.memory_summary()'s table for device_stats, then gpumem's
// own analysis of the reserve, in the same 75-column box.
//
// The table is PyTorch's, character for character, for the same numbers (torch/cuda/memory.py):
// every line is "|" + 75 characters + "|" (longer only where a number outgrows its field, exactly
// as in PyTorch), the output ends with a newline, and cells follow PyTorch's unit rules — a size
// column steps B -> KiB -> MiB -> GiB -> TiB -> PiB while the "all" row's value in that column is
// at least 768 of the next unit, a count column steps " " -> K -> M while it is at least 750 000
// of the current unit, and the pool rows are shown, integer-divided, in the "all" row's unit.
//
// The one deliberate difference in memory_summary() is the title, which names gpumem:
//   PyTorch: " " + 16 spaces + " PyTorch CUDA memory summary, device ID " + device (<17) + " "
//   gpumem:  " " + 17 spaces + " gpumem CUDA memory summary, device ID "  + device (<17) + " "
// "gpumem" is one character shorter than "PyTorch", so one more leading space keeps the line at 75
// characters and puts "device ID" and the device number in the same columns as PyTorch's.
// pytorch_memory_summary() keeps PyTorch's title, for diffing against PyTorch's own output.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/detail/format.hpp"
#include "gpumem/stats.hpp"

namespace gpumem {

/// What memory_summary() reports beyond device_stats; filled by the allocator from its block
/// index at the moment the summary is taken.
struct summary_info {
  int device = 0;
  std::size_t largest_free_block = 0;           ///< bytes in the largest free cached block
  std::size_t free_cached_bytes = 0;            ///< reserved - active: bytes in free cached blocks
  std::size_t fragmentation_bytes = 0;          ///< reserved - allocated, now
  std::size_t peak_reserved_bytes = 0;          ///< the peak of reserved bytes
  std::size_t fragmentation_at_peak_bytes = 0;  ///< reserved - allocated when reserved peaked
  std::int64_t device_alloc_calls = 0;          ///< cudaMalloc / cuMemCreate / map calls
  std::int64_t device_free_calls = 0;           ///< cudaFree / cuMemRelease / unmap calls
  std::int64_t device_sync_calls = 0;           ///< device synchronisations
  std::string policy;                           ///< e.g. "classic"
  std::string config;                           ///< canonical config string ("" = defaults)
};

namespace detail {

inline constexpr std::size_t summary_width = 75;  // characters between the '|' borders
// The gpumem section's rows: " " + label + " | " + value + " ", the label as wide as PyTorch's.
inline constexpr std::size_t section_label_width = 21;
inline constexpr std::size_t section_value_width = summary_width - section_label_width - 5;

/// PyTorch's title line with `product` in place of "PyTorch" (see the top of this file).
inline std::string summary_title(std::string_view product, int device) {
  // PyTorch pads 16 + 2 spaces before its 7-character name; keep the name's end where it is.
  constexpr std::size_t pytorch_name_size = 7;
  const std::size_t lead = 16 + pytorch_name_size - std::min(product.size(), pytorch_name_size);
  return fmt::format(" {:{}} {} CUDA memory summary, device ID {:<17d} ", "", lead, product,
                     device);
}

/// The lines of PyTorch's table, without the '|' borders, after the given title line.
inline std::vector<std::string> summary_table_lines(const device_stats& stats, std::string title,
                                                    bool abbreviated) {
  using cell_format = std::string (*)(std::int64_t, std::int64_t);
  struct metric {
    stat_array device_stats::*member;
    const char* name;
    cell_format format;
  };
  static constexpr metric metrics[] = {
      {&device_stats::allocated_bytes, "Allocated memory", &pytorch_table_size},
      {&device_stats::active_bytes, "Active memory", &pytorch_table_size},
      {&device_stats::requested_bytes, "Requested memory", &pytorch_table_size},
      {&device_stats::reserved_bytes, "GPU reserved memory", &pytorch_table_size},
      {&device_stats::inactive_split_bytes, "Non-releasable memory", &pytorch_table_size},
      {&device_stats::allocation, "Allocations", &pytorch_table_count},
      {&device_stats::active, "Active allocs", &pytorch_table_count},
      {&device_stats::segment, "GPU reserved segments", &pytorch_table_count},
      {&device_stats::inactive_split, "Non-releasable allocs", &pytorch_table_count},
  };
  const std::string rule_eq(summary_width, '='), rule_dash(summary_width, '-');
  const auto row = [](std::string_view name, const stat& s, const stat& pref, cell_format f) {
    return fmt::format(" {:<21} | {} | {} | {} | {} ", name, f(s.current, pref.current),
                       f(s.peak, pref.peak), f(s.allocated, pref.allocated),
                       f(s.freed, pref.freed));
  };

  std::vector<std::string> lines;
  lines.push_back(rule_eq);
  lines.push_back(std::move(title));
  lines.push_back(rule_dash);
  lines.push_back(fmt::format("  {:9} CUDA OOMs: {:<12d} | {:6} cudaMalloc retries: {:<8d}  ", "",
                              stats.num_ooms, "", stats.num_alloc_retries));
  lines.push_back(rule_eq);
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  constexpr auto all = static_cast<std::size_t>(stat_type::all);
  constexpr auto large = static_cast<std::size_t>(stat_type::large_pool);
  constexpr auto small = static_cast<std::size_t>(stat_type::small_pool);
  for (const auto& m : metrics) {
    const stat_array& a = stats.*m.member;
    lines.push_back(rule_dash);
    lines.push_back(row(m.name, a[all], a[all], m.format));
    if (!abbreviated) {
      // Pool rows use the "all" row's values to pick the unit, so a column reads in one unit.
      lines.push_back(row("      from large pool", a[large], a[all], m.format));
      lines.push_back(row("      from small pool", a[small], a[all], m.format));
    }
  }
  // The oversize rows pick each cell's unit from the cell itself.
  const std::pair<const char*, const stat*> oversize[] = {
      {"Oversize allocations", &stats.oversize_allocations},
      {"Oversize GPU segments", &stats.oversize_segments}};
  for (const auto& [name, s] : oversize) {
    lines.push_back(rule_dash);
    lines.push_back(row(name, *s, *s, &pytorch_table_count));
  }
  lines.push_back(rule_eq);
  return lines;
}

inline void append_boxed(std::string& out, const std::vector<std::string>& lines) {
  for (const auto& line : lines) {
    out += '|';
    out += line;
    out += "|\n";
  }
}

/// "1.50 GiB (37.5% of reserved)", or just the size when there is nothing to relate it to.
inline std::string size_and_share(std::size_t bytes, std::size_t of_bytes, std::string_view of) {
  std::string s = format_size(bytes);
  if (of_bytes > 0) {
    fmt::format_to(std::back_inserter(s), " ({:.1f}% of {})",
                   100.0 * static_cast<double>(bytes) / static_cast<double>(of_bytes), of);
  }
  return s;
}

/// The gpumem section: a title line, a rule, then "label | value" rows (values wrapped so that
/// every line stays 75 characters), and a closing rule. It follows the table's closing rule.
inline std::vector<std::string> gpumem_section_lines(const device_stats& stats,
                                                     const summary_info& info) {
  const auto reserved_now = stats.reserved_bytes[static_cast<std::size_t>(stat_type::all)].current;
  const std::size_t reserved = reserved_now > 0 ? static_cast<std::size_t>(reserved_now) : 0;

  std::vector<std::string> lines;
  lines.push_back(fmt::format("{:^{}}", "gpumem allocator details", summary_width));
  lines.push_back(std::string(summary_width, '-'));
  const auto add = [&lines](std::string_view label, std::string_view value) {
    bool first = true;
    for (const auto& piece : wrap_text(value, section_value_width)) {
      lines.push_back(fmt::format(" {:<{}} | {:<{}} ", first ? label : std::string_view(),
                                  section_label_width, piece, section_value_width));
      first = false;
    }
  };
  add("Largest free block", format_size(info.largest_free_block));
  add("Free cached memory", size_and_share(info.free_cached_bytes, reserved, "reserved"));
  add("Fragmentation now", size_and_share(info.fragmentation_bytes, reserved, "reserved"));
  add("Fragmentation at peak",
      size_and_share(info.fragmentation_at_peak_bytes, info.peak_reserved_bytes,
                     "peak reserved " + format_size(info.peak_reserved_bytes)));
  add("Device calls", fmt::format("alloc {}, free {}, sync {}", info.device_alloc_calls,
                                  info.device_free_calls, info.device_sync_calls));
  add("Allocator policy", info.policy.empty() ? std::string_view("(not set)") : info.policy);
  add("Allocator config", info.config.empty() ? std::string_view("(defaults)") : info.config);
  lines.push_back(std::string(summary_width, '='));
  return lines;
}

}  // namespace detail

/// Exactly the text of torch.cuda.memory_summary(device, abbreviated) for these statistics,
/// PyTorch's title included, ending with a newline. abbreviated drops the per-pool rows.
/// Thread-safe as long as nobody writes `stats` meanwhile (pass a copy taken under the
/// allocator's lock); throws std::bad_alloc only.
inline std::string pytorch_memory_summary(const device_stats& stats, int device = 0,
                                          bool abbreviated = false) {
  std::string out;
  detail::append_boxed(out, detail::summary_table_lines(
                                stats, detail::summary_title("PyTorch", device), abbreviated));
  return out;
}

/// PyTorch's memory_summary table with a gpumem title (see the top of this file), followed by
/// gpumem's section: largest free block, free cached memory, fragmentation now and at peak
/// reserved (as sizes and shares of reserved), device calls, policy and config. Every line is
/// 77 characters including the borders (the table's longer only where PyTorch's would be) and
/// ends with a newline. abbreviated drops the per-pool rows of the table.
/// Thread-safe as long as nobody writes `stats`/`info` meanwhile; throws std::bad_alloc only.
inline std::string memory_summary(const device_stats& stats, const summary_info& info,
                                  bool abbreviated = false) {
  std::string out;
  detail::append_boxed(out, detail::summary_table_lines(
                                stats, detail::summary_title("gpumem", info.device), abbreviated));
  detail::append_boxed(out, detail::gpumem_section_lines(stats, info));
  return out;
}

}  // namespace gpumem
