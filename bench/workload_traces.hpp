// gpumem bench — the synthetic workloads of workloads.hpp written down as traces.
//
// A workload never looks at the pointers it gets back, so running it against an "allocator" that
// hands out fake addresses and records each call gives exactly the sequence every real allocator
// sees: the trace that gpumem-replay and bench_replay replay.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/trace/event.hpp"
#include "workloads.hpp"

namespace gpumem::bench {

/// Runs `w` with `seed` and records what it asks for. Addresses are fake, 512-byte aligned and
/// never reused.
inline allocation_trace record_workload(const workload_info& w, std::uint64_t seed) {
  allocation_trace trace;
  trace.source = fmt::format("gpumem bench workload {} seed {}", w.name, seed);
  std::uint64_t next_address = std::uint64_t{1} << 40;
  std::unordered_map<std::uint64_t, std::pair<std::uint64_t, stream_id>> live;  // size, stream
  workload_context ctx(allocator_ops{
      [&](std::size_t bytes, stream_id stream) {
        const std::uint64_t address = next_address;
        next_address += (bytes + 511) / 512 * 512;
        live[address] = {bytes, stream};
        trace.events.push_back({trace_event_kind::alloc, address, bytes, stream, no_time});
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
      },
      [&](void* p) {
        const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
        const auto it = live.find(address);
        trace.events.push_back({trace_event_kind::free_requested, address, it->second.first,
                                it->second.second, no_time});
        live.erase(it);
      },
      [&](void* p, stream_id stream) {
        trace.events.push_back({trace_event_kind::record_stream,
                                reinterpret_cast<std::uintptr_t>(p), 0, stream, no_time});
      },
      [&] {
        trace.events.push_back({trace_event_kind::empty_cache, 0, 0, 0, no_time});
      }});
  w.run(ctx, seed);
  return trace;
}

}  // namespace gpumem::bench
