// libFuzzer target: the unpickler and the PyTorch snapshot reader on any bytes. trace_error is the
// only allowed failure; what it accepts is a valid trace that writes and reads back unchanged, as
// a snapshot (write_pytorch_snapshot of the trace alone: initial events, reserved memory and the
// out-of-memory included) and as a native trace (where control characters in header text become
// spaces).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gpumem::allocation_trace trace;
  try {
    trace = gpumem::detail::read_pytorch_snapshot_bytes(
        std::string_view(reinterpret_cast<const char*>(data), size), 0);
  } catch (const gpumem::trace_error&) {
    return 0;
  }
  gpumem::validate_trace(trace);  // throws (and so crashes the fuzzer) if the reader let it pass

  // Written back alone (its segments: its own state at its end), it reads back unchanged. A
  // snapshot whose active blocks hold more than its segments (no allocator writes one) gives a
  // trace that cannot be written back so; the writer refuses it.
  const gpumem::detail::snapshot_end_state end = gpumem::detail::pytorch_snapshot_end_state(trace);
  if (end.live_bytes <= end.reserved) {
    std::ostringstream snapshot;
    gpumem::write_pytorch_snapshot(snapshot, trace);
    if (gpumem::detail::read_pytorch_snapshot_bytes(snapshot.str(), 0) != trace) std::abort();
  }

  // The native format keeps header text on one line: control characters come back as spaces.
  gpumem::allocation_trace one_line = trace;
  for (char& c : one_line.recorded_config) {
    if (gpumem::detail::is_header_control(c)) c = ' ';
  }
  one_line.recorded_config = std::string(gpumem::detail::trim(one_line.recorded_config));
  std::ostringstream native;
  gpumem::write_native_trace(native, trace);
  if (gpumem::parse_native_trace(native.str()) != one_line) std::abort();
  return 0;
}
