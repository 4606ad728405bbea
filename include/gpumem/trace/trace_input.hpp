// gpumem — a trace's bytes before any parsing: which format they are in, told from the first
// bytes so that anything else is refused at once, and reading them from a file or a stream with
// a bound, so that input without end (/dev/zero, a pipe) is an error rather than exhausted
// memory. Every error names the file.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "gpumem/error.hpp"

namespace gpumem {

inline constexpr std::string_view native_trace_magic = "gpumem-trace";
inline constexpr std::string_view rmm_csv_header = "Thread,Time,Action,Pointer,Size,Stream";

/// The largest trace the readers take in: 8 GiB, far above real recordings (a PyTorch snapshot
/// of a million events is some tens of MB). Longer input is refused with a trace_error.
inline constexpr std::uint64_t max_trace_bytes = std::uint64_t{8} << 30;

enum class trace_format { native, rmm_csv, pytorch_snapshot };

constexpr std::string_view to_string(trace_format f) noexcept {
  switch (f) {
    case trace_format::native:
      return "gpumem trace";
    case trace_format::rmm_csv:
      return "RMM memory event log";
    case trace_format::pytorch_snapshot:
      return "PyTorch memory snapshot";
  }
  return "unknown";
}

namespace detail {

/// How many bytes detect_trace_format looks at.
inline constexpr std::size_t trace_head_bytes = 256;

/// `text` without the UTF-8 byte order mark some editors put first in a text file.
constexpr std::string_view skip_utf8_bom(std::string_view text) noexcept {
  return text.substr(0, 3) == std::string_view("\xef\xbb\xbf") ? text.substr(3) : text;
}

}  // namespace detail

/// The format of input that starts with `head` (its first 256 bytes are enough), or nothing.
/// Text formats may start with a UTF-8 byte order mark and white space. Never throws.
inline std::optional<trace_format> detect_trace_format(std::string_view head) noexcept {
  if (!head.empty() && static_cast<unsigned char>(head[0]) == 0x80) {
    return trace_format::pytorch_snapshot;  // pickle protocol 2+: PROTO opcode
  }
  head = detail::skip_utf8_bom(head);
  while (!head.empty() && (head.front() == ' ' || head.front() == '\n' || head.front() == '\r' ||
                           head.front() == '\t')) {
    head.remove_prefix(1);
  }
  if (head.substr(0, native_trace_magic.size()) == native_trace_magic) return trace_format::native;
  if (head.substr(0, rmm_csv_header.size()) == rmm_csv_header) return trace_format::rmm_csv;
  return std::nullopt;
}

namespace detail {

/// "NAME: " or nothing when the input has no name.
inline std::string trace_name_prefix(std::string_view name) {
  return name.empty() ? std::string() : fmt::format("{}: ", name);
}

/// Refuses input whose first bytes (`head`) are not those of a trace (of format `expected`, when
/// given): trace_error at offset 0, its message prefixed with `name`.
inline void check_trace_head(std::string_view head, std::string_view name,
                             std::optional<trace_format> expected) {
  static constexpr std::string_view any =
      "a gpumem trace ('gpumem-trace 1'), an RMM memory event log "
      "('Thread,Time,Action,Pointer,Size,Stream') or a PyTorch memory snapshot "
      "(torch.cuda.memory._dump_snapshot pickle)";
  const std::string prefix = trace_name_prefix(name);
  if (head.empty()) {
    throw trace_error(
        fmt::format("{}the {} is empty (expected {})", prefix, name.empty() ? "input" : "file",
                    expected ? to_string(*expected) : any),
        0);
  }
  const std::optional<trace_format> format = detect_trace_format(head);
  if (!expected) {
    if (!format) {
      throw trace_error(fmt::format("{}not a trace gpumem can read: expected {}", prefix, any), 0);
    }
    return;
  }
  if (format == expected) return;
  switch (*expected) {
    case trace_format::native:
      throw trace_error(
          fmt::format("{}not a gpumem trace (the first line must be 'gpumem-trace 1')", prefix), 0);
    case trace_format::rmm_csv:
      throw trace_error(fmt::format("{}not an RMM memory event log (the header must be '{}')",
                                    prefix, rmm_csv_header),
                        0);
    case trace_format::pytorch_snapshot:
      throw trace_error(fmt::format("{}not a PyTorch memory snapshot (a pickle of protocol 2 or "
                                    "later starts with the byte 0x80)",
                                    prefix),
                        0);
  }
}

/// `bytes` for a person: "8 GiB", "1536 bytes".
inline std::string byte_count(std::uint64_t bytes) {
  if (bytes != 0 && bytes % (std::uint64_t{1} << 30) == 0)
    return fmt::format("{} GiB", bytes >> 30);
  if (bytes != 0 && bytes % (std::uint64_t{1} << 20) == 0)
    return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

/// The rest of `in`, checked by check_trace_head before more than its first bytes are read, at
/// most `limit` bytes. `size_hint`: the expected size, when known (a regular file's), 0 if not.
/// Throws trace_error (refused or too long), std::system_error when the stream fails or memory
/// runs out; each message starts with `name` (when not empty).
inline std::string read_trace_bytes(std::istream& in, std::string_view name,
                                    std::optional<trace_format> expected,
                                    std::uint64_t size_hint = 0,
                                    std::uint64_t limit = max_trace_bytes) {
  const std::string prefix = trace_name_prefix(name);
  std::string bytes;
  auto read_more = [&](std::size_t n) {
    const std::size_t old = bytes.size();
    bytes.resize(old + n);
    in.read(bytes.data() + old, static_cast<std::streamsize>(n));
    const auto got = static_cast<std::size_t>(in.gcount());
    bytes.resize(old + got);
    if (in.bad()) {
      throw std::system_error(std::make_error_code(std::io_errc::stream),
                              fmt::format("{}cannot read after byte {}", prefix, old + got));
    }
    return got == n;
  };
  try {
    bool more = read_more(trace_head_bytes);
    check_trace_head(bytes, name, expected);
    auto too_long = [&](std::uint64_t size) {
      return trace_error(fmt::format("{}{} bytes or more, larger than the {} a trace may have",
                                     prefix, size, byte_count(limit)),
                         static_cast<std::size_t>(limit));
    };
    if (size_hint > limit) throw too_long(size_hint);
    if (size_hint > bytes.size()) bytes.reserve(static_cast<std::size_t>(size_hint) + 1);
    while (more) {
      // Read what the hint promises in one go, then grow the string geometrically; one byte more
      // than the limit tells a trace of exactly the limit from a longer one.
      const std::uint64_t room = limit + 1 - bytes.size();
      const std::uint64_t want =
          std::max<std::uint64_t>({std::uint64_t{1} << 20, bytes.size(),
                                   size_hint > bytes.size() ? size_hint - bytes.size() + 1 : 0});
      more = read_more(static_cast<std::size_t>(std::min(room, want)));
      if (bytes.size() > limit) throw too_long(bytes.size());
    }
  } catch (const std::bad_alloc&) {
    throw std::system_error(std::make_error_code(std::errc::not_enough_memory),
                            fmt::format("{}reading {} bytes", prefix, bytes.size()));
  }
  return bytes;
}

/// read_trace_bytes from the file at `path`. Throws std::system_error when it cannot be opened
/// or read (a directory: "PATH: Is a directory"), trace_error as read_trace_bytes.
inline std::string read_trace_file(const std::string& path, std::optional<trace_format> expected,
                                   std::uint64_t limit = max_trace_bytes) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status)) {
    throw std::system_error(std::make_error_code(std::errc::is_a_directory), path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::system_error(errno, std::generic_category(), "cannot open '" + path + "'");
  std::uint64_t size = 0;
  if (std::filesystem::is_regular_file(status)) {
    const std::uintmax_t s = std::filesystem::file_size(path, ec);
    if (!ec) size = static_cast<std::uint64_t>(s);
  }
  return read_trace_bytes(in, path, expected, size, limit);
}

}  // namespace detail

}  // namespace gpumem
