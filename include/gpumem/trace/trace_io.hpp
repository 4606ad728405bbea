// gpumem — reading a trace in whichever format it is: gpumem's native text, RMM's CSV log, or a
// PyTorch memory snapshot pickle, told apart by their first bytes (trace_input.hpp).
#pragma once

#include <istream>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/rmm_csv.hpp"
#include "gpumem/trace/trace_input.hpp"

namespace gpumem {

/// Parses a trace held in memory, whatever its format. `snapshot_device` picks the device of a
/// PyTorch snapshot. Throws trace_error (also when the input is empty or its format is not
/// recognised).
inline allocation_trace parse_trace(std::string_view bytes, int snapshot_device = 0) {
  const std::string_view head = bytes.substr(0, detail::trace_head_bytes);
  detail::check_trace_head(head, "", std::nullopt);
  switch (*detect_trace_format(head)) {
    case trace_format::native:
      return parse_native_trace(bytes);
    case trace_format::rmm_csv:
      return parse_rmm_csv(bytes);
    case trace_format::pytorch_snapshot:
      return detail::read_pytorch_snapshot_bytes(bytes, snapshot_device);
  }
  return {};
}

namespace detail {

/// parse_trace, with `name` in front of each error message.
inline allocation_trace parse_named_trace(const std::string& bytes, std::string_view name,
                                          int snapshot_device) {
  try {
    return parse_trace(bytes, snapshot_device);
  } catch (const trace_error& e) {
    throw trace_error(fmt::format("{}{}", trace_name_prefix(name), e.what()), e.offset());
  } catch (const std::bad_alloc&) {
    throw std::system_error(
        std::make_error_code(std::errc::not_enough_memory),
        fmt::format("{}parsing {} bytes", trace_name_prefix(name), bytes.size()));
  }
}

}  // namespace detail

/// Reads a trace from the rest of `in` (opened in binary mode), whatever its format; `name` (a
/// path, or "-" for standard input) starts every error message. Refuses input that is empty or
/// of no known format after its first bytes, and input longer than max_trace_bytes. Throws
/// trace_error when it is not a valid trace, std::system_error when the stream fails or memory
/// runs out.
inline allocation_trace read_trace(std::istream& in, std::string_view name,
                                   int snapshot_device = 0) {
  return detail::parse_named_trace(detail::read_trace_bytes(in, name, std::nullopt), name,
                                   snapshot_device);
}

/// Reads a trace file, whatever its format, as read_trace above. Throws std::system_error when
/// the file cannot be opened or read (a directory: "PATH: Is a directory"), trace_error when it
/// is not a valid trace; every message starts with the path.
inline allocation_trace read_trace(const std::string& path, int snapshot_device = 0) {
  return detail::parse_named_trace(detail::read_trace_file(path, std::nullopt), path,
                                   snapshot_device);
}

}  // namespace gpumem
