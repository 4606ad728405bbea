// gpumem — write_memory_plot(): memory over time for one or more allocator configurations replaying
// the same trace, and each configuration's segment map at its peak, as one standalone SVG document.
//
// The replay tool (gpumem-replay --plot out.svg) calls it. The SVG is written as text, so nothing
// beyond the standard library and fmt is needed and the file opens in any browser.
//
// Layout, top to bottom:
//  * the title;
//  * the time panel: x = trace event index, y = bytes (ticks in B / KiB / MiB / GiB / TiB at
//    1, 2, 2.5 or 5 times a power of ten). The bytes the program requested (the same for every
//    configuration) are one dashed grey line; each configuration has one colour, its reserved
//    bytes a thick line and its allocated bytes a thin one, and a red cross marked "OOM" on its
//    reserved line where it ran out of memory. Optional horizontal lines show the device's memory
//    and the recording's peak reserved bytes; dotted vertical lines show when each segment map
//    was taken. A legend with each configuration's peaks follows;
//  * per segment map: its segments side by side, wrapping into rows, at one bytes-per-pixel scale
//    shared by all maps (so configurations compare by area), their blocks coloured by state
//    (allocated, pending free, cached, unmapped); small-pool segments have a dashed outline.
//
// Blocks, segments and lines carry <title> tooltips with sizes in human units. Elements carry a
// class (plot-area, requested, allocated, reserved, oom, segment, block, ...) and curves their
// index (data-curve) so that scripts and tests can find them.
//
// Size: write_memory_plot() draws at most options.max_points_per_line points per line (min-max
// decimation, so peaks and troughs survive): the lines of one configuration take at most about
// 80 KB however many samples it has. It still reads every sample, so a replay of millions of events
// should sample or decimate() its curves as it goes rather than keep one sample per event.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/detail/format.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/detail/utf8.hpp"

namespace gpumem {

/// One replay of one configuration, sampled at trace events. `requested`, `allocated` and
/// `reserved` each hold one value per `event_index` entry, or are empty when not recorded (an
/// empty series is not drawn).
struct memory_curve {
  std::string label;                       ///< e.g. "classic" or "policy:stitch"
  std::vector<std::uint64_t> event_index;  ///< x: trace event index of each sample, non-decreasing
  std::vector<std::uint64_t> requested;    ///< bytes live as requested by the program
  std::vector<std::uint64_t> allocated;    ///< bytes in blocks handed out (after rounding)
  std::vector<std::uint64_t> reserved;     ///< bytes held from the device
  std::optional<std::uint64_t> oom_event_index;  ///< where it ran out of memory, if it did
};

/// One block of a segment, `offset` bytes from the segment's start.
struct segment_map_block {
  enum class state_kind { allocated, pending_free, cached, unmapped };
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  state_kind state = state_kind::allocated;
};

/// One segment (a cudaMalloc'd range, or a VMM range) and its blocks in address order. Blocks need
/// not cover the segment: bytes no block covers are drawn blank.
struct segment_map_segment {
  std::uint64_t size = 0;
  bool is_small = false;  ///< in the small pool (requests of at most 1 MiB)
  std::vector<segment_map_block> blocks;
};

/// The segments of one configuration at one moment (usually its peak reserved).
struct segment_map {
  std::string label;  ///< the configuration, as in memory_curve::label (then drawn in its colour)
  std::uint64_t at_event_index = 0;
  std::vector<segment_map_segment> segments;
};

struct memory_plot_options {
  std::string title;
  std::uint64_t device_memory = 0;                      ///< drawn as "device memory" unless 0
  std::optional<std::uint64_t> recorded_reserved_peak;  ///< the recording allocator's peak reserved
  std::size_t width = 1200;                             ///< pixels; at least 400
  std::size_t max_points_per_line = 2000;               ///< decimation limit per line; at least 10
};

/// The smallest max_points that decimate() accepts: the first and last samples, the two around the
/// OOM, and one bucket's minimum and maximum of each of the three series.
inline constexpr std::size_t min_decimated_points = 10;

namespace detail {

template <typename... T>
void svg_put(std::string& out, fmt::format_string<T...> format, T&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<T>(args)...);
}

/// The length of the well-formed UTF-8 sequence at s[i] that XML 1.0 allows, or 0 if there is none
/// (not UTF-8, or U+FFFE / U+FFFF).
inline std::size_t xml_utf8_length(std::string_view s, std::size_t i) {
  const std::size_t length = utf8_sequence_length(s, i);
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (length == 3 && byte(0) == 0xEF && byte(1) == 0xBF && byte(2) >= 0xBE) return 0;
  return length;
}

/// Appends `text` escaped for XML text and attribute values. Labels come from users (config
/// strings, file names), so whatever XML 1.0 cannot hold — control characters, bytes that are not
/// UTF-8 — becomes U+FFFD and the document stays well-formed.
inline void append_xml_escaped(std::string& out, std::string_view text) {
  constexpr std::string_view replacement = "\xEF\xBF\xBD";
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = xml_utf8_length(text, i);
      if (length == 0) {
        out += replacement;
        ++i;
      } else {
        out += text.substr(i, length);
        i += length;
      }
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += replacement;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
}

inline std::string xml_escaped(std::string_view text) {
  std::string out;
  append_xml_escaped(out, text);
  return out;
}

/// Throws std::invalid_argument unless every non-empty series has one value per sample and the
/// event indices never decrease.
inline void validate_memory_curve(const memory_curve& c) {
  const std::size_t n = c.event_index.size();
  const std::pair<const char*, const std::vector<std::uint64_t>*> series[] = {
      {"requested", &c.requested}, {"allocated", &c.allocated}, {"reserved", &c.reserved}};
  for (const auto& [name, values] : series) {
    if (!values->empty() && values->size() != n) {
      throw std::invalid_argument(
          fmt::format("memory curve \"{}\": {} has {} values for {} event indices (expected {} "
                      "or none)",
                      c.label, name, values->size(), n, n));
    }
  }
  for (std::size_t i = 1; i < n; ++i) {
    if (c.event_index[i] < c.event_index[i - 1]) {
      throw std::invalid_argument(
          fmt::format("memory curve \"{}\": event index decreases at sample {} ({} after {})",
                      c.label, i, c.event_index[i], c.event_index[i - 1]));
    }
  }
}

/// Throws std::invalid_argument unless every block lies inside its segment, after the previous one.
inline void validate_segment_map(const segment_map& m) {
  for (std::size_t s = 0; s < m.segments.size(); ++s) {
    const auto& seg = m.segments[s];
    std::uint64_t end = 0;  // of the previous block
    for (std::size_t b = 0; b < seg.blocks.size(); ++b) {
      const auto& block = seg.blocks[b];
      const char* why = nullptr;
      if (block.offset < end) {
        why = "overlaps the previous block or is out of address order";
      } else if (block.size > seg.size || block.offset > seg.size - block.size) {
        why = "ends beyond the segment";
      } else if (static_cast<unsigned>(block.state) >
                 static_cast<unsigned>(segment_map_block::state_kind::unmapped)) {
        why = "has an unknown state";
      }
      if (why != nullptr) {
        throw std::invalid_argument(fmt::format(
            "segment map \"{}\": block {} (offset {}, size {}) of segment {} (size {}) {}", m.label,
            b, block.offset, block.size, s, seg.size, why));
      }
      end = block.offset + block.size;
    }
  }
}

/// Indices of the samples to keep so that at most `max_points` remain (max_points must be at
/// least 4 + 2 * series.size()): the first and the last, the last sample at or before `keep_x` and
/// the one after it (so that a marker at keep_x still sits on the line), and, per bucket of equal
/// width in x, the samples holding each series' minimum and maximum. Sorted, without duplicates.
inline std::vector<std::size_t> decimation_indices(
    const std::vector<std::uint64_t>& x,
    const std::vector<const std::vector<std::uint64_t>*>& series, std::size_t max_points,
    std::optional<std::uint64_t> keep_x) {
  const std::size_t n = x.size();
  std::vector<std::size_t> keep;
  if (n <= max_points) {
    keep.resize(n);
    for (std::size_t i = 0; i < n; ++i) keep[i] = i;
    return keep;
  }
  const std::size_t per_bucket = 2 * std::max<std::size_t>(series.size(), 1);
  const std::size_t buckets = std::max<std::size_t>((max_points - 4) / per_bucket, 1);
  keep.reserve(4 + buckets * per_bucket);
  keep.push_back(0);
  keep.push_back(n - 1);
  if (keep_x) {
    const auto after =
        static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), *keep_x) - x.begin());
    if (after > 0) keep.push_back(after - 1);
    if (after < n) keep.push_back(after);
  }
  // Buckets split the x range, not the sample count, so that they line up with pixel columns.
  const double span = static_cast<double>(x.back() - x.front()) + 1.0;
  const auto bucket_of = [&](std::uint64_t v) {
    const double share = static_cast<double>(v - x.front()) / span;
    return std::min(static_cast<std::size_t>(share * static_cast<double>(buckets)), buckets - 1);
  };
  for (std::size_t begin = 0; begin < n;) {
    const std::size_t bucket = bucket_of(x[begin]);
    std::size_t end = begin + 1;
    while (end < n && bucket_of(x[end]) == bucket) ++end;
    for (const auto* values : series) {
      const auto first = values->begin() + static_cast<std::ptrdiff_t>(begin);
      const auto last = values->begin() + static_cast<std::ptrdiff_t>(end);
      const auto [lo, hi] = std::minmax_element(first, last);
      keep.push_back(static_cast<std::size_t>(lo - values->begin()));
      keep.push_back(static_cast<std::size_t>(hi - values->begin()));
    }
    begin = end;
  }
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

inline std::vector<const std::vector<std::uint64_t>*> present_series(const memory_curve& c) {
  std::vector<const std::vector<std::uint64_t>*> series;
  for (const auto* values : {&c.requested, &c.allocated, &c.reserved}) {
    if (!values->empty()) series.push_back(values);
  }
  return series;
}

inline std::uint64_t max_of(const std::vector<std::uint64_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

/// The value of the line through the samples at x (flat beyond either end), as it is drawn: at an
/// x that several samples share, the last of them.
inline double value_at(const std::vector<std::uint64_t>& xs, const std::vector<std::uint64_t>& ys,
                       std::uint64_t x) {
  if (ys.empty()) return 0.0;
  const auto after =
      static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  if (after == 0) return static_cast<double>(ys.front());
  const std::size_t i = after - 1;
  if (xs[i] == x || after == xs.size()) return static_cast<double>(ys[i]);
  const double t = static_cast<double>(x - xs[i]) / static_cast<double>(xs[after] - xs[i]);
  return static_cast<double>(ys[i]) +
         t * (static_cast<double>(ys[after]) - static_cast<double>(ys[i]));
}

/// A step of 1, 2, (2.5,) 5 or 10 times a power of ten that cuts `span` into at most `target`
/// intervals.
inline double nice_step(double span, double target, bool allow_two_and_a_half) {
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m == 2.5 && !allow_two_and_a_half) continue;
    if (raw <= m * magnitude * (1.0 + 1e-9)) return m * magnitude;
  }
  return 10.0 * magnitude;
}

/// "0", "512 MiB", "1.5 GiB": a tick value in the axis' unit.
inline std::string tick_label(double value, std::string_view unit) {
  if (value == 0.0) return "0";
  return fmt::format("{:g} {}", std::round(value * 1000.0) / 1000.0, unit);
}

/// The y axis: from 0 to a multiple of a nice step in the largest binary unit below the maximum.
struct byte_axis {
  double top = 0;   ///< bytes at the top of the plot area
  double step = 0;  ///< bytes between ticks
  double unit = 1;
  std::string_view unit_name;
};

inline byte_axis make_byte_axis(std::uint64_t max_bytes) {
  if (max_bytes == 0) max_bytes = gib;  // an empty plot still gets a readable axis
  static constexpr std::pair<std::uint64_t, std::string_view> units[] = {
      {pib, "PiB"}, {tib, "TiB"}, {gib, "GiB"}, {mib, "MiB"}, {kib, "KiB"}, {1, "B"}};
  byte_axis axis;
  for (const auto& [unit, name] : units) {
    if (max_bytes >= unit) {
      axis.unit = static_cast<double>(unit);
      axis.unit_name = name;
      break;
    }
  }
  const double v = static_cast<double>(max_bytes) / axis.unit;
  double step = nice_step(v, 6.0, true);
  if (axis.unit == 1.0) step = std::max(step, 1.0);  // no fractional bytes
  axis.top = std::ceil(v / step - 1e-9) * step * axis.unit;
  axis.step = step * axis.unit;
  return axis;
}

/// An event index for a tick label: 950, 25k, 1.5M.
inline std::string count_label(double v) {
  if (v >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:g}", v);
}

// One colour per configuration: Okabe and Ito's colour-blind-safe palette, without its yellow
// (unreadable on white) and vermillion (too close to the OOM marker's red).
inline constexpr std::string_view curve_colours[] = {"#0072B2", "#E69F00", "#009E73",
                                                     "#CC79A7", "#56B4E9", "#000000"};
inline constexpr std::string_view requested_colour = "#7F7F7F";
inline constexpr std::string_view oom_colour = "#E41A1C";
inline constexpr std::string_view unmapped_pattern_id = "gpumem-unmapped";

inline std::string_view curve_colour(std::size_t i) {
  return curve_colours[i % std::size(curve_colours)];
}

// A segment map's colour: that of the first curve with the same label, so the two read as one
// configuration; grey when no curve has it.
inline std::string_view map_colour(const std::vector<memory_curve>& curves, const segment_map& m) {
  for (std::size_t i = 0; i < curves.size(); ++i) {
    if (curves[i].label == m.label) return curve_colour(i);
  }
  return "#555555";
}

// How a block state is drawn: its name (legend, tooltips), its CSS class and its fill colour
// (nullptr: the unmapped hatching pattern).
struct state_style {
  const char* name;
  const char* css_class;
  const char* colour;
};

inline state_style style_of(segment_map_block::state_kind s) {
  switch (s) {
    case segment_map_block::state_kind::allocated:
      return {"allocated", "allocated", "#0072B2"};
    case segment_map_block::state_kind::pending_free:
      return {"pending free", "pending-free", "#E69F00"};
    case segment_map_block::state_kind::cached:
      return {"cached", "cached", "#A8DCC9"};
    case segment_map_block::state_kind::unmapped:
      return {"unmapped", "unmapped", nullptr};
  }
  return {"unknown", "unknown", nullptr};
}

inline const char* state_name(segment_map_block::state_kind s) {
  return style_of(s).name;
}

inline const char* state_class(segment_map_block::state_kind s) {
  return style_of(s).css_class;
}

inline std::string state_fill(segment_map_block::state_kind s) {
  const char* colour = style_of(s).colour;
  if (colour != nullptr) return colour;
  return fmt::format("url(#{})", unmapped_pattern_id);
}

// Geometry, in pixels.
inline constexpr double plot_margin_left = 84;
inline constexpr double plot_margin_right = 24;
inline constexpr double plot_height = 340;
inline constexpr double legend_row_height = 18;
inline constexpr double legend_key_width = 26;
inline constexpr double char_width = 6.7;  // average advance of 12 px sans-serif, for layout only
inline constexpr double segment_row_height = 24;
inline constexpr double segment_row_gap = 8;
inline constexpr double segment_rows_target = 4;  // rows the largest map fills at the common scale

/// Lays out legend entries left to right, wrapping at `right`; `draw_key(x, baseline)` draws an
/// entry's key. Returns the baseline of the last row.
class legend_flow {
 public:
  legend_flow(std::string& out, double left, double right, double baseline)
      : out_(out), left_(left), right_(right), x_(left), baseline_(baseline) {}

  template <typename DrawKey>
  void add(std::string_view text, DrawKey draw_key) {
    const double width = legend_key_width + 6 + static_cast<double>(text.size()) * char_width;
    if (x_ > left_ && x_ + width > right_) {
      x_ = left_;
      baseline_ += legend_row_height;
    }
    draw_key(x_, baseline_);
    svg_put(out_, "<text x=\"{:.1f}\" y=\"{:.1f}\">", x_ + legend_key_width + 6, baseline_);
    append_xml_escaped(out_, text);
    out_ += "</text>\n";
    x_ += width + 18;
  }

  double baseline() const { return baseline_; }

 private:
  std::string& out_;
  double left_, right_, x_, baseline_;
};

inline void line_key(std::string& out, double x, double baseline, std::string_view colour,
                     double stroke_width, std::string_view dash) {
  svg_put(out,
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
          "stroke-width=\"{}\"{}/>\n",
          x, baseline - 4, x + legend_key_width, baseline - 4, colour, stroke_width,
          dash.empty() ? std::string() : fmt::format(" stroke-dasharray=\"{}\"", dash));
}

inline void box_key(std::string& out, double x, double baseline, std::string_view fill,
                    std::string_view dash = {}) {
  svg_put(out,
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"10\" fill=\"{}\" "
          "stroke=\"#333333\" stroke-width=\"0.8\"{}/>\n",
          x + 4, baseline - 9, legend_key_width - 8, fill,
          dash.empty() ? std::string() : fmt::format(" stroke-dasharray=\"{}\"", dash));
}

/// Maps data to the plot area.
struct time_frame {
  double left, top, width, height;
  double x0, x1;  // event index range
  double y_top;   // bytes at the top
  double px(std::uint64_t x) const {
    return left + (static_cast<double>(x) - x0) / (x1 - x0) * width;
  }
  double py(double bytes) const { return top + height - bytes / y_top * height; }
  /// Baseline of a horizontal line's label: above the line, or below it when that would leave
  /// the plot area.
  double label_y(double line_y) const { return line_y - top < 16 ? line_y + 14 : line_y - 4; }
};

inline void polyline(std::string& out, const time_frame& f, const std::vector<std::uint64_t>& xs,
                     const std::vector<std::uint64_t>& ys, std::size_t max_points,
                     std::optional<std::uint64_t> keep_x, std::string_view attributes,
                     std::string_view tooltip) {
  const auto keep = decimation_indices(xs, {&ys}, max_points, keep_x);
  svg_put(out, "<polyline {} fill=\"none\" stroke-linejoin=\"round\" points=\"", attributes);
  for (std::size_t k = 0; k < keep.size(); ++k) {
    svg_put(out, "{}{:.1f},{:.1f}", k == 0 ? "" : " ", f.px(xs[keep[k]]),
            f.py(static_cast<double>(ys[keep[k]])));
  }
  out += "\"><title>";
  append_xml_escaped(out, tooltip);
  out += "</title></polyline>\n";
}

/// Draws the time panel with its top edge at `y` and returns the y below its legend.
inline double draw_time_panel(std::string& out, const std::vector<memory_curve>& curves,
                              const std::vector<segment_map>& maps,
                              const memory_plot_options& options, double y) {
  const double width = static_cast<double>(options.width);

  // The ranges cover every sample, OOM and snapshot, and the reference lines.
  std::optional<std::uint64_t> x_lo, x_hi;
  const auto cover = [&](std::uint64_t x) {
    x_lo = x_lo ? std::min(*x_lo, x) : x;
    x_hi = x_hi ? std::max(*x_hi, x) : x;
  };
  std::uint64_t y_max = std::max(options.device_memory, options.recorded_reserved_peak.value_or(0));
  for (const auto& c : curves) {
    if (!c.event_index.empty()) {
      cover(c.event_index.front());
      cover(c.event_index.back());
    }
    if (c.oom_event_index) cover(*c.oom_event_index);
    y_max = std::max({y_max, max_of(c.requested), max_of(c.allocated), max_of(c.reserved)});
  }
  for (const auto& m : maps) cover(m.at_event_index);
  time_frame f{};
  f.left = plot_margin_left;
  f.top = y + 10;
  f.width = width - plot_margin_left - plot_margin_right;
  f.height = plot_height;
  f.x0 = static_cast<double>(x_lo.value_or(0));
  f.x1 = static_cast<double>(x_hi.value_or(1));
  if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
  const byte_axis axis = make_byte_axis(y_max);
  f.y_top = axis.top;
  const double bottom = f.top + f.height;

  out += "<g class=\"memory-over-time\">\n";
  svg_put(out,
          "<rect class=\"plot-area\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
          "fill=\"#FCFCFC\" stroke=\"#555555\" stroke-width=\"1\"/>\n",
          f.left, f.top, f.width, f.height);

  // Grid and ticks.
  out += "<g class=\"y-ticks\" font-size=\"11\" fill=\"#333333\" text-anchor=\"end\">\n";
  const auto y_ticks = static_cast<int>(std::llround(axis.top / axis.step));
  for (int i = 0; i <= y_ticks; ++i) {
    const double bytes = axis.step * i;
    const double py = f.py(bytes);
    if (i > 0 && i < y_ticks) {
      svg_put(
          out,
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#E3E3E3\"/>\n",
          f.left, py, f.left + f.width, py);
    }
    svg_put(out, "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", f.left - 6, py + 4,
            tick_label(bytes / axis.unit, axis.unit_name));
  }
  out += "</g>\n<g class=\"x-ticks\" font-size=\"11\" fill=\"#333333\" text-anchor=\"middle\">\n";
  const double x_step = std::max(1.0, nice_step(f.x1 - f.x0, std::max(2.0, f.width / 110), false));
  for (double x = std::ceil(f.x0 / x_step) * x_step; x <= f.x1 + 1e-9; x += x_step) {
    const double px = f.left + (x - f.x0) / (f.x1 - f.x0) * f.width;
    svg_put(out,
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#555555\"/>\n"
            "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
            px, bottom, px, bottom + 4, px, bottom + 16, count_label(x));
  }
  out += "</g>\n";
  svg_put(out,
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333333\">trace event "
          "index</text>\n",
          f.left + f.width / 2, bottom + 34);
  svg_put(out,
          "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" text-anchor=\"middle\" "
          "fill=\"#333333\">memory</text>\n",
          16.0, f.top + f.height / 2);

  // Reference lines, under the data.
  if (options.device_memory > 0) {
    const double py = f.py(static_cast<double>(options.device_memory));
    svg_put(out,
            "<g class=\"device-memory\"><title>device memory {}</title>"
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333333\" "
            "stroke-width=\"1.2\" stroke-dasharray=\"10 3 2 3\"/>"
            "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#333333\">device memory {}</text></g>\n",
            format_size(options.device_memory), f.left, py, f.left + f.width, py, f.left + 6,
            f.label_y(py), format_size(options.device_memory));
  }
  if (options.recorded_reserved_peak) {
    const double py = f.py(static_cast<double>(*options.recorded_reserved_peak));
    svg_put(out,
            "<g class=\"recorded-peak\"><title>recorded peak reserved {}</title>"
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#8C510A\" "
            "stroke-width=\"1.2\" stroke-dasharray=\"2 3\"/>"
            "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#8C510A\" text-anchor=\"end\">recorded peak "
            "reserved {}</text></g>\n",
            format_size(*options.recorded_reserved_peak), f.left, py, f.left + f.width, py,
            f.left + f.width - 6, f.label_y(py), format_size(*options.recorded_reserved_peak));
  }
  for (const auto& m : maps) {
    const std::string_view colour = map_colour(curves, m);
    const double px = f.px(m.at_event_index);
    svg_put(out,
            "<line class=\"snapshot\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
            "stroke=\"{}\" stroke-width=\"1\" stroke-dasharray=\"1 3\"><title>",
            px, f.top, px, bottom, colour);
    append_xml_escaped(out,
                       fmt::format("segment map of {} at event {}", m.label, m.at_event_index));
    out += "</title></line>\n";
  }

  // Thick reserved lines first, then thin allocated ones, then requested on top: each stays
  // visible where they coincide.
  const std::size_t max_points = options.max_points_per_line;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& c = curves[i];
    if (c.reserved.empty()) continue;
    polyline(out, f, c.event_index, c.reserved, max_points, c.oom_event_index,
             fmt::format("class=\"reserved\" data-curve=\"{}\" stroke=\"{}\" stroke-width=\"2.6\" "
                         "stroke-opacity=\"0.85\"",
                         i, curve_colour(i)),
             fmt::format("{}: reserved, peak {}", c.label, format_size(max_of(c.reserved))));
  }
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& c = curves[i];
    if (c.allocated.empty()) continue;
    polyline(out, f, c.event_index, c.allocated, max_points, std::nullopt,
             fmt::format("class=\"allocated\" data-curve=\"{}\" stroke=\"{}\" stroke-width=\"1.1\"",
                         i, curve_colour(i)),
             fmt::format("{}: allocated, peak {}", c.label, format_size(max_of(c.allocated))));
  }
  // Requested bytes are the program's, the same in every replay; a replay that ran out of memory
  // stops early, so take them from the curve that reaches furthest (the first such).
  const memory_curve* requested_from = nullptr;
  for (const auto& c : curves) {
    if (!c.requested.empty() &&
        (requested_from == nullptr || c.event_index.back() > requested_from->event_index.back())) {
      requested_from = &c;
    }
  }
  if (requested_from != nullptr) {
    polyline(out, f, requested_from->event_index, requested_from->requested, max_points,
             std::nullopt,
             fmt::format("class=\"requested\" stroke=\"{}\" stroke-width=\"1.4\" "
                         "stroke-dasharray=\"6 4\"",
                         requested_colour),
             fmt::format("requested, peak {}", format_size(max_of(requested_from->requested))));
  }

  // OOM markers on the reserved line.
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& c = curves[i];
    if (!c.oom_event_index) continue;
    const double px = f.px(*c.oom_event_index);
    const double py = f.py(value_at(c.event_index, c.reserved, *c.oom_event_index));
    const bool label_left = px > f.left + f.width - 40;
    svg_put(out, "<g class=\"oom\" data-curve=\"{}\" stroke=\"{}\" stroke-width=\"2.5\"><title>", i,
            oom_colour);
    append_xml_escaped(out,
                       fmt::format("{}: out of memory at event {}", c.label, *c.oom_event_index));
    svg_put(out,
            "</title><line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
            "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" stroke=\"none\" fill=\"{}\" "
            "font-weight=\"bold\">OOM</text></g>\n",
            px - 6, py - 6, px + 6, py + 6, px - 6, py + 6, px + 6, py - 6,
            label_left ? px - 9 : px + 9, py - 8, label_left ? "end" : "start", oom_colour);
  }

  // Legend.
  legend_flow legend(out, f.left, f.left + f.width, bottom + 58);
  out += "<g class=\"legend\" fill=\"#222222\">\n";
  if (requested_from != nullptr) {
    legend.add(fmt::format("requested (peak {})", format_size(max_of(requested_from->requested))),
               [&](double x, double b) { line_key(out, x, b, requested_colour, 1.4, "6 4"); });
  }
  legend.add("reserved", [&](double x, double b) { line_key(out, x, b, "#555555", 2.6, {}); });
  legend.add("allocated", [&](double x, double b) { line_key(out, x, b, "#555555", 1.1, {}); });
  if (options.device_memory > 0) {
    legend.add("device memory",
               [&](double x, double b) { line_key(out, x, b, "#333333", 1.2, "10 3 2 3"); });
  }
  if (options.recorded_reserved_peak) {
    legend.add("recorded peak reserved",
               [&](double x, double b) { line_key(out, x, b, "#8C510A", 1.2, "2 3"); });
  }
  if (!maps.empty()) {
    legend.add("segment map taken", [&](double x, double b) {
      svg_put(out,
              "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#555555\" "
              "stroke-dasharray=\"1 3\"/>\n",
              x + legend_key_width / 2, b - 11, x + legend_key_width / 2, b + 2);
    });
  }
  // Each configuration on a row of its own, with its peaks.
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const auto& c = curves[i];
    std::string text = c.label;
    const char* sep = ": ";
    if (!c.reserved.empty()) {
      text += fmt::format("{}peak reserved {}", sep, format_size(max_of(c.reserved)));
      sep = ", ";
    }
    if (!c.allocated.empty()) {
      text += fmt::format("{}peak allocated {}", sep, format_size(max_of(c.allocated)));
      sep = ", ";
    }
    if (c.oom_event_index) {
      text += fmt::format("{}out of memory at event {}", sep, *c.oom_event_index);
    }
    legend_flow row(out, f.left, f.left + f.width,
                    legend.baseline() + legend_row_height * static_cast<double>(1 + i));
    row.add(text, [&](double x, double b) { line_key(out, x, b, curve_colour(i), 4, {}); });
  }
  out += "</g>\n</g>\n";
  return legend.baseline() + legend_row_height * static_cast<double>(curves.size()) + 14;
}

struct state_totals {
  std::uint64_t bytes[4] = {0, 0, 0, 0};  // by state_kind
  std::uint64_t& operator[](segment_map_block::state_kind s) {
    return bytes[static_cast<std::size_t>(s)];
  }
};

inline std::uint64_t map_total(const segment_map& m) {
  std::uint64_t total = 0;
  for (const auto& seg : m.segments) total += seg.size;
  return total;
}

/// Draws the segment maps with their top edge at `y` and returns the y below them.
inline double draw_segment_maps(std::string& out, const std::vector<memory_curve>& curves,
                                const std::vector<segment_map>& maps,
                                const memory_plot_options& options, double y) {
  const double left = 20;
  const double right = static_cast<double>(options.width) - 20;
  const double row_width = right - left;

  // One scale for every map: the largest segment fits a row, the largest map about
  // segment_rows_target rows.
  std::uint64_t largest_segment = 1, largest_total = 1;
  for (const auto& m : maps) {
    for (const auto& seg : m.segments) largest_segment = std::max(largest_segment, seg.size);
    largest_total = std::max(largest_total, map_total(m));
  }
  const double px_per_byte =
      std::min(row_width / static_cast<double>(largest_segment),
               segment_rows_target * row_width / static_cast<double>(largest_total));

  out += "<g class=\"segment-maps\">\n";
  y += 22;
  constexpr std::string_view heading = "Segment maps";
  svg_put(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
          left, y, heading);
  // Bold 14 px text advances about 9 px per character.
  svg_put(out,
          "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#555555\">all drawn to one scale: {} per "
          "100 pixels</text>\n",
          left + 9 * static_cast<double>(heading.size()) + 12, y,
          format_size(static_cast<std::uint64_t>(100.0 / px_per_byte)));
  y += 22;
  {
    out += "<g class=\"legend\" fill=\"#222222\">\n";
    legend_flow legend(out, left, right, y);
    for (const auto s :
         {segment_map_block::state_kind::allocated, segment_map_block::state_kind::pending_free,
          segment_map_block::state_kind::cached, segment_map_block::state_kind::unmapped}) {
      legend.add(state_name(s), [&](double x, double b) { box_key(out, x, b, state_fill(s)); });
    }
    legend.add("small-pool segment",
               [&](double x, double b) { box_key(out, x, b, "none", "3 2"); });
    out += "</g>\n";
    y = legend.baseline();
  }

  for (const auto& m : maps) {
    const std::string_view colour = map_colour(curves, m);
    state_totals totals;
    std::size_t small = 0;
    for (const auto& seg : m.segments) {
      small += seg.is_small ? 1 : 0;
      for (const auto& b : seg.blocks) totals[b.state] += b.size;
    }
    y += 30;
    out += "<g class=\"segment-map\">\n";
    svg_put(out, "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>", left,
            y - 11, colour);
    svg_put(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">", left + 18, y);
    append_xml_escaped(out, fmt::format("{} at event {}", m.label, m.at_event_index));
    out += "</text>\n";
    y += 17;
    std::string summary =
        fmt::format("{} segment{} ({} small pool), {} in all: ", m.segments.size(),
                    m.segments.size() == 1 ? "" : "s", small, format_size(map_total(m)));
    for (const auto s :
         {segment_map_block::state_kind::allocated, segment_map_block::state_kind::pending_free,
          segment_map_block::state_kind::cached, segment_map_block::state_kind::unmapped}) {
      if (s == segment_map_block::state_kind::unmapped && totals[s] == 0) continue;
      summary += fmt::format("{}{} {}", s == segment_map_block::state_kind::allocated ? "" : ", ",
                             state_name(s), format_size(totals[s]));
    }
    svg_put(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#333333\">", left + 18, y);
    append_xml_escaped(out, summary);
    out += "</text>\n";
    y += 8;

    double x = left;
    double row_top = y;
    for (const auto& seg : m.segments) {
      const double w = std::max(1.0, static_cast<double>(seg.size) * px_per_byte);
      const double gap = w >= 6 ? 3 : 1;
      if (x > left && x + w > right + 1e-9) {
        x = left;
        row_top += segment_row_height + segment_row_gap;
      }
      state_totals seg_totals;
      for (const auto& b : seg.blocks) seg_totals[b.state] += b.size;
      std::string tooltip = fmt::format("segment {} ({} pool), {} block{}", format_size(seg.size),
                                        seg.is_small ? "small" : "large", seg.blocks.size(),
                                        seg.blocks.size() == 1 ? "" : "s");
      for (std::size_t s = 0; s < 4; ++s) {
        if (seg_totals.bytes[s] == 0) continue;
        tooltip += fmt::format("; {} {}", state_name(static_cast<segment_map_block::state_kind>(s)),
                               format_size(seg_totals.bytes[s]));
      }
      out += "<g class=\"segment\"><title>";
      append_xml_escaped(out, tooltip);
      out += "</title>\n";
      // Neighbouring blocks in the same state are drawn as one rectangle: thousands of small
      // tensors would otherwise make the file large and the picture no clearer.
      const double byte_px = seg.size == 0 ? 0.0 : w / static_cast<double>(seg.size);
      for (std::size_t b = 0; b < seg.blocks.size();) {
        const auto& first = seg.blocks[b];
        std::uint64_t end = first.offset + first.size;
        std::size_t count = 1;
        while (b + count < seg.blocks.size() && seg.blocks[b + count].state == first.state &&
               seg.blocks[b + count].offset == end) {
          end += seg.blocks[b + count].size;
          ++count;
        }
        const double bx = x + static_cast<double>(first.offset) * byte_px;
        const double bw = static_cast<double>(end - first.offset) * byte_px;
        svg_put(out,
                "<rect class=\"block {}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
                "height=\"{:.1f}\" fill=\"{}\"><title>{} {}{}</title></rect>\n",
                state_class(first.state), bx, row_top, bw, segment_row_height,
                state_fill(first.state), state_name(first.state), format_size(end - first.offset),
                count == 1 ? std::string() : fmt::format(" in {} blocks", count));
        b += count;
      }
      svg_put(out,
              "<rect class=\"segment-outline\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
              "height=\"{:.1f}\" fill=\"none\" stroke=\"#333333\" stroke-width=\"{}\"{}/>\n</g>\n",
              x, row_top, w, segment_row_height, w >= 4 ? 0.8 : 0.3,
              seg.is_small ? " stroke-dasharray=\"3 2\"" : "");
      x += w + gap;
    }
    if (m.segments.empty()) {
      svg_put(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#555555\">(no segments)</text>\n", left,
              row_top + 16);
    }
    out += "</g>\n";
    y = row_top + segment_row_height;
  }
  out += "</g>\n";
  return y + 16;
}

}  // namespace detail

/// Reduces `c` to at most `max_points` samples: the first and the last, the two around
/// c.oom_event_index, and for each of (max_points - 4) / (2 x the number of non-empty series)
/// buckets of equal width in event index the samples holding the minimum and the maximum of
/// requested, allocated and reserved. Every
/// sample kept is one of c's, with all its values, so the global maximum and minimum of each
/// series survive. Returns a copy of `c` when it has at most `max_points` samples.
/// Throws std::invalid_argument when `c` is inconsistent (see write_memory_plot) or when
/// max_points < min_decimated_points; std::bad_alloc. Thread-safe.
inline memory_curve decimate(const memory_curve& c, std::size_t max_points) {
  detail::validate_memory_curve(c);
  if (max_points < min_decimated_points) {
    throw std::invalid_argument(fmt::format("decimate: max_points is {}, must be at least {}",
                                            max_points, min_decimated_points));
  }
  const auto keep = detail::decimation_indices(c.event_index, detail::present_series(c), max_points,
                                               c.oom_event_index);
  const auto pick = [&keep](const std::vector<std::uint64_t>& values) {
    std::vector<std::uint64_t> picked;
    if (values.empty()) return picked;
    picked.reserve(keep.size());
    for (const std::size_t i : keep) picked.push_back(values[i]);
    return picked;
  };
  memory_curve out;
  out.label = c.label;
  out.event_index = pick(c.event_index);
  out.requested = pick(c.requested);
  out.allocated = pick(c.allocated);
  out.reserved = pick(c.reserved);
  out.oom_event_index = c.oom_event_index;
  return out;
}

/// The whole SVG document (see the top of this file): the time panel for `curves`, then one
/// segment map per entry of `maps`, in order. Curves get colours in order; a map whose label equals
/// a curve's is drawn in that curve's colour. Text is escaped for XML; anything that is not valid
/// UTF-8 becomes U+FFFD. Starts with "<svg" and ends with "</svg>\n".
/// Throws std::invalid_argument for inconsistent input — a non-empty series whose length differs
/// from event_index's, a decreasing event index, a block that overlaps the previous one or ends
/// beyond its segment, an unknown block state, options.width < 400, options.max_points_per_line
/// < min_decimated_points — and std::bad_alloc. Thread-safe.
inline std::string memory_plot_svg(const std::vector<memory_curve>& curves,
                                   const std::vector<segment_map>& maps,
                                   const memory_plot_options& options) {
  for (const auto& c : curves) detail::validate_memory_curve(c);
  for (const auto& m : maps) detail::validate_segment_map(m);
  if (options.width < 400) {
    throw std::invalid_argument(
        fmt::format("memory plot: width {} is too narrow (at least 400 pixels)", options.width));
  }
  if (options.max_points_per_line < min_decimated_points) {
    throw std::invalid_argument(fmt::format("memory plot: max_points_per_line {} (at least {})",
                                            options.max_points_per_line, min_decimated_points));
  }

  // The height is known only once everything is laid out: draw the body first.
  std::string body;
  double y = 0;
  if (!options.title.empty()) {
    body += "<text class=\"title\" x=\"20\" y=\"28\" font-size=\"16\" font-weight=\"bold\">";
    detail::append_xml_escaped(body, options.title);
    body += "</text>\n";
    y = 38;
  }
  y = detail::draw_time_panel(body, curves, maps, options, y);
  if (!maps.empty()) y = detail::draw_segment_maps(body, curves, maps, options, y);

  const auto height = static_cast<long long>(std::ceil(y));
  std::string out;
  out.reserve(body.size() + 600);
  detail::svg_put(out,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
                  "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\" "
                  "font-size=\"12\">\n<title>",
                  options.width, height);
  detail::append_xml_escaped(out, options.title.empty() ? "memory over time" : options.title);
  detail::svg_put(out,
                  "</title>\n<defs><pattern id=\"{}\" width=\"6\" height=\"6\" "
                  "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                  "<rect width=\"6\" height=\"6\" fill=\"#F4F4F4\"/>"
                  "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#BBBBBB\" "
                  "stroke-width=\"2\"/></pattern></defs>\n"
                  "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                  detail::unmapped_pattern_id);
  out += body;
  out += "</svg>\n";
  return out;
}

/// Writes memory_plot_svg(curves, maps, options) to `out`. Nothing is written when it throws;
/// a failed write shows in the stream's state (and throws only as out.exceptions() asks).
/// Throws what memory_plot_svg throws.
inline void write_memory_plot(std::ostream& out, const std::vector<memory_curve>& curves,
                              const std::vector<segment_map>& maps,
                              const memory_plot_options& options) {
  const std::string svg = memory_plot_svg(curves, maps, options);
  out.write(svg.data(), static_cast<std::streamsize>(svg.size()));
}

}  // namespace gpumem
