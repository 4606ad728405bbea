// libFuzzer target: the unpickler and the PyTorch snapshot reader on any bytes. trace_error is the
// only allowed failure; what it accepts is a valid trace that writes and reads back unchanged, as
// a snapshot (with segments holding the blocks live at its end) and as a native trace (where
// control characters in header text become spaces).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"

namespace {

// One segment per block live at the end of `trace` (its stream, its allocation's size), and one
// more holding what the recording had reserved at the end, so that reading the export rebuilds
// the same initial events and recorded_initial_reserved.
std::vector<gpumem::segment_snapshot<std::uint64_t>> final_segments(
    const gpumem::allocation_trace& trace) {
  struct block {
    std::uint64_t size;
    std::uint64_t stream;
    bool pending;
  };
  std::unordered_map<std::uint64_t, block> live;
  std::uint64_t reserved = trace.recorded_initial_reserved.value_or(0);
  for (const gpumem::trace_event& e : trace.events) {
    switch (e.kind) {
      case gpumem::trace_event_kind::alloc:
        live[e.address] = block{e.size, e.stream, false};
        break;
      case gpumem::trace_event_kind::free_requested:
        live[e.address].pending = true;
        break;
      case gpumem::trace_event_kind::free_completed:
        live.erase(e.address);
        break;
      case gpumem::trace_event_kind::segment_alloc:
        reserved += e.size;  // the reader checked that undoing these never goes below 0
        break;
      case gpumem::trace_event_kind::segment_free:
        reserved -= e.size;
        break;
      case gpumem::trace_event_kind::record_stream:
      case gpumem::trace_event_kind::empty_cache:
        break;
    }
  }
  std::vector<gpumem::segment_snapshot<std::uint64_t>> segments;
  for (const auto& [address, b] : live) {
    gpumem::segment_snapshot<std::uint64_t> s;
    s.address = static_cast<std::uintptr_t>(address);
    s.stream = b.stream;
    gpumem::block_snapshot bs;
    bs.address = static_cast<std::uintptr_t>(address);
    bs.size = static_cast<std::size_t>(b.size);
    bs.requested_size = bs.size;
    bs.state = b.pending ? gpumem::block_state::active_pending_free
                         : gpumem::block_state::active_allocated;
    s.blocks.push_back(bs);
    segments.push_back(std::move(s));
  }
  // A snapshot's ints are 64-bit signed: hold the reserved bytes in pieces of at most 2^63 - 1
  // (and in one segment at least, so that a snapshot without events is still one of device 0).
  constexpr std::uint64_t piece = static_cast<std::uint64_t>(INT64_MAX);
  do {
    gpumem::segment_snapshot<std::uint64_t> held;
    held.total_size = static_cast<std::size_t>(std::min(reserved, piece));
    reserved -= held.total_size;
    segments.push_back(std::move(held));
  } while (reserved > 0);
  return segments;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gpumem::allocation_trace trace;
  try {
    trace = gpumem::detail::read_pytorch_snapshot_bytes(
        std::string_view(reinterpret_cast<const char*>(data), size), 0);
  } catch (const gpumem::trace_error&) {
    return 0;
  }
  gpumem::validate_trace(trace);  // throws (and so crashes the fuzzer) if the reader let it pass

  std::ostringstream snapshot;
  gpumem::write_pytorch_snapshot(snapshot, final_segments(trace), trace);
  if (gpumem::detail::read_pytorch_snapshot_bytes(snapshot.str(), 0) != trace) std::abort();

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
