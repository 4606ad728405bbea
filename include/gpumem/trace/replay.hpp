// gpumem — replaying an allocation trace against an allocator on a simulated GPU.
//
// A replay answers, for one trace, one device size and one allocator configuration: does the
// program run out of memory, where and why, how much memory does the allocator hold at its peak,
// and how many (simulated) driver calls does it make. Memory figures are exact and repeatable;
// simulated time comes from the device's cost model.
//
// compile_trace() first turns the trace into dense operations (recorded addresses become slot
// numbers, free_requested/free_completed pairs become "release" and "free"), so that the replay
// loop does no hashing: it is the allocator's speed that a replay measures.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"

namespace gpumem {

/// A trace prepared for replay. Built by compile_trace; one op per trace event, same index.
struct compiled_trace {
  enum class op_kind : std::uint8_t {
    alloc,          ///< allocate `size` on `stream` into `slot`; requested += size
    release,        ///< the program released `slot` (requested -= size); the block stays busy
    free,           ///< return `slot` to the allocator (its release came earlier)
    release_free,   ///< both at once
    record_stream,  ///< `slot` is also used on `stream`
    none,           ///< nothing to do (reference events)
  };
  struct op {
    op_kind kind = op_kind::none;
    std::uint32_t stream = 0;  ///< dense stream index (0: the trace's stream 0)
    std::uint32_t slot = 0;
    std::uint64_t size = 0;  ///< requested bytes of the slot's allocation
  };

  std::vector<op> ops;
  std::size_t initial_events = 0;
  std::size_t allocations = 0;            ///< slots: one per alloc event
  std::vector<std::uint64_t> stream_ids;  ///< dense index → the trace's stream id (0 first)
  std::uint64_t peak_requested = 0;       ///< the program's peak live requested bytes
  std::size_t peak_requested_event = 0;   ///< the event index where it was reached
  /// What the recording allocator held from the device at its peak (from its segment events).
  std::optional<std::uint64_t> recorded_peak_reserved;
  std::size_t recorded_segment_allocs = 0;
  std::size_t recorded_segment_frees = 0;
  std::optional<std::size_t> recorded_oom_event;
};

/// Validates `trace` (validate_trace) and prepares it for replay. Throws trace_error, also when
/// the live requested bytes or the recorded reserved bytes would pass 2^64 (offset: the event).
inline compiled_trace compile_trace(const allocation_trace& trace) {
  validate_trace(trace);
  using op_kind = compiled_trace::op_kind;
  compiled_trace out;
  out.ops.resize(trace.events.size());
  out.initial_events = trace.initial_events;
  out.recorded_oom_event = trace.recorded_oom_event;
  out.stream_ids.push_back(0);
  std::unordered_map<std::uint64_t, std::uint32_t> stream_index{{0, 0}};
  struct live_block {
    std::uint32_t slot;
    std::uint64_t size;
    std::size_t release_op;  // index of its free_requested, or SIZE_MAX while live
  };
  std::unordered_map<std::uint64_t, live_block> live;
  live.reserve(1024);
  auto stream_of = [&](std::uint64_t id) {
    auto [it, inserted] =
        stream_index.emplace(id, static_cast<std::uint32_t>(out.stream_ids.size()));
    if (inserted) out.stream_ids.push_back(id);
    return it->second;
  };
  constexpr std::size_t not_released = static_cast<std::size_t>(-1);
  std::uint64_t requested = 0;
  std::optional<std::uint64_t> reserved = trace.recorded_initial_reserved;
  std::uint64_t recorded_peak = reserved.value_or(0);
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const trace_event& e = trace.events[i];
    compiled_trace::op& o = out.ops[i];
    switch (e.kind) {
      case trace_event_kind::alloc: {
        if (out.allocations >= UINT32_MAX)
          throw trace_error("trace: more than 2^32 allocations", i);
        o.kind = op_kind::alloc;
        o.slot = static_cast<std::uint32_t>(out.allocations++);
        o.size = e.size;
        o.stream = stream_of(e.stream);
        live[e.address] = live_block{o.slot, e.size, not_released};  // a pending block is done
        if (e.size > UINT64_MAX - requested) {
          throw trace_error(fmt::format("trace: event {}: the live requested bytes pass 2^64", i),
                            i);
        }
        requested += e.size;
        if (requested > out.peak_requested) {
          out.peak_requested = requested;
          out.peak_requested_event = i;
        }
        break;
      }
      case trace_event_kind::free_requested: {
        live_block& b = live.at(e.address);
        o.kind = op_kind::release_free;  // becomes release if a free_completed follows
        o.slot = b.slot;
        o.size = b.size;
        b.release_op = i;
        requested -= b.size;
        break;
      }
      case trace_event_kind::free_completed: {
        auto it = live.find(e.address);
        out.ops[it->second.release_op].kind = op_kind::release;
        o.kind = op_kind::free;
        o.slot = it->second.slot;
        o.size = it->second.size;
        live.erase(it);
        break;
      }
      case trace_event_kind::record_stream:
        o.kind = op_kind::record_stream;
        o.slot = live.at(e.address).slot;
        o.stream = stream_of(e.stream);
        break;
      case trace_event_kind::segment_alloc:
        ++out.recorded_segment_allocs;
        if (e.size > UINT64_MAX - reserved.value_or(0)) {
          throw trace_error(
              fmt::format("trace: event {}: the recorded reserved bytes pass 2^64", i), i);
        }
        reserved = reserved.value_or(0) + e.size;
        if (*reserved > recorded_peak) recorded_peak = *reserved;
        break;
      case trace_event_kind::segment_free:
        ++out.recorded_segment_frees;
        reserved = reserved.value_or(0) - std::min(reserved.value_or(0), e.size);
        break;
    }
  }
  if (reserved) out.recorded_peak_reserved = recorded_peak;
  return out;
}

/// One sample of a replay's memory over time (after the event it names).
struct replay_sample {
  std::uint64_t event_index = 0;
  std::uint64_t requested = 0;  ///< the program's live requested bytes
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
};

/// How to replay.
struct replay_options {
  std::size_t device_memory = std::size_t{80} << 30;
  /// Used as given: a replay never reads PYTORCH_CUDA_ALLOC_CONF (policy automatic means stitch).
  allocator_config config = allocator_config::parse("");
  cost_model costs = cost_model::typical();
  /// Keep memory over time (one sample per event) in replay_result::samples.
  bool record_samples = false;
  /// Keep the segments after this event (or at the OOM, whichever comes first).
  std::optional<std::size_t> snapshot_after_event;
  /// Keep what the program did as a trace with the addresses this allocator handed out
  /// (replay_result::history; with `segments`, what write_pytorch_snapshot exports).
  bool record_history = false;
  /// Called every few ten thousand events with (events done, events in all); may be empty.
  std::function<void(std::size_t, std::size_t)> progress;
};

/// What one replay found.
struct replay_result {
  std::string policy;  ///< the effective policy ("classic", "expandable", "stitch")
  bool completed = false;
  std::optional<std::size_t> oom_event_index;
  std::string oom_message;     ///< the out_of_memory error's message (with its diagnosis)
  std::string memory_summary;  ///< memory_summary() when the OOM happened
  std::uint64_t oom_request_bytes = 0;
  std::uint64_t peak_requested = 0;  ///< the program's, up to the OOM if there was one
  std::uint64_t peak_allocated = 0;
  std::uint64_t peak_reserved = 0;
  std::size_t events_replayed = 0;
  call_counters calls;
  double simulated_seconds = 0;  ///< time charged by the device's cost model
  double wall_seconds = 0;       ///< time the replay loop took on this machine
  std::vector<replay_sample> samples;
  std::optional<std::size_t> snapshot_event;  ///< the event after which `segments` was taken
  std::vector<segment_snapshot<simulated_stream>> segments;
  allocation_trace history;  ///< with replay_options::record_history, up to the OOM if any

  std::size_t device_alloc_calls() const noexcept { return calls.malloc + calls.mem_create; }
  std::size_t device_free_calls() const noexcept { return calls.free + calls.mem_release; }
  double events_per_second() const noexcept {
    return wall_seconds > 0 ? static_cast<double>(events_replayed) / wall_seconds : 0.0;
  }
};

namespace detail {

/// Appends what op `o` did to `history`, with the address the allocator under test handed out.
inline void record(allocation_trace& history, const compiled_trace::op& o, void* ptr,
                   const std::vector<simulated_stream>& streams) {
  using op_kind = compiled_trace::op_kind;
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr));
  const std::uint64_t stream = streams[o.stream].id;
  switch (o.kind) {
    case op_kind::alloc:
      history.events.push_back({trace_event_kind::alloc, address, o.size, stream, no_time});
      break;
    case op_kind::release:
      history.events.push_back({trace_event_kind::free_requested, address, o.size, 0, no_time});
      break;
    case op_kind::free:
      history.events.push_back({trace_event_kind::free_completed, address, o.size, 0, no_time});
      break;
    case op_kind::release_free:
      history.events.push_back({trace_event_kind::free_requested, address, o.size, 0, no_time});
      history.events.push_back({trace_event_kind::free_completed, address, o.size, 0, no_time});
      break;
    case op_kind::record_stream:
      history.events.push_back({trace_event_kind::record_stream, address, 0, stream, no_time});
      break;
    case op_kind::none:
      break;
  }
}

}  // namespace detail

/// Replays `trace` on a fresh simulated device of options.device_memory bytes with a fresh
/// caching_allocator. Running out of memory is a result, not an error. Throws config_error for a
/// configuration this build cannot run, std::invalid_argument for a bad device size, and whatever
/// the allocator throws besides out_of_memory (a bug: cuda_error, usage_error).
inline replay_result replay_trace(const compiled_trace& trace, const replay_options& options) {
  using op_kind = compiled_trace::op_kind;
  simulated_device::options dopts;
  dopts.capacity = options.device_memory;
  dopts.costs = options.costs;
  dopts.completion = event_completion::immediate;
  simulated_device device(dopts);
  replay_result r;
  {
    caching_allocator<simulated_device> alloc(device, options.config);
    r.policy = std::string(to_string(alloc.policy()));
    std::vector<simulated_stream> streams(trace.stream_ids.size());
    streams[0] = device.default_stream();
    for (std::size_t s = 1; s < streams.size(); ++s) streams[s] = device.create_stream();
    std::vector<void*> slots(trace.allocations, nullptr);
    const call_counters before = device.counters();
    const double seconds_before = device.simulated_seconds();
    std::uint64_t requested = 0;
    if (options.record_samples) r.samples.reserve(trace.ops.size());
    const std::size_t n = trace.ops.size();
    constexpr std::size_t progress_every = std::size_t{1} << 16;
    const auto start = std::chrono::steady_clock::now();
    std::size_t i = 0;
    for (; i < n; ++i) {
      const compiled_trace::op& o = trace.ops[i];
      switch (o.kind) {
        case op_kind::alloc:
          try {
            slots[o.slot] = alloc.allocate(o.size, streams[o.stream]);
          } catch (const out_of_memory& e) {
            r.oom_event_index = i;
            r.oom_message = e.what();
            r.oom_request_bytes = o.size;
            r.memory_summary = alloc.memory_summary();
            break;
          }
          requested += o.size;
          if (requested > r.peak_requested) r.peak_requested = requested;
          break;
        case op_kind::release:
          requested -= o.size;
          break;
        case op_kind::free:
          alloc.deallocate(slots[o.slot]);
          break;
        case op_kind::release_free:
          requested -= o.size;
          alloc.deallocate(slots[o.slot]);
          break;
        case op_kind::record_stream:
          alloc.record_stream(slots[o.slot], streams[o.stream]);
          break;
        case op_kind::none:
          break;
      }
      if (r.oom_event_index) break;
      if (options.record_history) detail::record(r.history, o, slots[o.slot], streams);
      if (options.record_samples) {
        const memory_usage u = alloc.usage();
        r.samples.push_back(replay_sample{i, requested, u.allocated, u.reserved});
      }
      if (options.snapshot_after_event && *options.snapshot_after_event == i) {
        r.segments = alloc.snapshot();
        r.snapshot_event = i;
      }
      if (options.progress && (i + 1) % progress_every == 0) options.progress(i + 1, n);
    }
    r.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.events_replayed = i;
    if (options.record_history) {
      r.history.initial_events = std::min(trace.initial_events, i);
      r.history.recorded_config = options.config.to_string();
      r.history.source = "gpumem-replay";
    }
    r.completed = !r.oom_event_index;
    if (r.oom_event_index && !r.snapshot_event) {
      r.segments = alloc.snapshot();
      r.snapshot_event = *r.oom_event_index;
    }
    const device_stats st = alloc.stats();
    r.peak_allocated = static_cast<std::uint64_t>(st.allocated_bytes[0].peak);
    r.peak_reserved = static_cast<std::uint64_t>(st.reserved_bytes[0].peak);
    r.calls = device.counters() - before;
    r.simulated_seconds = device.simulated_seconds() - seconds_before;
    if (options.progress) options.progress(i, n);
  }
  return r;
}

/// The bisection find_min_device_memory runs, over any probe: the smallest size, to `resolution`
/// bytes, between `peak_requested` (nothing fits below) and `limit` for which `completes(size)` is
/// true, assuming that completing is monotonic in the size; nothing when even `limit` fails.
/// Throws what `completes` throws.
inline std::optional<std::size_t> search_min_device_memory(
    std::uint64_t peak_requested, std::size_t limit, std::size_t resolution,
    const std::function<bool(std::size_t)>& completes) {
  auto align = [&](std::size_t v) { return (v + resolution - 1) / resolution * resolution; };
  if (peak_requested > limit) return std::nullopt;  // before align, which wraps near 2^64
  std::size_t lo = align(static_cast<std::size_t>(peak_requested));
  if (lo == 0) lo = resolution;
  if (lo > limit) return std::nullopt;
  if (completes(lo)) return lo;
  // Grow geometrically to a size that completes, then bisect (lo fails, hi completes).
  std::size_t hi = lo;
  for (;;) {
    const std::size_t next = hi >= limit / 2 ? limit : align(hi + hi / 4);
    if (next == hi) return std::nullopt;
    if (completes(next)) {
      hi = next;
      break;
    }
    lo = next;
    hi = next;
  }
  while (hi - lo > resolution) {
    const std::size_t mid = align(lo + (hi - lo) / 2);
    if (mid >= hi || mid <= lo) break;
    if (completes(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

/// The smallest device size, to `resolution` bytes, on which `trace` completes under `options`
/// (its device_memory is ignored), searched between the trace's peak requested and `limit`.
/// nothing when it does not complete even on `limit` bytes. Each probe is one replay;
/// `on_probe(device_memory, completed)` is told about each (may be empty). Throws as replay_trace.
inline std::optional<std::size_t> find_min_device_memory(
    const compiled_trace& trace, replay_options options, std::size_t limit,
    std::size_t resolution = std::size_t{1} << 20,
    const std::function<void(std::size_t, bool)>& on_probe = {}) {
  options.record_samples = false;
  options.record_history = false;
  options.snapshot_after_event.reset();
  options.progress = nullptr;
  return search_min_device_memory(trace.peak_requested, limit, resolution, [&](std::size_t bytes) {
    options.device_memory = bytes;
    const bool ok = replay_trace(trace, options).completed;
    if (on_probe) on_probe(bytes, ok);
    return ok;
  });
}

/// Replays a trace as one training step on an allocator the caller keeps, step after step: its
/// allocations and frees in order (free_completed where the trace has them, else free_requested),
/// then frees whatever is still live. For steady-state studies (how an allocator settles over a
/// training loop); replay_trace is the one-shot, out-of-memory-aware replay.
class step_replayer {
 public:
  explicit step_replayer(const allocation_trace& trace) : trace_(trace) {
    for (const auto& e : trace.events) {
      has_completed_ = has_completed_ || e.kind == trace_event_kind::free_completed;
    }
  }

  /// One step on `a` (any allocator with allocate(size) and deallocate(ptr)). Throws what the
  /// allocator throws; what it had allocated before then stays live in it.
  template <class Allocator>
  void run(Allocator& a) {
    const auto free_kind =
        has_completed_ ? trace_event_kind::free_completed : trace_event_kind::free_requested;
    live_.clear();
    for (const auto& e : trace_.events) {
      if (e.kind == trace_event_kind::alloc) {
        auto it = live_.find(e.address);
        if (it != live_.end()) a.deallocate(it->second);  // a free the trace did not record
        live_[e.address] = a.allocate(static_cast<std::size_t>(e.size));
      } else if (e.kind == free_kind) {
        auto it = live_.find(e.address);
        if (it == live_.end()) continue;
        a.deallocate(it->second);
        live_.erase(it);
      }
    }
    for (auto& [address, p] : live_) a.deallocate(p);
    live_.clear();
  }

 private:
  const allocation_trace& trace_;
  std::unordered_map<std::uint64_t, void*> live_;
  bool has_completed_ = false;
};

}  // namespace gpumem
