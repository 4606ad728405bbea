// gpumem — reading a trace in whichever format it is: gpumem's native text, RMM's CSV log, or a
// PyTorch memory snapshot pickle, told apart by their first bytes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/rmm_csv.hpp"

namespace gpumem {

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

/// The format of a file that starts with `head`, or nothing. Never throws.
inline std::optional<trace_format> detect_trace_format(std::string_view head) noexcept {
  if (!head.empty() && static_cast<unsigned char>(head[0]) == 0x80) {
    return trace_format::pytorch_snapshot;  // pickle protocol 2+: PROTO opcode
  }
  while (!head.empty() && (head.front() == ' ' || head.front() == '\n' || head.front() == '\r' ||
                           head.front() == '\t')) {
    head.remove_prefix(1);
  }
  if (head.substr(0, native_trace_magic.size()) == native_trace_magic) return trace_format::native;
  if (head.substr(0, rmm_csv_header.size()) == rmm_csv_header) return trace_format::rmm_csv;
  return std::nullopt;
}

/// Parses a trace held in memory, whatever its format. `snapshot_device` picks the device of a
/// PyTorch snapshot. Throws trace_error (also when the format is not recognised).
inline allocation_trace parse_trace(std::string_view bytes, int snapshot_device = 0) {
  const auto format = detect_trace_format(bytes.substr(0, 256));
  if (!format) {
    throw trace_error(
        "not a trace gpumem can read: expected a gpumem trace ('gpumem-trace 1'), an RMM memory "
        "event log ('Thread,Time,Action,Pointer,Size,Stream') or a PyTorch memory snapshot "
        "(torch.cuda.memory._dump_snapshot pickle)",
        0);
  }
  switch (*format) {
    case trace_format::native:
      return parse_native_trace(bytes);
    case trace_format::rmm_csv:
      return parse_rmm_csv(bytes);
    case trace_format::pytorch_snapshot:
      return detail::read_pytorch_snapshot_bytes(bytes, snapshot_device);
  }
  return {};
}

/// Reads a trace file, whatever its format. Throws std::system_error when the file cannot be
/// read, trace_error when it is not a valid trace (the message starts with the path).
inline allocation_trace read_trace(const std::string& path, int snapshot_device = 0) {
  const std::string bytes = detail::read_whole_file(path);
  try {
    return parse_trace(bytes, snapshot_device);
  } catch (const trace_error& e) {
    throw trace_error(fmt::format("{}: {}", path, e.what()), e.offset());
  }
}

}  // namespace gpumem
