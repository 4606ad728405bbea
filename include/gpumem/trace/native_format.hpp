// gpumem — the native trace format (docs/trace_format.md): text, one event per line, versioned.
//
// Text so that a person can read, grep, diff and hand-write traces; one event per line so that
// tools like head, sed and awk cut them; versioned in the first line so that a reader refuses a
// file it does not understand instead of misreading it.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/trace_input.hpp"

namespace gpumem {

// Version 2 adds the empty_cache event; a trace without one is written as version 1, which
// readers of either version read alike.
inline constexpr int native_trace_version = 2;

namespace detail {

/// A line-by-line reader over the whole text that knows each line's byte offset. A UTF-8 byte
/// order mark at the start is skipped (offsets still count it). `format` names the format in
/// error messages.
class trace_text_parser {
 public:
  explicit trace_text_parser(std::string_view text, trace_format format = trace_format::native)
      : text_(text), format_(format), pos_(text.size() - skip_utf8_bom(text).size()) {}

  bool next_line(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    line_start_ = pos_;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    line = text_.substr(pos_, end - pos_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos_ = end + 1;
    ++line_number_;
    return true;
  }

  /// The next field of `line` (split at spaces and tabs), or an empty view at the end.
  static std::string_view next_field(std::string_view& line) {
    std::size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    std::string_view field = line.substr(i, j - i);
    line.remove_prefix(j);
    return field;
  }

  [[noreturn]] void fail(std::string_view line, std::string_view at,
                         const std::string& what) const {
    const std::size_t column = at.data() != nullptr && at.data() >= line.data()
                                   ? static_cast<std::size_t>(at.data() - line.data())
                                   : 0;
    throw trace_error(fmt::format("{}: line {}, column {} (byte {}): {}", to_string(format_),
                                  line_number_, column + 1, line_start_ + column, what),
                      line_start_ + column);
  }

  std::uint64_t parse_u64(std::string_view line, std::string_view field, const char* name,
                          int base = 10) const {
    std::string_view digits = field;
    if (base == 16) {
      if (digits.size() < 3 || digits[0] != '0' || (digits[1] != 'x' && digits[1] != 'X')) {
        fail(line, field, fmt::format("{} '{}' must be hexadecimal starting with 0x", name, field));
      }
      digits.remove_prefix(2);
    }
    if (digits.empty()) fail(line, field, fmt::format("{} is missing", name));
    if (digits.front() == '-') {
      fail(line, field, fmt::format("{} '{}' is negative", name, field));
    }
    std::uint64_t value = 0;
    const auto [ptr, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (ec == std::errc::result_out_of_range) {
      fail(line, field, fmt::format("{} '{}' does not fit in 64 bits", name, field));
    }
    if (ec != std::errc() || ptr != digits.data() + digits.size()) {
      fail(line, field, fmt::format("{} '{}' is not a number", name, field));
    }
    return value;
  }

 private:
  std::string_view text_;
  trace_format format_;
  std::size_t pos_;
  std::size_t line_start_ = 0;
  std::size_t line_number_ = 0;
};

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Whether a byte of header text would not survive being written on one line and read back:
/// control characters (tab excepted) and DEL.
constexpr bool is_header_control(char c) noexcept {
  const auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && c != '\t') || u == 0x7f;
}

}  // namespace detail

/// Parses a native trace. Throws trace_error (offset(): the byte offset of the problem) on a
/// malformed line, and trace_error (offset(): the event index) when the events make no sense
/// (validate_trace). Never reads past `text`.
inline allocation_trace parse_native_trace(std::string_view text) {
  detail::trace_text_parser p(text);
  allocation_trace trace;
  std::string_view line;
  int version_read = 1;
  if (!p.next_line(line)) {
    throw trace_error("gpumem trace: the input is empty (expected 'gpumem-trace 1')", 0);
  }
  {
    std::string_view rest = line;
    const std::string_view magic = p.next_field(rest);
    const std::string_view version = p.next_field(rest);
    if (magic != native_trace_magic || !p.next_field(rest).empty()) {
      p.fail(line, magic, "not a gpumem trace (the first line must be 'gpumem-trace 1')");
    }
    version_read = version == "1" ? 1 : 2;
    if (version != "1" && version != "2") {
      p.fail(
          line, version,
          fmt::format("gpumem trace version '{}' is not supported (this reader knows version {})",
                      version, native_trace_version));
    }
  }
  constexpr std::size_t key_count = 6;
  bool seen[key_count] = {};
  bool events_started = false;
  std::size_t initial_events = 0;
  trace.events.reserve(text.size() / 32);
  while (p.next_line(line)) {
    std::string_view rest = line;
    const std::string_view kind = p.next_field(rest);
    if (kind.empty() || kind.front() == '#') continue;
    if (kind.front() == '@') {
      if (events_started) p.fail(line, kind, "header lines must come before the first event");
      static constexpr std::string_view keys[] = {
          "@source",        "@recorded_config", "@recorded_initial_reserved",
          "@device_memory", "@initial_events",  "@recorded_oom_event"};
      std::size_t k = 0;
      while (k < key_count && keys[k] != kind) ++k;
      if (k == key_count) p.fail(line, kind, fmt::format("unknown header key '{}'", kind));
      if (seen[k]) p.fail(line, kind, fmt::format("header key '{}' given twice", kind));
      seen[k] = true;
      const std::string_view value = detail::trim(rest);
      // What the writer could not write back on one line is refused, not misread.
      for (const char& c : value) {
        if (detail::is_header_control(c)) {
          p.fail(line, std::string_view(&c, 1),
                 fmt::format("control character 0x{:02x} in the value of {}",
                             static_cast<unsigned char>(c), kind));
        }
      }
      switch (k) {
        case 0:
          trace.source = std::string(value);
          break;
        case 1:
          trace.recorded_config = std::string(value);
          break;
        case 2:
          trace.recorded_initial_reserved = p.parse_u64(line, value, "@recorded_initial_reserved");
          break;
        case 3:
          trace.device_memory = p.parse_u64(line, value, "@device_memory");
          break;
        case 4:
          initial_events = static_cast<std::size_t>(p.parse_u64(line, value, "@initial_events"));
          break;
        default:
          trace.recorded_oom_event =
              static_cast<std::size_t>(p.parse_u64(line, value, "@recorded_oom_event"));
      }
      continue;
    }
    events_started = true;
    const auto parsed_kind = trace_event_kind_from_string(kind);
    if (!parsed_kind) p.fail(line, kind, fmt::format("unknown event kind '{}'", kind));
    trace_event e;
    e.kind = *parsed_kind;
    if (e.kind == trace_event_kind::empty_cache && version_read == 1) {
      p.fail(line, kind, "empty_cache events need 'gpumem-trace 2'");
    }
    const std::string_view address = p.next_field(rest);
    const std::string_view size = p.next_field(rest);
    const std::string_view stream = p.next_field(rest);
    const std::string_view time = p.next_field(rest);
    if (stream.empty()) {
      p.fail(line, rest, "an event needs KIND ADDRESS SIZE STREAM [TIME_US]");
    }
    e.address = p.parse_u64(line, address, "the address", 16);
    e.size = p.parse_u64(line, size, "the size");
    e.stream = p.parse_u64(line, stream, "the stream");
    if (!time.empty()) {
      const std::uint64_t t = p.parse_u64(line, time, "the time");
      if (t > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        p.fail(line, time, "the time is too large");
      e.time_us = static_cast<std::int64_t>(t);
    }
    const std::string_view extra = p.next_field(rest);
    if (!extra.empty()) p.fail(line, extra, fmt::format("unexpected field '{}'", extra));
    trace.events.push_back(e);
  }
  trace.initial_events = initial_events;
  validate_trace(trace);
  return trace;
}

/// Reads a native trace file (at most max_trace_bytes). Throws std::system_error when it cannot
/// be read, trace_error as parse_native_trace; messages start with the path.
inline allocation_trace read_native_trace(const std::string& path) {
  const std::string text = detail::read_trace_file(path, trace_format::native);
  try {
    return parse_native_trace(text);
  } catch (const trace_error& e) {
    throw trace_error(fmt::format("{}: {}", path, e.what()), e.offset());
  }
}

/// Writes `trace` in the native format: version 2 when it has empty_cache events, else 1. In header
/// text, each control character (line breaks included; tab excepted) is written as a space, and
/// spaces and tabs around it are dropped, as a reader drops them. Throws what the stream throws (if
/// exceptions are enabled).
inline void write_native_trace(std::ostream& out, const allocation_trace& trace) {
  auto one_line = [](const std::string& s) {
    std::string line(s);
    for (char& c : line) {
      if (detail::is_header_control(c)) c = ' ';
    }
    return std::string(detail::trim(line));
  };
  fmt::memory_buffer buf;
  const bool needs_v2 =
      std::any_of(trace.events.begin(), trace.events.end(),
                  [](const trace_event& e) { return e.kind == trace_event_kind::empty_cache; });
  fmt::format_to(std::back_inserter(buf), "{} {}\n", native_trace_magic, needs_v2 ? 2 : 1);
  if (!trace.source.empty())
    fmt::format_to(std::back_inserter(buf), "@source {}\n", one_line(trace.source));
  if (!trace.recorded_config.empty()) {
    fmt::format_to(std::back_inserter(buf), "@recorded_config {}\n",
                   one_line(trace.recorded_config));
  }
  if (trace.recorded_initial_reserved) {
    fmt::format_to(std::back_inserter(buf), "@recorded_initial_reserved {}\n",
                   *trace.recorded_initial_reserved);
  }
  if (trace.device_memory)
    fmt::format_to(std::back_inserter(buf), "@device_memory {}\n", *trace.device_memory);
  if (trace.initial_events != 0) {
    fmt::format_to(std::back_inserter(buf), "@initial_events {}\n", trace.initial_events);
  }
  if (trace.recorded_oom_event) {
    fmt::format_to(std::back_inserter(buf), "@recorded_oom_event {}\n", *trace.recorded_oom_event);
  }
  for (const trace_event& e : trace.events) {
    if (e.time_us == no_time) {
      fmt::format_to(std::back_inserter(buf), "{} 0x{:x} {} {}\n", to_string(e.kind), e.address,
                     e.size, e.stream);
    } else {
      fmt::format_to(std::back_inserter(buf), "{} 0x{:x} {} {} {}\n", to_string(e.kind), e.address,
                     e.size, e.stream, e.time_us);
    }
    if (buf.size() > (std::size_t{1} << 16)) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  }
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

}  // namespace gpumem
