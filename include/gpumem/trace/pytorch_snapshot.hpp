// gpumem — PyTorch CUDA memory snapshots: the pickles of torch.cuda.memory._dump_snapshot(), read
// as gpumem traces and written from gpumem's own state, with no Python involved.
//
// A snapshot holds the allocator's state when it was taken ('segments', each with its blocks) and
// the events recorded up to then ('device_traces', one list per device, oldest first). Recording
// usually starts after the program has allocated, so the history alone does not say what was
// live at its start: the reader takes the final active blocks and undoes the events from last to
// first, which leaves the blocks live before the first event; they become the trace's initial
// alloc events. Undoing the segment events from the final segments' sizes the same way gives what
// PyTorch had reserved at the start, so a replay can draw PyTorch's reserved-memory curve.
//
// Mapping: alloc, free_requested, free_completed, segment_alloc and segment_free keep their
// names; segment_map / segment_unmap (expandable segments) become segment_alloc / segment_free;
// snapshot markers are dropped. A run of segment frees that is not the allocator's own (an
// out-of-memory retry or a garbage collection, which an oom event follows at once, or new memory
// for a request that none of the freed segments could hold and the device could not hold without
// them) is the program's torch.cuda.empty_cache(): an empty_cache event goes before it, so that a
// replay empties its cache there too. The first oom event becomes the request that failed, at its
// place: an alloc of the requested size at address 0 followed by its free (recorded_oom_event is
// its index), so that a replay tries it; device_memory is then what the allocator could have had,
// PyTorch's reserved memory at that moment plus the device's free memory ('device_free'). Both the
// old schema (blocks without 'address', 'history' instead of 'frames') and the current one are
// read. Frames (stack traces) are not kept.
//
// Writing goes the other way: gpumem's segments (caching_allocator::snapshot()) and a history
// become a snapshot with PyTorch's keys that pytorch.org/memory_viz and torch.cuda._memory_viz
// open (empty frames). A VMM segment (expandable, stitch) is written as the parts of it that hold
// memory (is_expandable, as PyTorch writes expandable segments); a history of
// snapshot_trace_entry events (a replay's) carries segment and oom events as well, so that
// memory_viz, which rebuilds the memory at each event from the final segments, shows the
// allocator's reserved memory at each one. A trace alone (one read from a snapshot) is written with
// its own state at its end as its segments, so that it reads back unchanged.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/error.hpp"
#include "gpumem/trace/detail/pickle.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/trace_input.hpp"

namespace gpumem {

/// One event of a snapshot's device trace as write_pytorch_snapshot writes it, with PyTorch's
/// actions: the block events, what the allocator did with device memory (segment_alloc /
/// segment_free for whole segments, segment_map / segment_unmap for the parts of a VMM range
/// that hold memory) and out-of-memory errors (oom: `address` is the device's free memory,
/// written as 'device_free'; `size` the request). No time: no 'time_us'.
struct snapshot_trace_entry {
  allocator_action action = allocator_action::alloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = no_time;

  friend bool operator==(const snapshot_trace_entry& a, const snapshot_trace_entry& b) noexcept {
    return a.action == b.action && a.address == b.address && a.size == b.size &&
           a.stream == b.stream && a.time_us == b.time_us;
  }
};

namespace detail {

// Where a value sits in the snapshot, for error messages and trace_error's offset. Events are
// named by their index in the device's trace (the offset is that index); everything else by its
// place and the byte offset of its dict in the file.
struct snapshot_place {
  enum class what : std::uint8_t { top, segment, block, event };
  what kind = what::top;
  std::size_t index = 0;  // segment or event index
  std::size_t block = 0;  // block index within the segment
  std::size_t byte = 0;   // byte offset of the dict

  std::string name() const {
    switch (kind) {
      case what::top:
        return fmt::format("top level (byte {})", byte);
      case what::segment:
        return fmt::format("segment {} (byte {})", index, byte);
      case what::block:
        return fmt::format("segment {} block {} (byte {})", index, block, byte);
      case what::event:
        return fmt::format("event {}", index);
    }
    return {};
  }
  std::size_t offset() const noexcept { return kind == what::event ? index : byte; }
};

[[noreturn]] inline void snapshot_fail(const snapshot_place& at, const std::string& what) {
  throw trace_error(fmt::format("PyTorch snapshot: {}: {}", at.name(), what), at.offset());
}

// PyTorch writes each segment, block list, block and event as its own object. One that the memo
// gives twice is refused: walking it again and again would cost time quadratic in the input.
inline void snapshot_unshared(const pickle_value& v, const snapshot_place& at) {
  if (v.shared()) {
    snapshot_fail(at, fmt::format("this {} is also elsewhere in the snapshot (the pickle memo "
                                  "gives it twice); a snapshot's are all distinct",
                                  kind_name(v.type())));
  }
}

inline const pickle_value& snapshot_dict(const pickle_value& v, const snapshot_place& at) {
  if (!v.is_dict()) snapshot_fail(at, fmt::format("a {}, not a dict", kind_name(v.type())));
  snapshot_unshared(v, at);
  return v;
}

inline const pickle_value& snapshot_field(const pickle_value& dict, std::string_view key,
                                          const snapshot_place& at) {
  const pickle_value* v = dict.find(key);
  if (v == nullptr) snapshot_fail(at, fmt::format("no '{}'", key));
  return *v;
}

inline std::int64_t snapshot_int(const pickle_value& v, std::string_view key,
                                 const snapshot_place& at) {
  if (!v.is_int()) {
    snapshot_fail(at, fmt::format("'{}' is a {}, not an int", key, kind_name(v.type())));
  }
  return v.as_int();
}

inline std::uint64_t snapshot_unsigned(const pickle_value& v, std::string_view key,
                                       const snapshot_place& at) {
  const std::int64_t i = snapshot_int(v, key, at);
  if (i < 0) snapshot_fail(at, fmt::format("'{}' is negative ({})", key, i));
  return static_cast<std::uint64_t>(i);
}

inline const std::string& snapshot_str(const pickle_value& v, std::string_view key,
                                       const snapshot_place& at) {
  if (!v.is_str()) {
    snapshot_fail(at, fmt::format("'{}' is a {}, not a str", key, kind_name(v.type())));
  }
  return v.as_str();
}

// Stream ids are opaque integers: the stream's own id where it has one (simulated_stream), the
// handle's value for pointer handles (cudaStream_t, as PyTorch records them), the value itself
// for integers.
template <class Stream>
std::uint64_t snapshot_stream_id(const Stream& s) noexcept {
  if constexpr (std::is_pointer_v<Stream>) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s));
  } else if constexpr (std::is_integral_v<Stream> || std::is_enum_v<Stream>) {
    return static_cast<std::uint64_t>(s);
  } else {
    return static_cast<std::uint64_t>(s.id);
  }
}

// Whether the free segment that `release` gave back could have served `request` in PyTorch's
// allocator: the same stream, the same pool (requests up to 1 MiB come from the small pool, whose
// segments are 2 MiB; larger ones from segments above 2 MiB) and enough bytes.
inline bool snapshot_release_could_serve(const trace_event& release,
                                         const trace_event& request) noexcept {
  constexpr std::uint64_t small_request = std::uint64_t{1} << 20;
  constexpr std::uint64_t small_segment = std::uint64_t{2} << 20;
  if (release.stream != request.stream || release.size < request.size) return false;
  return request.size <= small_request ? release.size == small_segment
                                       : release.size > small_segment;
}

/// The trace of `device` in an unpickled snapshot; see read_pytorch_snapshot.
inline allocation_trace pytorch_snapshot_trace(const pickle_value& root, int device) {
  using place = snapshot_place;
  if (device < 0) {
    throw std::invalid_argument(fmt::format("read_pytorch_snapshot: device {} < 0", device));
  }
  const place top{place::what::top, 0, 0, root.offset()};
  snapshot_dict(root, top);
  const pickle_value& segments = snapshot_field(root, "segments", top);
  if (!segments.is_list()) {
    snapshot_fail(top, fmt::format("'segments' is a {}, not a list", kind_name(segments.type())));
  }

  // The final state: active blocks by address, and the bytes the segments hold.
  static constexpr std::size_t no_origin = static_cast<std::size_t>(-1);
  struct live_block {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    bool pending = false;            // free requested, not completed
    std::size_t origin = no_origin;  // the event whose undoing made it live
  };
  std::unordered_map<std::uint64_t, live_block> live;
  std::uint64_t reserved = 0;
  bool has_segments = false;
  const auto& segs = segments.as_list();
  for (std::size_t si = 0; si < segs.size(); ++si) {
    const pickle_value& seg = segs[si];
    const place at{place::what::segment, si, 0, seg.offset()};
    snapshot_dict(seg, at);
    std::int64_t seg_device = 0;
    if (const pickle_value* d = seg.find("device")) seg_device = snapshot_int(*d, "device", at);
    if (seg_device != device) continue;
    has_segments = true;
    const std::uint64_t address =
        snapshot_unsigned(snapshot_field(seg, "address", at), "address", at);
    const std::uint64_t total =
        snapshot_unsigned(snapshot_field(seg, "total_size", at), "total_size", at);
    std::uint64_t stream = 0;
    if (const pickle_value* s = seg.find("stream")) {
      stream = static_cast<std::uint64_t>(snapshot_int(*s, "stream", at));
    }
    if (total > std::numeric_limits<std::uint64_t>::max() - reserved) {
      snapshot_fail(at, "segment sizes overflow 64 bits");
    }
    reserved += total;
    const pickle_value* blocks = seg.find("blocks");
    if (blocks == nullptr) continue;
    if (!blocks->is_list()) {
      snapshot_fail(at, fmt::format("'blocks' is a {}, not a list", kind_name(blocks->type())));
    }
    snapshot_unshared(*blocks, at);
    std::uint64_t cursor =
        address;  // old snapshots give no block addresses: blocks tile the segment
    const auto& bl = blocks->as_list();
    for (std::size_t bi = 0; bi < bl.size(); ++bi) {
      const pickle_value& b = bl[bi];
      const place bat{place::what::block, si, bi, b.offset()};
      snapshot_dict(b, bat);
      const std::uint64_t size = snapshot_unsigned(snapshot_field(b, "size", bat), "size", bat);
      const std::string& state = snapshot_str(snapshot_field(b, "state", bat), "state", bat);
      std::uint64_t baddr = cursor;
      if (const pickle_value* a = b.find("address")) baddr = snapshot_unsigned(*a, "address", bat);
      if (size > std::numeric_limits<std::uint64_t>::max() - baddr) {
        snapshot_fail(bat, "block ends beyond 64-bit addresses");
      }
      cursor = baddr + size;
      if (state == "inactive") continue;
      const bool pending = state == "active_pending_free";
      if (!pending && state != "active_allocated") {
        snapshot_fail(bat, fmt::format("unknown block state '{}'", state));
      }
      std::uint64_t requested = 0;
      if (const pickle_value* r = b.find("requested_size"); r != nullptr && !r->is_none()) {
        requested = snapshot_unsigned(*r, "requested_size", bat);
      }
      const std::uint64_t live_size = requested > 0 ? requested : size;
      if (live_size == 0) snapshot_fail(bat, "an active block of 0 bytes");
      if (!live.emplace(baddr, live_block{live_size, stream, pending}).second) {
        snapshot_fail(bat, fmt::format("a second active block at 0x{:x}", baddr));
      }
    }
  }

  // This device's events, converted; markers dropped.
  const pickle_value::sequence* events = nullptr;
  if (const pickle_value* traces = root.find("device_traces");
      traces != nullptr && !traces->is_none()) {
    if (!traces->is_list()) {
      snapshot_fail(top,
                    fmt::format("'device_traces' is a {}, not a list", kind_name(traces->type())));
    }
    const auto& per_device = traces->as_list();
    if (static_cast<std::size_t>(device) < per_device.size()) {
      const pickle_value& t = per_device[static_cast<std::size_t>(device)];
      if (!t.is_list()) {
        snapshot_fail(
            top, fmt::format("device_traces[{}] is a {}, not a list", device, kind_name(t.type())));
      }
      events = &t.as_list();
    }
  }
  if (!has_segments && (events == nullptr || events->empty())) {
    throw trace_error(
        fmt::format("PyTorch snapshot: device {} has neither segments nor trace events", device),
        0);
  }

  struct recorded {
    trace_event event;
    std::size_t index;  // in the device's trace
  };
  std::vector<recorded> history;
  if (events != nullptr) history.reserve(events->size());
  // The first out-of-memory: where it happened in `history`, the request, the device's free bytes.
  struct recorded_oom {
    std::size_t at = 0;
    std::size_t index = 0;  // in the device's trace
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::int64_t time_us = no_time;
    std::optional<std::uint64_t> device_free;
  };
  std::optional<recorded_oom> oom;
  std::vector<std::size_t> oom_positions;  // where in `history` each oom event was, first or not
  for (std::size_t ei = 0; events != nullptr && ei < events->size(); ++ei) {
    const pickle_value& e = (*events)[ei];
    const place at{place::what::event, ei, 0, e.offset()};
    snapshot_dict(e, at);
    // One pass over the event's items (the 2 MB recordings have tens of thousands of events).
    const pickle_value* action_v = nullptr;
    const pickle_value* addr_v = nullptr;
    const pickle_value* size_v = nullptr;
    const pickle_value* stream_v = nullptr;
    const pickle_value* time_v = nullptr;
    const pickle_value* free_v = nullptr;
    for (const auto& [k, x] : e.as_dict()) {
      if (!k.is_str()) continue;
      const std::string_view key = k.as_str();
      if (key == std::string_view("action")) {
        action_v = &x;
      } else if (key == std::string_view("addr")) {
        addr_v = &x;
      } else if (key == std::string_view("size")) {
        size_v = &x;
      } else if (key == std::string_view("stream")) {
        stream_v = &x;
      } else if (key == std::string_view("time_us")) {
        time_v = &x;
      } else if (key == std::string_view("device_free")) {
        free_v = &x;
      }
    }
    if (action_v == nullptr) snapshot_fail(at, "no 'action'");
    const std::string& action = snapshot_str(*action_v, "action", at);
    trace_event ev;
    if (action == "alloc") {
      ev.kind = trace_event_kind::alloc;
    } else if (action == "free_requested") {
      ev.kind = trace_event_kind::free_requested;
    } else if (action == "free_completed") {
      ev.kind = trace_event_kind::free_completed;
    } else if (action == "segment_alloc" || action == "segment_map") {
      ev.kind = trace_event_kind::segment_alloc;
    } else if (action == "segment_free" || action == "segment_unmap") {
      ev.kind = trace_event_kind::segment_free;
    } else if (action == "oom") {
      oom_positions.push_back(history.size());
      if (!oom && size_v != nullptr && size_v->is_int() && size_v->as_int() > 0) {
        recorded_oom o;
        o.at = history.size();
        o.index = ei;
        o.size = snapshot_unsigned(*size_v, "size", at);
        if (stream_v != nullptr)
          o.stream = static_cast<std::uint64_t>(snapshot_int(*stream_v, "stream", at));
        if (time_v != nullptr && time_v->is_int() && time_v->as_int() >= 0) {
          o.time_us = time_v->as_int();
        }
        if (free_v != nullptr) o.device_free = snapshot_unsigned(*free_v, "device_free", at);
        oom = o;
      }
      continue;
    } else if (action == "snapshot") {
      continue;
    } else {
      snapshot_fail(at, fmt::format("unknown action '{}'", action));
    }
    if (addr_v == nullptr) snapshot_fail(at, "no 'addr'");
    if (size_v == nullptr) snapshot_fail(at, "no 'size'");
    ev.address = snapshot_unsigned(*addr_v, "addr", at);
    ev.size = snapshot_unsigned(*size_v, "size", at);
    if (stream_v != nullptr)
      ev.stream = static_cast<std::uint64_t>(snapshot_int(*stream_v, "stream", at));
    if (time_v != nullptr && !time_v->is_none()) {
      ev.time_us = snapshot_int(*time_v, "time_us", at);
      if (ev.time_us < 0) snapshot_fail(at, fmt::format("'time_us' is negative ({})", ev.time_us));
    }
    if (ev.kind == trace_event_kind::alloc && ev.size == 0) {
      snapshot_fail(at, "an alloc of 0 bytes");
    }
    history.push_back(recorded{ev, ei});
  }

  // Undo the history, last event first.
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    const trace_event& ev = it->event;
    const place at{place::what::event, it->index, 0, 0};
    switch (ev.kind) {
      case trace_event_kind::alloc: {
        const auto f = live.find(ev.address);
        if (f == live.end()) {
          snapshot_fail(at, fmt::format("alloc of 0x{:x}, which is not live afterwards (neither "
                                        "active in the final segments nor freed later)",
                                        ev.address));
        }
        if (f->second.pending) {
          snapshot_fail(at, f->second.origin == no_origin
                                ? fmt::format("alloc of 0x{:x}, which the final segments show "
                                              "pending a free that no free_requested asked for",
                                              ev.address)
                                : fmt::format("alloc of 0x{:x}, which event {} frees "
                                              "(free_completed) with no free_requested before",
                                              ev.address, f->second.origin));
        }
        live.erase(f);
        break;
      }
      case trace_event_kind::free_requested: {
        const auto f = live.find(ev.address);
        if (f == live.end() || !f->second.pending) {
          snapshot_fail(at,
                        fmt::format("free_requested of 0x{:x}, which is not waiting for its free "
                                    "afterwards (no later free_completed, not pending in the "
                                    "final segments)",
                                    ev.address));
        }
        f->second = live_block{ev.size > 0 ? ev.size : f->second.size, ev.stream, false, it->index};
        break;
      }
      case trace_event_kind::free_completed: {
        if (live.count(ev.address) != 0) {
          snapshot_fail(at, fmt::format("free_completed of 0x{:x}, which is live again afterwards "
                                        "with no alloc",
                                        ev.address));
        }
        live.emplace(ev.address, live_block{ev.size, ev.stream, true, it->index});
        break;
      }
      case trace_event_kind::segment_alloc:
        if (ev.size > reserved) {
          snapshot_fail(at, fmt::format("segment_alloc of {} bytes, more than the final segments "
                                        "and the later segment events hold ({})",
                                        ev.size, reserved));
        }
        reserved -= ev.size;
        break;
      case trace_event_kind::segment_free:
        if (ev.size > std::numeric_limits<std::uint64_t>::max() - reserved) {
          snapshot_fail(at, "segment sizes overflow 64 bits");
        }
        reserved += ev.size;
        break;
      case trace_event_kind::record_stream:
      case trace_event_kind::empty_cache:
        break;  // never produced above
    }
  }

  // The blocks live before the first event, in address order. A block whose free was already
  // requested then (its free_completed is in the history, or it is still pending at the end) is
  // allocated and then freed by a free_requested placed right after the initial events, so that
  // its free_completed, if any, follows a free_requested as the trace rules want.
  std::vector<std::pair<std::uint64_t, live_block>> initial(live.begin(), live.end());
  std::sort(initial.begin(), initial.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  allocation_trace trace;
  trace.events.reserve(2 * initial.size() + history.size());
  for (const auto& [address, b] : initial) {
    if (b.size == 0) {
      snapshot_fail(place{place::what::event, b.origin, 0, 0},
                    fmt::format("0x{:x} was live before recording began, with an unknown size "
                                "(its free gives 0 bytes)",
                                address));
    }
    trace.events.push_back(
        trace_event{trace_event_kind::alloc, address, b.size, b.stream, no_time});
  }
  trace.initial_events = trace.events.size();
  for (const auto& [address, b] : initial) {
    if (b.pending) {
      trace.events.push_back(
          trace_event{trace_event_kind::free_requested, address, b.size, b.stream, no_time});
    }
  }
  // The allocator's settings: its configuration, and whether it collects garbage
  // (garbage_collection_threshold, in the configuration or as a setting of its own above 0).
  bool collects_garbage = false;
  if (const pickle_value* settings = root.find("allocator_settings");
      settings != nullptr && settings->is_dict()) {
    if (const pickle_value* conf = settings->find("PYTORCH_CUDA_ALLOC_CONF");
        conf != nullptr && conf->is_str()) {
      trace.recorded_config = conf->as_str();
      collects_garbage =
          trace.recorded_config.find("garbage_collection_threshold") != std::string::npos;
    }
    if (const pickle_value* gc = settings->find("garbage_collection_threshold"); gc != nullptr) {
      collects_garbage = collects_garbage || (gc->is_float() && gc->as_float() > 0) ||
                         (gc->is_int() && gc->as_int() > 0);
    }
  }

  // The program's empty_cache calls. PyTorch's allocator gives memory back on its own only inside
  // a malloc that found no cached block to fit, right before it asks the device again: its
  // out-of-memory retry (cudaMalloc failed: cached segments released, then cudaMalloc again, or
  // the oom event when that fails too) and its garbage collection (garbage_collection_threshold).
  // So a run of segment frees (segment_free / segment_unmap, no oom event between them) is the
  // allocator's own when an oom event follows it, or when a segment_alloc / segment_map follows
  // it for an alloc that none of the freed segments could have held, and (unless the allocator
  // collects garbage) that the device could not have held without them: what was reserved before
  // the run plus the new memory exceeds all the allocator ever held and, where an oom event says
  // it, what it could have had then. Any other run is an empty_cache, which releases every free
  // cached segment at once: one empty_cache event, before the run.
  std::vector<bool> oom_before(history.size() + 1, false);  // an oom event right before event k
  for (const std::size_t k : oom_positions) oom_before[k] = true;
  const auto is_release = [&history](std::size_t k) {
    return history[k].event.kind == trace_event_kind::segment_free;
  };
  std::uint64_t capacity = reserved;  // the most the allocator held or could have had
  {
    std::uint64_t level = reserved;
    for (std::size_t k = 0; k <= history.size(); ++k) {
      if (oom && oom->at == k && oom->device_free) {
        if (*oom->device_free > std::numeric_limits<std::uint64_t>::max() - level) {
          snapshot_fail(place{place::what::event, oom->index, 0, 0},
                        "'device_free' and the reserved memory overflow 64 bits");
        }
        capacity = std::max(capacity, level + *oom->device_free);
      }
      if (k == history.size()) break;
      const trace_event& ev = history[k].event;
      if (ev.kind == trace_event_kind::segment_alloc)
        level += ev.size;  // undone above: no overflow
      if (ev.kind == trace_event_kind::segment_free) level -= std::min(level, ev.size);
      capacity = std::max(capacity, level);
    }
  }
  // Whether the run of releases [k, end), before which `before` bytes were reserved, is the
  // allocator's own.
  const auto allocators_own = [&](std::size_t k, std::size_t end, std::uint64_t before) {
    if (oom_before[end]) return true;
    std::uint64_t taken = 0;  // the new memory
    std::size_t m = end;
    while (m < history.size() && history[m].event.kind == trace_event_kind::segment_alloc &&
           !oom_before[m]) {
      taken =
          std::min(taken + history[m].event.size, std::numeric_limits<std::uint64_t>::max() / 2);
      ++m;
    }
    if (m == end) return false;  // no new memory follows
    if (m == history.size() || oom_before[m] || history[m].event.kind != trace_event_kind::alloc) {
      return true;  // new memory for no allocation: not the program's
    }
    for (std::size_t r = k; r < end; ++r) {
      if (snapshot_release_could_serve(history[r].event, history[m].event)) return false;
    }
    return collects_garbage || taken > capacity - std::min(before, capacity);
  };

  // The request that failed, where it failed (address 0 is never a block's), then its free: a
  // replay tries it there. What the allocator could have had: its reserved memory then (after the
  // segments its out-of-memory path freed) and what the device had free.
  std::uint64_t reserved_then = reserved;
  for (std::size_t k = 0; k <= history.size(); ++k) {
    if (oom && oom->at == k) {
      trace.recorded_oom_event = trace.events.size();
      trace.events.push_back(
          trace_event{trace_event_kind::alloc, 0, oom->size, oom->stream, oom->time_us});
      trace.events.push_back(
          trace_event{trace_event_kind::free_requested, 0, oom->size, oom->stream, oom->time_us});
      trace.events.push_back(
          trace_event{trace_event_kind::free_completed, 0, oom->size, oom->stream, oom->time_us});
      if (oom->device_free) trace.device_memory = reserved_then + *oom->device_free;
    }
    if (k == history.size()) break;
    const trace_event& ev = history[k].event;
    if (is_release(k) && (k == 0 || !is_release(k - 1) || oom_before[k])) {
      std::size_t end = k + 1;
      while (end < history.size() && is_release(end) && !oom_before[end]) ++end;
      if (!allocators_own(k, end, reserved_then)) {
        trace.events.push_back(trace_event{trace_event_kind::empty_cache, 0, 0, 0, ev.time_us});
      }
    }
    if (ev.kind == trace_event_kind::segment_alloc) reserved_then += ev.size;
    if (ev.kind == trace_event_kind::segment_free)
      reserved_then -= std::min(reserved_then, ev.size);
    trace.events.push_back(ev);
  }

  trace.source = "pytorch-snapshot";
  trace.recorded_initial_reserved = reserved;
  return trace;
}

/// read_pytorch_snapshot from the bytes of a whole file (trace_io.hpp's entry point).
inline allocation_trace read_pytorch_snapshot_bytes(std::string_view bytes, int device) {
  return pytorch_snapshot_trace(unpickle(bytes), device);
}

inline pickle_value snapshot_int_value(std::uint64_t v, const char* what) {
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw std::invalid_argument(
        fmt::format("write_pytorch_snapshot: {} {} does not fit a snapshot's 64-bit int", what, v));
  }
  return pickle_value(static_cast<std::int64_t>(v));
}

constexpr std::string_view snapshot_state_name(block_state s) noexcept {
  switch (s) {
    case block_state::active_allocated:
      return "active_allocated";
    case block_state::active_pending_free:
      return "active_pending_free";
    case block_state::inactive:
      return "inactive";
  }
  return "inactive";
}

/// The 'segments' of a snapshot: one dict per part of memory a segment holds (the whole segment
/// when classic; each of its reserved_ranges when it is a VMM range, is_expandable as PyTorch
/// writes expandable segments), with the blocks in it; free blocks are cut at the part's edges.
template <class Stream>
pickle_value::sequence pytorch_snapshot_segments(
    const std::vector<segment_snapshot<Stream>>& segments, int device) {
  using dict = pickle_value::dict_items;
  using seq = pickle_value::sequence;
  seq segs;
  segs.reserve(segments.size());
  for (const segment_snapshot<Stream>& s : segments) {
    // A live block outside every part would not be written at all: the snapshot would lose it
    // (and a reader its alloc), so it is refused.
    std::optional<block_snapshot> stray;
    const std::vector<segment_part> parts = segment_parts(s, &stray);
    if (stray) {
      throw std::invalid_argument(
          fmt::format("write_pytorch_snapshot: the {} block at 0x{:x} ({} bytes) is not inside {}",
                      snapshot_state_name(stray->state), stray->address, stray->size,
                      s.is_expandable ? "one reserved range of its segment" : "its segment"));
    }
    for (const segment_part& part : parts) {
      seq blocks;
      std::uint64_t allocated = 0;
      std::uint64_t active = 0;
      std::uint64_t requested = 0;
      for (const block_snapshot& b : part.blocks) {
        const bool live = b.state != block_state::inactive;
        if (b.state == block_state::active_allocated) allocated += b.size;
        if (live) {
          active += b.size;
          requested += b.requested_size;
        }
        blocks.push_back(pickle_value::make_dict(dict{
            {"address", snapshot_int_value(b.address, "block address")},
            {"size", snapshot_int_value(b.size, "block size")},
            {"requested_size", snapshot_int_value(b.requested_size, "block requested_size")},
            {"state", pickle_value(snapshot_state_name(b.state))},
            {"frames", pickle_value::make_list()},
        }));
      }
      segs.push_back(pickle_value::make_dict(dict{
          {"device", pickle_value(device)},
          {"address", snapshot_int_value(part.address, "segment address")},
          {"total_size", snapshot_int_value(part.size, "segment total_size")},
          {"allocated_size", snapshot_int_value(allocated, "segment allocated_size")},
          {"active_size", snapshot_int_value(active, "segment active_size")},
          {"requested_size", snapshot_int_value(requested, "segment requested_size")},
          {"stream", pickle_value(static_cast<std::int64_t>(snapshot_stream_id(s.stream)))},
          {"segment_type", pickle_value(s.is_small ? "small" : "large")},
          {"segment_pool_id", pickle_value::make_tuple(seq{pickle_value(0), pickle_value(0)})},
          {"is_expandable", pickle_value(s.is_expandable)},
          {"frames", pickle_value::make_list()},
          {"blocks", pickle_value::make_list(std::move(blocks))},
      }));
    }
  }
  return segs;
}

/// The whole snapshot: segments, one device trace (earlier devices' are empty), settings.
inline pickle_value pytorch_snapshot_dict(pickle_value::sequence segs,
                                          pickle_value::sequence events,
                                          const std::string& allocator_settings, int device) {
  using dict = pickle_value::dict_items;
  using seq = pickle_value::sequence;
  seq traces;
  for (int d = 0; d < device; ++d) traces.push_back(pickle_value::make_list());
  traces.push_back(pickle_value::make_list(std::move(events)));
  return pickle_value::make_dict(dict{
      {"segments", pickle_value::make_list(std::move(segs))},
      {"device_traces", pickle_value::make_list(std::move(traces))},
      {"allocator_settings",
       pickle_value::make_dict(dict{{"PYTORCH_CUDA_ALLOC_CONF", allocator_settings}})},
  });
}

/// Stream ids are opaque: a handle above INT64_MAX is stored as the int64 of the same bits.
inline pickle_value snapshot_stream_value(std::uint64_t id) {
  return pickle_value(static_cast<std::int64_t>(id));
}

/// One trace event as a snapshot's trace entry (no frames: a replay has no stack).
inline pickle_value snapshot_event_value(const trace_event& ev) {
  pickle_value::dict_items e{
      {"action", pickle_value(to_string(ev.kind))},
      {"addr", snapshot_int_value(ev.address, "event address")},
      {"size", snapshot_int_value(ev.size, "event size")},
      {"stream", snapshot_stream_value(ev.stream)},
  };
  if (ev.time_us != no_time) e.emplace_back("time_us", pickle_value(ev.time_us));
  e.emplace_back("frames", pickle_value::make_list());
  return pickle_value::make_dict(std::move(e));
}

/// The snapshot written by write_pytorch_snapshot, as a value.
template <class Stream>
pickle_value pytorch_snapshot_value(const std::vector<segment_snapshot<Stream>>& segments,
                                    const allocation_trace& history, int device) {
  if (device < 0) {
    throw std::invalid_argument(fmt::format("write_pytorch_snapshot: device {} < 0", device));
  }
  if (history.initial_events > history.events.size()) {
    throw std::invalid_argument("write_pytorch_snapshot: initial_events exceeds the event count");
  }
  pickle_value::sequence events;
  events.reserve(history.events.size() - history.initial_events);
  for (std::size_t i = history.initial_events; i < history.events.size(); ++i) {
    const trace_event& ev = history.events[i];
    // PyTorch's traces have no such events (an empty_cache shows as the segment frees it makes).
    if (ev.kind == trace_event_kind::record_stream || ev.kind == trace_event_kind::empty_cache) {
      continue;
    }
    events.push_back(snapshot_event_value(ev));
  }
  return pytorch_snapshot_dict(pytorch_snapshot_segments(segments, device), std::move(events),
                               history.recorded_config, device);
}

/// A trace's state at its end, what write_pytorch_snapshot(out, trace) writes as its segments: the
/// blocks live then (address order; the size and stream of their alloc; pending when their free
/// was requested and has not completed) and the bytes reserved then. The reserved bytes start from
/// recorded_initial_reserved and follow the segment events; a trace without
/// recorded_initial_reserved starts from the least that keeps them from going below 0 and covers
/// the blocks live at the end.
struct snapshot_end_state {
  struct live_block {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    bool pending = false;
  };
  std::vector<live_block> live;
  std::uint64_t live_bytes = 0;  // may exceed `reserved` for a trace no allocator recorded
  std::uint64_t reserved = 0;
  std::uint64_t initial_reserved = 0;
};

/// Throws std::invalid_argument when the reserved bytes would go below 0 or past 64 bits.
inline snapshot_end_state pytorch_snapshot_end_state(const allocation_trace& trace) {
  std::unordered_map<std::uint64_t, std::size_t> index;  // address -> position in `blocks`
  std::vector<snapshot_end_state::live_block> blocks;
  // Reserved bytes relative to the start: their lowest point and their end.
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t up = 0;       // bytes segment_alloc added
  std::uint64_t down = 0;     // bytes segment_free took
  std::uint64_t deepest = 0;  // the most `down - up` ever was
  for (const trace_event& e : trace.events) {
    switch (e.kind) {
      case trace_event_kind::alloc:
        index[e.address] = blocks.size();
        blocks.push_back({e.address, e.size, e.stream, false});
        break;
      case trace_event_kind::free_requested:
        if (const auto f = index.find(e.address); f != index.end())
          blocks[f->second].pending = true;
        break;
      case trace_event_kind::free_completed:
        if (const auto f = index.find(e.address); f != index.end()) {
          blocks[f->second].size = 0;  // gone
          index.erase(f);
        }
        break;
      case trace_event_kind::segment_alloc:
        if (e.size > max - up) {
          throw std::invalid_argument("write_pytorch_snapshot: segment sizes overflow 64 bits");
        }
        up += e.size;
        break;
      case trace_event_kind::segment_free:
        if (e.size > max - down) {
          throw std::invalid_argument("write_pytorch_snapshot: segment sizes overflow 64 bits");
        }
        down += e.size;
        if (down > up) deepest = std::max(deepest, down - up);
        break;
      case trace_event_kind::record_stream:
      case trace_event_kind::empty_cache:
        break;
    }
  }
  snapshot_end_state st;
  for (const auto& [address, i] : index) st.live.push_back(blocks[i]);
  std::sort(st.live.begin(), st.live.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  for (const auto& b : st.live) {
    if (b.size > max - st.live_bytes) {
      throw std::invalid_argument("write_pytorch_snapshot: live block sizes overflow 64 bits");
    }
    st.live_bytes += b.size;
  }
  if (trace.recorded_initial_reserved) {
    st.initial_reserved = *trace.recorded_initial_reserved;
    if (deepest > st.initial_reserved) {
      throw std::invalid_argument(fmt::format(
          "write_pytorch_snapshot: the segment frees take {} bytes more than the trace had "
          "reserved (recorded_initial_reserved {})",
          deepest - st.initial_reserved, st.initial_reserved));
    }
  } else {
    // At least `deepest`, and enough that the end holds the live blocks.
    std::uint64_t need = 0;
    if (up >= down) {
      need = st.live_bytes > up - down ? st.live_bytes - (up - down) : 0;
    } else if (st.live_bytes > max - (down - up)) {
      throw std::invalid_argument("write_pytorch_snapshot: segment sizes overflow 64 bits");
    } else {
      need = st.live_bytes + (down - up);
    }
    st.initial_reserved = std::max(deepest, need);
  }
  if (up > max - st.initial_reserved) {
    throw std::invalid_argument("write_pytorch_snapshot: segment sizes overflow 64 bits");
  }
  st.reserved = st.initial_reserved + up - down;
  return st;
}

/// The snapshot written by write_pytorch_snapshot from a trace alone, as a value.
inline pickle_value pytorch_snapshot_value(const allocation_trace& trace, int device) {
  if (device < 0) {
    throw std::invalid_argument(fmt::format("write_pytorch_snapshot: device {} < 0", device));
  }
  validate_trace(trace);
  const snapshot_end_state st = pytorch_snapshot_end_state(trace);
  if (st.live_bytes > st.reserved) {
    throw std::invalid_argument(
        fmt::format("write_pytorch_snapshot: the blocks live at the end of the trace hold {} "
                    "bytes, more than it had reserved then ({})",
                    st.live_bytes, st.reserved));
  }
  // One segment per live block, just its size; the rest of the reserved bytes in free segments at
  // address 0 (the trace does not say where they were), at most INT64_MAX bytes each.
  std::vector<segment_snapshot<std::uint64_t>> segments;
  for (const auto& b : st.live) {
    segment_snapshot<std::uint64_t> s;
    s.address = static_cast<std::uintptr_t>(b.address);
    s.total_size = static_cast<std::size_t>(b.size);
    s.stream = b.stream;
    s.blocks.push_back(block_snapshot{
        static_cast<std::uintptr_t>(b.address), static_cast<std::size_t>(b.size),
        static_cast<std::size_t>(b.size),
        b.pending ? block_state::active_pending_free : block_state::active_allocated});
    segments.push_back(std::move(s));
  }
  constexpr std::uint64_t piece =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::uint64_t rest = st.reserved - st.live_bytes; rest > 0 || segments.empty();) {
    segment_snapshot<std::uint64_t> held;
    held.total_size = static_cast<std::size_t>(std::min(rest, piece));
    if (held.total_size > 0) {
      held.blocks.push_back(block_snapshot{0, held.total_size, 0, block_state::inactive});
    }
    rest -= held.total_size;
    segments.push_back(std::move(held));
  }

  // The events after the initial ones; the recorded out-of-memory (an alloc at address 0 and its
  // free, as the reader makes it) goes back to an oom event, with the device's free memory then.
  using dict = pickle_value::dict_items;
  using seq = pickle_value::sequence;
  seq events;
  events.reserve(trace.events.size() - trace.initial_events);
  std::uint64_t reserved = st.initial_reserved;
  for (std::size_t i = trace.initial_events; i < trace.events.size(); ++i) {
    const trace_event& ev = trace.events[i];
    if (trace.recorded_oom_event == i && i + 2 < trace.events.size() &&
        ev.kind == trace_event_kind::alloc && ev.address == 0 &&
        trace.events[i + 1].kind == trace_event_kind::free_requested &&
        trace.events[i + 1].address == 0 &&
        trace.events[i + 2].kind == trace_event_kind::free_completed &&
        trace.events[i + 2].address == 0) {
      dict e{{"action", pickle_value("oom")}};
      if (trace.device_memory && *trace.device_memory >= reserved) {
        e.emplace_back("device_free",
                       snapshot_int_value(*trace.device_memory - reserved, "device_free"));
      }
      e.emplace_back("size", snapshot_int_value(ev.size, "event size"));
      e.emplace_back("stream", snapshot_stream_value(ev.stream));
      if (ev.time_us != no_time) e.emplace_back("time_us", pickle_value(ev.time_us));
      e.emplace_back("frames", pickle_value::make_list());
      events.push_back(pickle_value::make_dict(std::move(e)));
      i += 2;
      continue;
    }
    if (ev.kind == trace_event_kind::segment_alloc) reserved += ev.size;
    if (ev.kind == trace_event_kind::segment_free) reserved -= ev.size;
    // PyTorch's traces have no such events (an empty_cache shows as the segment frees it makes).
    if (ev.kind == trace_event_kind::record_stream || ev.kind == trace_event_kind::empty_cache) {
      continue;
    }
    events.push_back(snapshot_event_value(ev));
  }
  return pytorch_snapshot_dict(pytorch_snapshot_segments(segments, device), std::move(events),
                               trace.recorded_config, device);
}

/// The snapshot written by write_pytorch_snapshot from snapshot_trace_entry events, as a value.
template <class Stream>
pickle_value pytorch_snapshot_value(const std::vector<segment_snapshot<Stream>>& segments,
                                    const std::vector<snapshot_trace_entry>& trace,
                                    const std::string& allocator_settings, int device) {
  if (device < 0) {
    throw std::invalid_argument(fmt::format("write_pytorch_snapshot: device {} < 0", device));
  }
  using dict = pickle_value::dict_items;
  using seq = pickle_value::sequence;
  seq events;
  events.reserve(trace.size());
  for (const snapshot_trace_entry& ev : trace) {
    const bool oom = ev.action == allocator_action::oom;
    dict e{
        {"action", pickle_value(gpumem::to_string(ev.action))},
        {oom ? "device_free" : "addr", snapshot_int_value(ev.address, "event address")},
        {"size", snapshot_int_value(ev.size, "event size")},
        {"stream", pickle_value(static_cast<std::int64_t>(ev.stream))},
    };
    if (ev.time_us != no_time) e.emplace_back("time_us", pickle_value(ev.time_us));
    e.emplace_back("frames", pickle_value::make_list());
    events.push_back(pickle_value::make_dict(std::move(e)));
  }
  return pytorch_snapshot_dict(pytorch_snapshot_segments(segments, device), std::move(events),
                               allocator_settings, device);
}

}  // namespace detail

/// Reads the trace of `device` from the snapshot pickle in `bytes` (a whole file's contents).
///
/// The first `initial_events` events are allocs of the blocks live before recording began
/// (requested sizes, address order, their segment's stream, no time); blocks whose free was
/// already requested then get a free_requested right after them. Then come the recorded events,
/// oldest first, with an empty_cache event (address, size and stream 0; the time of the first
/// release) before each run of consecutive segment_free / segment_unmap events (no oom event
/// between them) that is the program's empty_cache: any run but those that an oom event follows,
/// or a segment_alloc / segment_map for an alloc that none of the freed segments could have held
/// (same stream, same pool, enough bytes) and, unless the allocator collects garbage
/// (garbage_collection_threshold in allocator_settings), that the device could not have held
/// without them (what was reserved before the run plus the new memory exceeds the most the
/// recording ever reserved and what an oom event says it could have had). Those are PyTorch's own
/// out-of-memory retries and garbage collection, inside a malloc that found no cached block to
/// fit; an empty_cache called right before such an allocation looks the same, and is taken for
/// one.
/// `recorded_initial_reserved` is what PyTorch held from the device before the first event;
/// `recorded_config` is allocator_settings' PYTORCH_CUDA_ALLOC_CONF ("" when absent); `source` is
/// "pytorch-snapshot". The result passes the trace validity rules of docs/trace_format.md.
///
/// Throws trace_error when the bytes are not a pickle of the supported subset (offset: the byte),
/// when the structure is not a snapshot's (offset: the byte of the enclosing dict, named in the
/// message), or when an event contradicts the state (unknown action, a free of a block that is
/// not live, an alloc of a live one, ...: "event N" in the message, offset N, counted in the
/// device's list of events); also when the device has neither segments nor events.
/// std::invalid_argument for device < 0. Thread-safe (no shared state).
inline allocation_trace read_pytorch_snapshot(const std::vector<char>& bytes, int device = 0) {
  return detail::read_pytorch_snapshot_bytes(std::string_view(bytes.data(), bytes.size()), device);
}

/// As above, from the rest of `in` (opened in binary mode), at most max_trace_bytes. Throws
/// std::system_error (std::io_errc::stream) when the stream fails; input that does not start as
/// a pickle is refused after its first bytes.
inline allocation_trace read_pytorch_snapshot(std::istream& in, int device = 0) {
  return detail::read_pytorch_snapshot_bytes(
      detail::read_trace_bytes(in, "", trace_format::pytorch_snapshot), device);
}

/// As above, from the file at `path`; trace_error messages start with the path. Throws
/// std::system_error when the file cannot be opened or read (as the other trace readers do).
inline allocation_trace read_pytorch_snapshot(const std::string& path, int device = 0) {
  const std::string bytes = detail::read_trace_file(path, trace_format::pytorch_snapshot);
  try {
    return detail::read_pytorch_snapshot_bytes(bytes, device);
  } catch (const trace_error& e) {
    throw trace_error(fmt::format("{}: {}", path, e.what()), e.offset());
  }
}

/// The devices a snapshot pickle (a whole file's bytes) holds data for: those of its segments and
/// those whose device trace has events, in increasing order. Throws trace_error when the bytes are
/// not a pickle of the supported subset or have no 'segments' list.
inline std::vector<int> pytorch_snapshot_devices(std::string_view bytes) {
  const detail::pickle_value root = detail::unpickle(bytes);
  std::vector<int> devices;
  const detail::pickle_value* segments = root.is_dict() ? root.find("segments") : nullptr;
  if (segments == nullptr || !segments->is_list()) {
    throw trace_error("PyTorch snapshot: no 'segments' list", 0);
  }
  for (const detail::pickle_value& seg : segments->as_list()) {
    const detail::pickle_value* d = seg.is_dict() ? seg.find("device") : nullptr;
    const std::int64_t device = d != nullptr && d->is_int() ? d->as_int() : 0;
    if (device >= 0 && device <= std::numeric_limits<int>::max()) {
      devices.push_back(static_cast<int>(device));
    }
  }
  if (const detail::pickle_value* traces = root.find("device_traces");
      traces != nullptr && traces->is_list()) {
    const auto& list = traces->as_list();
    for (std::size_t d = 0; d < list.size() && d <= std::numeric_limits<int>::max(); ++d) {
      if (list[d].is_list() && !list[d].as_list().empty()) devices.push_back(static_cast<int>(d));
    }
  }
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  return devices;
}

/// Writes a snapshot pickle (protocol 4) of `segments` (caching_allocator::snapshot(), the state
/// at the end of `history`) and `history`'s events after its initial ones, for `device` (earlier
/// devices get empty traces). pytorch.org/memory_viz opens it; read_pytorch_snapshot reads it
/// back into `history`'s events, record_stream events excepted (PyTorch's traces have none), with
/// the initial events rebuilt from `segments`. empty_cache events are not written: the reader
/// derives them again from the segment frees that follow them, where the history has those. Frames
/// are empty; events without a time have no 'time_us'; allocator_settings holds
/// history.recorded_config as PYTORCH_CUDA_ALLOC_CONF.
///
/// Stream ids: `.id` of the stream type when it has one, else the handle's value. Throws
/// std::invalid_argument for device < 0, initial_events beyond the events, an address or size
/// above INT64_MAX, or a recorded_config that is not UTF-8. Stream failures show in out's state.
template <class Stream>
void write_pytorch_snapshot(std::ostream& out,
                            const std::vector<segment_snapshot<Stream>>& segments,
                            const allocation_trace& history, int device = 0) {
  detail::pickle_dump(out, detail::pytorch_snapshot_value(segments, history, device), 4);
}

/// Writes `trace` alone as a snapshot pickle (protocol 4) that read_pytorch_snapshot reads back
/// into the same trace: the write-back of a trace read from a snapshot (PyTorch's or
/// gpumem-replay's export). Its segments are the trace's own state at its end
/// (detail::pytorch_snapshot_end_state): one segment per block live then, its alloc's size, stream
/// and state (active_allocated, or active_pending_free when its free was requested and has not
/// completed), and free segments at address 0 holding the rest of what the trace had reserved then,
/// so that the reader rebuilds the same initial events and recorded_initial_reserved. The events
/// are those after the initial ones (record_stream and empty_cache left out, as above: the reader
/// derives the empty_cache events again from the segment frees); the
/// recorded out-of-memory (recorded_oom_event: an alloc at address 0 and its free) is written back
/// as an oom event whose device_free is device_memory less what was reserved then.
///
/// The round trip is exact for a trace that read_pytorch_snapshot gave (of any device; written for
/// `device`). Other traces read
/// back with what they lack filled in: a trace without recorded_initial_reserved gets the least
/// reserved memory consistent with its segment events and its blocks live at the end;
/// device_memory survives only as an oom event's device_free; record_stream events are dropped.
/// Throws trace_error for a trace that breaks the validity rules (validate_trace);
/// std::invalid_argument for device < 0, an address or size above INT64_MAX, segment frees beyond
/// recorded_initial_reserved, or blocks live at the end that hold more than the trace reserved.
inline void write_pytorch_snapshot(std::ostream& out, const allocation_trace& trace,
                                   int device = 0) {
  detail::pickle_dump(out, detail::pytorch_snapshot_value(trace, device), 4);
}

/// As above, with the events of `trace` (snapshot_trace_entry: segment and oom events as well,
/// what a replay records with replay_options::record_history) and `allocator_settings` as
/// PYTORCH_CUDA_ALLOC_CONF. Segments are written as the parts of memory that reserved memory
/// counts (segment_snapshot::reserved_ranges), so that memory_viz, which rebuilds the memory at
/// each event from the final segments by undoing the events, shows the allocator's reserved
/// memory. Throws std::invalid_argument as above, and when a live block is not inside one of its
/// segment's reserved ranges.
template <class Stream>
void write_pytorch_snapshot(std::ostream& out,
                            const std::vector<segment_snapshot<Stream>>& segments,
                            const std::vector<snapshot_trace_entry>& trace,
                            const std::string& allocator_settings, int device = 0) {
  detail::pickle_dump(
      out, detail::pytorch_snapshot_value(segments, trace, allocator_settings, device), 4);
}

}  // namespace gpumem
