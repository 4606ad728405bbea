// gpumem — RMM's memory event log (rmm::mr::logging_resource_adaptor's CSV), read and written.
//
// The log has the header `Thread,Time,Action,Pointer,Size,Stream` and one row per call:
// `140573312345856,12:34:56.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020`. Actions are
// `allocate`, `free` and `allocate failure` (`deallocate` is read as `free`). Pointers and streams
// are printed by C (`0x...`, `(nil)`) or by fmt (`0x0`); the time is the wall clock of the day
// (when it goes back by more than 12 hours, the reader takes it that midnight passed).
//
// RMM has one kind of free, so a log read here has free_requested events only (a replay returns
// each block at once), and writing a trace drops free_completed, record_stream and segment events.
// The first `allocate failure` becomes the trace's recorded_oom_event; later ones are dropped.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"  // detail::trace_text_parser
#include "gpumem/trace/trace_input.hpp"

namespace gpumem {

namespace detail {

/// The next comma-separated field of `line` (spaces around it removed).
inline std::string_view next_csv_field(std::string_view& line, bool& found) {
  const std::size_t comma = line.find(',');
  found = !line.empty() || comma != std::string_view::npos;
  std::string_view field = line.substr(0, comma);
  line.remove_prefix(comma == std::string_view::npos ? line.size() : comma + 1);
  return trim(field);
}

/// The latest time a log may give, in microseconds: 2^40 s (some 35,000 years) of either form,
/// the clock's passes over midnight included, so that times never overflow.
inline constexpr std::int64_t max_csv_time_us = (std::int64_t{1} << 40) * 1000000 + 999999;

/// "HH:MM:SS.ffffff" (RMM's spdlog pattern; HH may pass 23) or plain seconds "1634567890.123456"
/// → microseconds, at most max_csv_time_us.
inline bool parse_csv_time(std::string_view s, std::int64_t& us) {
  constexpr std::int64_t max_seconds = std::int64_t{1} << 40;
  auto number = [](std::string_view d, std::int64_t& v) {
    if (d.empty()) return false;
    const auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    return ec == std::errc() && p == d.data() + d.size() && v >= 0;
  };
  std::int64_t seconds = 0;
  std::int64_t fraction = 0;
  std::size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  if (dot != std::string_view::npos) {
    std::string_view frac = s.substr(dot + 1);
    if (frac.size() > 9 || !number(frac, fraction)) return false;
    for (std::size_t i = frac.size(); i < 6; ++i) fraction *= 10;
    for (std::size_t i = 6; i < frac.size(); ++i) fraction /= 10;
  }
  if (whole.find(':') != std::string_view::npos) {
    std::int64_t h = 0, m = 0, sec = 0;
    const std::size_t c1 = whole.find(':');
    const std::size_t c2 = whole.find(':', c1 + 1);
    if (c2 == std::string_view::npos || !number(whole.substr(0, c1), h) ||
        !number(whole.substr(c1 + 1, c2 - c1 - 1), m) || !number(whole.substr(c2 + 1), sec) ||
        m > 59 || sec > 60 || h > max_seconds / 3600) {
      return false;
    }
    seconds = h * 3600 + m * 60 + sec;
  } else if (!number(whole, seconds)) {
    return false;
  }
  if (seconds > max_seconds) return false;
  us = seconds * 1000000 + fraction;
  return true;
}

}  // namespace detail

/// Parses an RMM memory event log. Throws trace_error with the byte offset of a malformed row
/// (or the event index when the events make no sense, as validate_trace).
inline allocation_trace parse_rmm_csv(std::string_view text) {
  detail::trace_text_parser p(text, trace_format::rmm_csv);
  allocation_trace trace;
  trace.source = "rmm-csv";
  std::string_view line;
  while (p.next_line(line) && detail::trim(line).empty()) {
  }
  if (detail::trim(line) != rmm_csv_header) {
    p.fail(line, line,
           fmt::format("not an RMM memory event log (the header must be '{}')", rmm_csv_header));
  }
  trace.events.reserve(text.size() / 48);
  std::int64_t day_offset = 0;  // the time of day wraps at midnight
  std::int64_t last_time = -1;
  auto parse_pointer = [&](std::string_view row, std::string_view f, const char* name) {
    if (f == "(nil)" || f == "0" || f == "nullptr") return std::uint64_t{0};
    if (f.size() > 2 && f[0] == '0' && (f[1] == 'x' || f[1] == 'X')) {
      return p.parse_u64(row, f, name, 16);
    }
    return p.parse_u64(row, f, name);
  };
  while (p.next_line(line)) {
    if (detail::trim(line).empty()) continue;
    std::string_view rest = line;
    bool found = false;
    std::string_view fields[6];
    for (auto& f : fields) {
      f = detail::next_csv_field(rest, found);
      if (!found)
        p.fail(line, rest, "a row needs 6 fields: Thread,Time,Action,Pointer,Size,Stream");
    }
    if (!rest.empty()) p.fail(line, rest, "a row has more than 6 fields");
    const std::string_view action = fields[2];
    std::int64_t time = no_time;
    if (!fields[1].empty()) {
      if (!detail::parse_csv_time(fields[1], time)) {
        p.fail(
            line, fields[1],
            fmt::format("the time '{}' is not HH:MM:SS.ffffff (at most 2^40 seconds)", fields[1]));
      }
      // The clock went back by more than 12 hours: midnight passed, as many times as it takes to
      // come within 12 hours of the last time (once, with RMM's times of day; more with hours past
      // 23), so that every time read is at most 12 hours before the one above it and writing the
      // times back in hours reads back the same. All terms are at most max_csv_time_us + a day.
      const std::int64_t day = std::int64_t{86400} * 1000000;
      const std::int64_t behind = last_time - (time + day_offset + std::int64_t{43200} * 1000000);
      if (last_time >= 0 && behind > 0) day_offset += (behind + day - 1) / day * day;
      if (time > detail::max_csv_time_us - day_offset) {
        p.fail(line, fields[1],
               fmt::format("the time '{}' is past 2^40 seconds once the clock's {} passes over "
                           "midnight are counted",
                           fields[1], day_offset / day));
      }
      time += day_offset;
      last_time = time;
    }
    const std::uint64_t size = p.parse_u64(line, fields[4], "the size");
    const std::uint64_t stream = parse_pointer(line, fields[5], "the stream");
    if (action == "allocate failure") {
      if (!trace.recorded_oom_event) trace.recorded_oom_event = trace.events.size();
      continue;
    }
    trace_event e;
    if (action == "allocate") {
      e.kind = trace_event_kind::alloc;
    } else if (action == "free" || action == "deallocate") {
      e.kind = trace_event_kind::free_requested;
    } else {
      p.fail(
          line, action,
          fmt::format("unknown action '{}' (expected allocate, free or allocate failure)", action));
    }
    e.address = parse_pointer(line, fields[3], "the pointer");
    e.size = size;
    e.stream = stream;
    e.time_us = time;
    trace.events.push_back(e);
  }
  validate_trace(trace);
  return trace;
}

/// Reads an RMM memory event log (at most max_trace_bytes). Throws std::system_error when it
/// cannot be read, trace_error as parse_rmm_csv; messages start with the path.
inline allocation_trace read_rmm_csv(const std::string& path) {
  const std::string text = detail::read_trace_file(path, trace_format::rmm_csv);
  try {
    return parse_rmm_csv(text);
  } catch (const trace_error& e) {
    throw trace_error(fmt::format("{}: {}", path, e.what()), e.offset());
  }
}

/// Writes `trace` as an RMM memory event log (see the top of this file for what is dropped).
/// Times are written as HH:MM:SS.ffffff, the hours going past 23 after the first day (so that
/// parse_rmm_csv reads back what it read), and an empty field for no_time. Frees carry their own
/// size, or the size of their allocation when theirs is 0 (unknown). Throws trace_error when the
/// trace is invalid or has a time parse_rmm_csv could not read back (negative, or past
/// detail::max_csv_time_us; offset: the event index).
inline void write_rmm_csv(std::ostream& out, const allocation_trace& trace) {
  validate_trace(trace);
  std::unordered_map<std::uint64_t, std::uint64_t> sizes;
  fmt::memory_buffer buf;
  auto it = std::back_inserter(buf);
  fmt::format_to(it, "{}\n", rmm_csv_header);
  auto time_of = [&](std::size_t i) {
    if (i >= trace.events.size()) return std::string();
    const std::int64_t us = trace.events[i].time_us;
    if (us == no_time) return std::string();
    if (us < 0 || us > detail::max_csv_time_us) {
      throw trace_error(fmt::format("RMM memory event log: event {}: the time {} us cannot be "
                                    "written (0 to 2^40 s)",
                                    i, us),
                        i);
    }
    return fmt::format("{:02}:{:02}:{:02}.{:06}", us / 3600000000, us / 60000000 % 60,
                       us / 1000000 % 60, us % 1000000);
  };
  for (std::size_t i = 0; i <= trace.events.size(); ++i) {
    if (trace.recorded_oom_event && *trace.recorded_oom_event == i) {
      fmt::format_to(it, "1,{},allocate failure,0x0,0,0x0\n", time_of(i));
    }
    if (i == trace.events.size()) break;
    const trace_event& e = trace.events[i];
    if (e.kind == trace_event_kind::alloc) {
      sizes[e.address] = e.size;
      fmt::format_to(it, "1,{},allocate,0x{:x},{},0x{:x}\n", time_of(i), e.address, e.size,
                     e.stream);
    } else if (e.kind == trace_event_kind::free_requested) {
      fmt::format_to(it, "1,{},free,0x{:x},{},0x{:x}\n", time_of(i), e.address,
                     e.size != 0 ? e.size : sizes[e.address], e.stream);
    }
    if (buf.size() > (std::size_t{1} << 16)) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  }
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

}  // namespace gpumem
