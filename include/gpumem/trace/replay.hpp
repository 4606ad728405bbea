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
#include <iterator>
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
#include "gpumem/trace/pytorch_snapshot.hpp"

namespace gpumem {

/// A trace prepared for replay. Built by compile_trace; one op per trace event, same index.
struct compiled_trace {
  enum class op_kind : std::uint8_t {
    alloc,          ///< allocate `size` on `stream` into `slot`; requested += size
    release,        ///< the program released `slot` (requested -= size); the block stays busy
    free,           ///< return `slot` to the allocator (its release came earlier)
    release_free,   ///< both at once
    record_stream,  ///< `slot` is also used on `stream`
    empty_cache,    ///< the program emptied the allocator's cache
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
  /// Each event's recorded time (trace_event::time_us), when any event has one; else empty.
  std::vector<std::int64_t> time_us;
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
  for (const trace_event& e : trace.events) {
    if (e.time_us == no_time) continue;
    out.time_us.reserve(trace.events.size());
    for (const trace_event& t : trace.events) out.time_us.push_back(t.time_us);
    break;
  }
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
      case trace_event_kind::empty_cache:
        o.kind = op_kind::empty_cache;
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
  /// (replay_result::history), and the same with what the allocator did with device memory
  /// (replay_result::snapshot_trace; with `segments`, what write_pytorch_snapshot exports).
  bool record_history = false;
  /// Called every few ten thousand events with (events done, events in all); may be empty.
  std::function<void(std::size_t, std::size_t)> progress;
  /// Replays the trace this many times in a row (>= 1), as the steps of a training loop: what is
  /// still live at the end of a step is freed before the next one starts. Event indices of
  /// samples and snapshot_after_event count across steps (step k's event i is k * events + i).
  std::size_t steps = 1;
  /// Run caching_allocator::check_invariants after every step (for tests; O(blocks)).
  bool check_invariants = false;
};

/// The device calls of one step of a replay (replay_options::steps).
struct step_figures {
  call_counters calls;              ///< every device call the step made
  double simulated_seconds = 0;     ///< the time the cost model charged for them
  std::uint64_t peak_reserved = 0;  ///< reserved memory's peak so far (this step included)
  /// Calls that obtain, map or give back memory, or wait for the device
  /// (call_counters::memory_calls).
  std::size_t device_calls() const noexcept { return calls.memory_calls(); }
  /// Calls that make the host wait for the device (call_counters::host_synchronizations).
  std::size_t host_synchronizations() const noexcept { return calls.host_synchronizations(); }
  /// Waits of one stream for another's work, on the GPU (cudaStreamWaitEvent).
  std::size_t stream_waits() const noexcept { return calls.stream_wait_event; }
};

/// What one replay found.
struct replay_result {
  std::string policy;  ///< the effective policy ("classic", "expandable", "stitch")
  bool completed = false;
  std::optional<std::size_t> oom_event_index;  ///< the event of the trace, in step oom_step
  std::size_t oom_step = 0;                    ///< 0-based; 0 unless replay_options::steps > 1
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
  /// With replay_options::record_history: the events of a PyTorch snapshot's device trace, after
  /// the trace's initial events, up to the OOM: the block events (record_stream and empty_cache
  /// excepted), and after each operation the changes in the memory that reserved memory counts
  /// (caching_allocator::reserved_ranges: segment_alloc / segment_free for classic segments,
  /// segment_map / segment_unmap for parts of VMM ranges; before the alloc event, after the free
  /// events), and an oom event at the OOM. Times: the trace's, where recorded.
  std::vector<snapshot_trace_entry> snapshot_trace;
  /// For each snapshot_trace entry, the trace event (counted across steps) that made it.
  std::vector<std::size_t> snapshot_trace_event;
  std::vector<step_figures> steps;  ///< one per step replayed (the step that ran out included)

  std::size_t device_alloc_calls() const noexcept { return calls.malloc + calls.mem_create; }
  std::size_t device_free_calls() const noexcept { return calls.free + calls.mem_release; }
  double events_per_second() const noexcept {
    return wall_seconds > 0 ? static_cast<double>(events_replayed) / wall_seconds : 0.0;
  }
};

namespace detail {

/// What changed between two reserved_ranges() lists (diff_reserved_ranges), as snapshot events
/// appended to `out`.
inline void append_reserved_changes(const std::vector<reserved_range<simulated_stream>>& before,
                                    const std::vector<reserved_range<simulated_stream>>& after,
                                    std::int64_t time_us, std::vector<snapshot_trace_entry>& out) {
  diff_reserved_ranges(
      before, after,
      [&](allocator_action a, std::uintptr_t address, std::size_t size, simulated_stream stream) {
        out.push_back({a, address, size, stream.id, time_us});
      });
}

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
    case op_kind::empty_cache:
      history.events.push_back({trace_event_kind::empty_cache, 0, 0, 0, no_time});
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
    std::vector<std::uint64_t> unreleased(trace.allocations, 0);  // requested bytes still counted
    const call_counters before = device.counters();
    const double seconds_before = device.simulated_seconds();
    std::uint64_t requested = 0;
    const std::size_t steps = std::max<std::size_t>(options.steps, 1);
    const std::size_t n = trace.ops.size();
    if (options.record_samples) r.samples.reserve(n * steps);
    constexpr std::size_t progress_every = std::size_t{1} << 16;
    // record_history: the memory reserved memory counts after the last operation, the oom events
    // the allocator reported during the current one, and each slot's stream.
    std::vector<reserved_range<simulated_stream>> ranges;
    std::vector<snapshot_trace_entry> ooms;
    std::vector<std::uint32_t> slot_stream;
    std::size_t memory_calls_seen = 0;  // device calls that obtain or give back memory, so far
    if (options.record_history) {
      slot_stream.assign(trace.allocations, 0);
      alloc.set_event_observer([&ooms](const allocator_event<simulated_stream>& e) {
        if (e.action == allocator_action::oom) {
          ooms.push_back({allocator_action::oom, e.address, e.size, e.stream.id, no_time});
        }
      });
    }
    // After operation `o` (trace event i, `global` across steps; `ptr` its block): its events for
    // snapshot_trace, with the changes in reserved memory it made.
    auto record_snapshot = [&](const compiled_trace::op& o, std::size_t i, std::size_t global,
                               void* ptr, bool oom) {
      const std::int64_t t = trace.time_us.empty() ? no_time : trace.time_us[i];
      // Classic and expandable change their memory only through device calls; stitch also moves
      // shared pages from range to range without any.
      const std::size_t calls = device.counters().memory_calls();
      std::vector<reserved_range<simulated_stream>> now =
          calls != memory_calls_seen || r.policy == "stitch" ? alloc.reserved_ranges() : ranges;
      memory_calls_seen = calls;
      const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr));
      std::vector<snapshot_trace_entry>& out = r.snapshot_trace;
      auto block_event = [&](allocator_action a) {
        out.push_back({a, address, o.size, streams[slot_stream[o.slot]].id, t});
      };
      switch (o.kind) {
        case op_kind::alloc:
          detail::append_reserved_changes(ranges, now, t, out);
          if (!oom) block_event(allocator_action::alloc);
          break;
        case op_kind::release:
          block_event(allocator_action::free_requested);
          break;
        case op_kind::free:
          block_event(allocator_action::free_completed);
          detail::append_reserved_changes(ranges, now, t, out);
          break;
        case op_kind::release_free:
          block_event(allocator_action::free_requested);
          block_event(allocator_action::free_completed);
          detail::append_reserved_changes(ranges, now, t, out);
          break;
        case op_kind::record_stream:
        case op_kind::empty_cache:
        case op_kind::none:
          detail::append_reserved_changes(ranges, now, t, out);
          break;
      }
      for (snapshot_trace_entry& e : ooms) {
        e.time_us = t;
        out.push_back(e);
      }
      ooms.clear();
      ranges = std::move(now);
      r.snapshot_trace_event.resize(out.size(), global);
    };
    const auto start = std::chrono::steady_clock::now();
    std::size_t done = 0;  // events replayed, all steps
    for (std::size_t step = 0; step < steps && !r.oom_event_index; ++step) {
      const call_counters step_before = device.counters();
      const double step_seconds = device.simulated_seconds();
      for (std::size_t i = 0; i < n; ++i) {
        const compiled_trace::op& o = trace.ops[i];
        void* const before_op = slots[o.slot];  // the block a free frees (for the history)
        // Events are kept from the end of the initial ones (the state before recording began).
        const bool snapshot_events =
            options.record_history && (step > 0 || i >= trace.initial_events);
        if (options.record_history && step == 0 && i == trace.initial_events) {
          ranges = alloc.reserved_ranges();
          memory_calls_seen = device.counters().memory_calls();
          ooms.clear();
        }
        if (options.record_history && o.kind == op_kind::alloc) slot_stream[o.slot] = o.stream;
        switch (o.kind) {
          case op_kind::alloc:
            try {
              slots[o.slot] = alloc.allocate(o.size, streams[o.stream]);
            } catch (const out_of_memory& e) {
              r.oom_event_index = i;
              r.oom_step = step;
              r.oom_message = e.what();
              r.oom_request_bytes = o.size;
              r.memory_summary = alloc.memory_summary();
              break;
            }
            unreleased[o.slot] = o.size;
            requested += o.size;
            if (requested > r.peak_requested) r.peak_requested = requested;
            break;
          case op_kind::release:
            requested -= o.size;
            unreleased[o.slot] = 0;
            break;
          case op_kind::free:
            alloc.deallocate(slots[o.slot]);
            slots[o.slot] = nullptr;
            break;
          case op_kind::release_free:
            requested -= o.size;
            unreleased[o.slot] = 0;
            alloc.deallocate(slots[o.slot]);
            slots[o.slot] = nullptr;
            break;
          case op_kind::record_stream:
            alloc.record_stream(slots[o.slot], streams[o.stream]);
            break;
          case op_kind::empty_cache:
            alloc.empty_cache();
            break;
          case op_kind::none:
            break;
        }
        const std::size_t global = step * n + i;
        if (snapshot_events) {
          record_snapshot(o, i, global, o.kind == op_kind::alloc ? slots[o.slot] : before_op,
                          r.oom_event_index.has_value());
        }
        if (r.oom_event_index) break;
        if (options.record_history) {
          detail::record(r.history, o, o.kind == op_kind::alloc ? slots[o.slot] : before_op,
                         streams);
        }
        if (options.record_samples) {
          const memory_usage u = alloc.usage();
          r.samples.push_back(replay_sample{global, requested, u.allocated, u.reserved});
        }
        if (options.snapshot_after_event && *options.snapshot_after_event == global) {
          r.segments = alloc.snapshot();
          r.snapshot_event = global;
        }
        ++done;
        if (options.progress && done % progress_every == 0) options.progress(done, n * steps);
      }
      // Between steps, what is still live goes, as a training loop frees the last step's tensors.
      if (!r.oom_event_index && step + 1 < steps) {
        for (std::size_t slot = 0; slot < slots.size(); ++slot) {
          if (slots[slot] == nullptr) continue;
          if (options.record_history) {
            const auto address =
                static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(slots[slot]));
            r.history.events.push_back(
                {trace_event_kind::free_requested, address, unreleased[slot], 0, no_time});
            r.history.events.push_back(
                {trace_event_kind::free_completed, address, unreleased[slot], 0, no_time});
            const std::uint64_t stream = streams[slot_stream[slot]].id;
            r.snapshot_trace.push_back(
                {allocator_action::free_requested, address, unreleased[slot], stream, no_time});
            r.snapshot_trace.push_back(
                {allocator_action::free_completed, address, unreleased[slot], stream, no_time});
          }
          alloc.deallocate(slots[slot]);
          slots[slot] = nullptr;
          requested -= unreleased[slot];
          unreleased[slot] = 0;
        }
      }
      if (options.record_history && !r.oom_event_index && step + 1 < steps) {
        std::vector<reserved_range<simulated_stream>> now = alloc.reserved_ranges();
        detail::append_reserved_changes(ranges, now, no_time, r.snapshot_trace);
        ranges = std::move(now);
        r.snapshot_trace_event.resize(r.snapshot_trace.size(), (step + 1) * n - 1);
      }
      if (options.check_invariants) alloc.check_invariants();
      step_figures f;
      f.calls = device.counters() - step_before;
      f.simulated_seconds = device.simulated_seconds() - step_seconds;
      f.peak_reserved = static_cast<std::uint64_t>(alloc.stats().reserved_bytes[0].peak);
      r.steps.push_back(f);
    }
    r.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.record_history) alloc.set_event_observer({});  // before `ooms` goes
    r.events_replayed = done;
    if (options.record_history) {
      r.history.initial_events = std::min(trace.initial_events, done);
      r.history.recorded_config = options.config.to_string();
      r.history.source = "gpumem-replay";
    }
    r.completed = !r.oom_event_index;
    if (r.oom_event_index && !r.snapshot_event) {
      r.segments = alloc.snapshot();
      r.snapshot_event = r.oom_step * n + *r.oom_event_index;
    }
    const device_stats st = alloc.stats();
    r.peak_allocated = static_cast<std::uint64_t>(st.allocated_bytes[0].peak);
    r.peak_reserved = static_cast<std::uint64_t>(st.reserved_bytes[0].peak);
    r.calls = device.counters() - before;
    r.simulated_seconds = device.simulated_seconds() - seconds_before;
    if (options.progress) options.progress(done, n * steps);
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

}  // namespace gpumem
