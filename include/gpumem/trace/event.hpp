// gpumem — allocation traces: the event model shared by every trace format and the replay.
//
// A *trace* is the ordered list of what one program asked of its device allocator: allocations
// (address, requested size, stream), frees, and record_stream calls. Two frees are kept apart, as
// PyTorch's snapshots do: *free_requested* is when the program released the block, and
// *free_completed* is when the recording allocator could really reuse it (after the work queued
// on other streams finished). A replay counts requested bytes down at free_requested and returns
// the block to the allocator under test at free_completed; a free_requested that no
// free_completed follows (RMM logs, gpumem's recorder) returns it at once.
//
// Addresses are the recording device's: they only identify a block while it is live. Traces can
// also carry what the recording allocator did with whole segments (segment_alloc / segment_free,
// PyTorch's cudaMalloc / cudaFree), which a replay ignores but reports as the reference to beat.
//
// A recording can start after the program has already allocated: the first `initial_events`
// events are then alloc events that rebuild the blocks live at the start (readers of PyTorch
// snapshots derive them from the final state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "gpumem/error.hpp"

namespace gpumem {

/// What happened; the names are those of PyTorch's snapshots.
enum class trace_event_kind : std::uint8_t {
  alloc,           ///< `size` bytes requested on `stream`, handed out at `address`
  free_requested,  ///< the program released `address` (`size`: its requested size, or 0)
  free_completed,  ///< the block at `address` went back to the recording allocator's cache
  record_stream,   ///< the block at `address` is also used on `stream`
  segment_alloc,   ///< reference: the recording allocator took `size` bytes from the device
  segment_free,    ///< reference: the recording allocator gave `size` bytes back to the device
  empty_cache,     ///< the program emptied the allocator's cache (torch.cuda.empty_cache());
                   ///< address, size and stream 0
};

inline constexpr std::int64_t no_time = -1;

/// One event. `stream` is an opaque id (0: the default stream).
struct trace_event {
  trace_event_kind kind = trace_event_kind::alloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = no_time;  ///< microseconds, any origin; no_time when not recorded

  friend bool operator==(const trace_event& a, const trace_event& b) noexcept {
    return a.kind == b.kind && a.address == b.address && a.size == b.size && a.stream == b.stream &&
           a.time_us == b.time_us;
  }
  friend bool operator!=(const trace_event& a, const trace_event& b) noexcept { return !(a == b); }
};

/// A whole trace and what is known about its recording.
struct allocation_trace {
  std::vector<trace_event> events;
  /// The first `initial_events` events are allocs that rebuild the state before recording began.
  std::size_t initial_events = 0;
  /// Where it came from: "gpumem", "rmm-csv", "pytorch-snapshot", a workload name, ...
  std::string source;
  /// The recording allocator's configuration, as text (e.g. its PYTORCH_CUDA_ALLOC_CONF).
  std::string recorded_config;
  /// Bytes the recording allocator held from the device before the first event, when known
  /// (its segment_alloc / segment_free events then give its reserved memory over time).
  std::optional<std::uint64_t> recorded_initial_reserved;
  /// Total memory of the recording device, when known.
  std::optional<std::uint64_t> device_memory;
  /// When the recording itself ran out of memory: the number of events before the request that
  /// failed. The failed request is not an event, except in traces read from PyTorch snapshots,
  /// whose oom event gives its size: there event recorded_oom_event is that request (an alloc at
  /// address 0, followed by its free), so that a replay tries it.
  std::optional<std::size_t> recorded_oom_event;

  friend bool operator==(const allocation_trace& a, const allocation_trace& b) {
    return a.events == b.events && a.initial_events == b.initial_events && a.source == b.source &&
           a.recorded_config == b.recorded_config &&
           a.recorded_initial_reserved == b.recorded_initial_reserved &&
           a.device_memory == b.device_memory && a.recorded_oom_event == b.recorded_oom_event;
  }
  friend bool operator!=(const allocation_trace& a, const allocation_trace& b) { return !(a == b); }
};

/// The event kind's name as it appears in traces ("alloc", "free_requested", ...). Never throws.
constexpr std::string_view to_string(trace_event_kind kind) noexcept {
  switch (kind) {
    case trace_event_kind::alloc:
      return "alloc";
    case trace_event_kind::free_requested:
      return "free_requested";
    case trace_event_kind::free_completed:
      return "free_completed";
    case trace_event_kind::record_stream:
      return "record_stream";
    case trace_event_kind::segment_alloc:
      return "segment_alloc";
    case trace_event_kind::segment_free:
      return "segment_free";
    case trace_event_kind::empty_cache:
      return "empty_cache";
  }
  return "unknown";
}

/// The kind named `name`, or nothing. Never throws.
constexpr std::optional<trace_event_kind> trace_event_kind_from_string(
    std::string_view name) noexcept {
  for (auto k :
       {trace_event_kind::alloc, trace_event_kind::free_requested, trace_event_kind::free_completed,
        trace_event_kind::record_stream, trace_event_kind::segment_alloc,
        trace_event_kind::segment_free, trace_event_kind::empty_cache}) {
    if (to_string(k) == name) return k;
  }
  return std::nullopt;
}

/// Checks that `trace` makes sense (docs/trace_format.md, "Meaning"): each alloc asks for > 0 bytes
/// at an address that is not live, each free_requested and record_stream names a live block, each
/// free_completed a block whose free was requested, and the first initial_events events are
/// allocs. Throws trace_error whose offset() is the index of the first offending event.
inline void validate_trace(const allocation_trace& trace) {
  enum class state : std::uint8_t { live, free_requested };
  std::unordered_map<std::uint64_t, state> blocks;
  blocks.reserve(1024);
  if (trace.recorded_oom_event && *trace.recorded_oom_event > trace.events.size()) {
    throw trace_error(
        fmt::format("trace: the recorded out-of-memory point {} is past the last event",
                    *trace.recorded_oom_event),
        trace.events.size());
  }
  if (trace.initial_events > trace.events.size()) {
    throw trace_error(fmt::format("trace: {} initial events declared but the trace has {} events",
                                  trace.initial_events, trace.events.size()),
                      trace.events.size());
  }
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const trace_event& e = trace.events[i];
    auto fail = [&](const char* what) {
      throw trace_error(fmt::format("trace: event {} ({} 0x{:x} {} bytes): {}", i,
                                    to_string(e.kind), e.address, e.size, what),
                        i);
    };
    if (i < trace.initial_events && e.kind != trace_event_kind::alloc) {
      fail("an initial event must be an alloc");
    }
    auto it = blocks.find(e.address);
    switch (e.kind) {
      case trace_event_kind::alloc:
        if (e.size == 0) fail("an allocation of 0 bytes");
        if (it != blocks.end() && it->second == state::live) fail("the address is already live");
        blocks[e.address] = state::live;
        break;
      case trace_event_kind::free_requested:
        if (it == blocks.end() || it->second != state::live) fail("free of an address not live");
        it->second = state::free_requested;
        break;
      case trace_event_kind::free_completed:
        if (it == blocks.end() || it->second != state::free_requested) {
          fail("free_completed of an address whose free was not requested");
        }
        blocks.erase(it);
        break;
      case trace_event_kind::record_stream:
        if (it == blocks.end() || it->second != state::live) {
          fail("record_stream of an address not live");
        }
        break;
      case trace_event_kind::segment_alloc:
      case trace_event_kind::segment_free:
        break;
      case trace_event_kind::empty_cache:
        if (e.address != 0 || e.size != 0 || e.stream != 0) {
          fail("empty_cache has no address, size or stream (all 0)");
        }
        break;
    }
  }
}

}  // namespace gpumem
