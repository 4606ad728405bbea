// gpumem-replay-peer — replays one allocation trace on another project's real caching allocator,
// running on the gpumem CUDA simulator (tools/cudasim), and prints one JSON object with the keys
// of `gpumem-replay --json`. gpumem-replay starts it, one process per replay, for
// `--allocator pytorch|cub`: the simulator and PyTorch's allocator are process-wide singletons.
//
//   GPUMEM_SIM_MEMORY=24GiB gpumem-replay-peer --allocator pytorch --trace run.trace
//       [--config "expandable_segments:True"] [--snapshot-device N]
//
// Allocators:
//   pytorch  c10::cuda::CUDACachingAllocator from libc10_cuda.so (only when built with torch).
//            The configuration is PyTorch's (PYTORCH_CUDA_ALLOC_CONF syntax), applied with
//            c10::CachingAllocator::setAllocatorSettings; PYTORCH_ALLOC_CONF and
//            PYTORCH_CUDA_ALLOC_CONF are ignored (removed before the allocator starts).
//   cub      cub::CachingDeviceAllocator (CCCL). Configuration: comma-separated key:value pairs
//            bin_growth, min_bin, max_bin, max_cached_bytes (see print_help); empty: CUB's
//            defaults.
//
// Exit status: 0 when the replay ran (out of memory included), 1 when the trace could not be read
// or the allocator failed otherwise, 2 for a bad command line or configuration, 3 when the
// allocator was not built in.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

// config.hpp before size_units.hpp: the other order trips -Wshadow in config.hpp.
#include "command_line.hpp"
#include "gpumem/config.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/error.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"
#include "gpumem_cudasim.h"

#include "cub_peer.hpp"
#ifdef GPUMEM_PEER_PYTORCH
#include "pytorch_peer.hpp"
#endif

namespace {

using gpumem::peers::alloc_outcome;
using gpumem_replay::json;
using gpumem_replay::json_line;

void print_help() {
  std::printf(
      "usage: gpumem-replay-peer --allocator pytorch|cub --trace TRACE [--config CONFIG]\n"
      "                          [--snapshot-device N]\n"
      "\n"
      "Replays TRACE on PyTorch's or CUB's caching allocator on the gpumem CUDA simulator (device\n"
      "size: GPUMEM_SIM_MEMORY) and prints one JSON object. Normally started by gpumem-replay\n"
      "--allocator pytorch|cub.\n"
      "\n"
      "  --config CONFIG  pytorch: PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "
      "\"expandable_segments:True\"\n"
      "                   cub: bin_growth:N,min_bin:N,max_bin:N,max_cached_bytes:SIZE (defaults\n"
      "                   8, 3, 7 and 6291455, CUB's; max_cached_bytes:none for no limit)\n"
      "  --list           print the allocators built in and exit\n");
}

[[noreturn]] void fail(int status, const std::string& message) {
  std::fprintf(stderr, "gpumem-replay-peer: %s\n", message.c_str());
  std::exit(status);
}

struct sim_counters {
  gpumemSimGetCounters_t get = nullptr;
  gpumemSimResetCounters_t reset = nullptr;

  sim_counters() {
    get =
        reinterpret_cast<gpumemSimGetCounters_t>(dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME));
    reset = reinterpret_cast<gpumemSimResetCounters_t>(
        dlsym(RTLD_DEFAULT, GPUMEM_SIM_RESET_COUNTERS_NAME));
    if (get == nullptr || reset == nullptr) {
      fail(1, "not running on the gpumem CUDA simulator (gpumemSimGetCounters not found)");
    }
  }
  gpumemSimCounters read() const {
    gpumemSimCounters c{};
    if (get(&c, sizeof c) != 0) fail(1, "the CUDA simulator could not start");
    return c;
  }
};

gpumem::call_counters calls_of(const gpumemSimCounters& c) {
  // gpumemSimCallCounts mirrors the call kinds up to cuMemSetAccess, in order; the simulator
  // counts cudaStreamWaitEvent among its runtime calls.
  constexpr std::size_t mirrored = gpumem::call_kind_count - 1;
  static_assert(sizeof(gpumemSimCallCounts) == mirrored * sizeof(unsigned long long),
                "one counter per call kind up to set_access");
  unsigned long long v[mirrored];
  std::memcpy(v, &c.calls, sizeof v);
  gpumem::call_counters out;
  for (std::size_t i = 0; i < mirrored; ++i) {
    out[gpumem::all_call_kinds[i]] = static_cast<std::size_t>(v[i]);
  }
  out.stream_wait_event = static_cast<std::size_t>(c.stream_wait_event);
  return out;
}

struct outcome {
  bool completed = true;
  std::optional<std::size_t> oom_event;
  std::uint64_t oom_request = 0;
  std::string oom_message;
  std::size_t events_replayed = 0;
  std::uint64_t peak_requested = 0;
  double wall_seconds = 0;
  gpumem::call_counters initial_calls;  // after the initial events (the state before recording)
  std::uint64_t initial_reserved = 0;
};

/// Same op semantics as gpumem::replay_trace: alloc, release (requested only), free,
/// release_free, record_stream.
template <class Allocator>
outcome replay(const gpumem::compiled_trace& c, Allocator& a, const sim_counters& sim) {
  using op_kind = gpumem::compiled_trace::op_kind;
  outcome out;
  std::uint64_t requested = 0;
  if (c.initial_events == 0) {
    out.initial_calls = calls_of(sim.read());
    out.initial_reserved = sim.read().bytes_in_use;
  }
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < c.ops.size(); ++i) {
    const gpumem::compiled_trace::op& o = c.ops[i];
    switch (o.kind) {
      case op_kind::alloc: {
        requested += o.size;
        out.peak_requested = std::max(out.peak_requested, requested);
        alloc_outcome r = a.allocate(o.slot, static_cast<std::size_t>(o.size), o.stream);
        if (!r.ok) {
          out.completed = false;
          out.oom_event = i;
          out.oom_request = o.size;
          out.oom_message = std::move(r.message);
        }
        break;
      }
      case op_kind::release:
        requested -= o.size;
        break;
      case op_kind::free:
        a.deallocate(o.slot);
        break;
      case op_kind::release_free:
        requested -= o.size;
        a.deallocate(o.slot);
        break;
      case op_kind::record_stream:
        a.record_stream(o.slot, o.stream);
        break;
      case op_kind::empty_cache:
        a.empty_cache();
        break;
      case op_kind::none:
        break;
    }
    if (!out.completed) break;
    out.events_replayed = i + 1;
    if (i + 1 == c.initial_events) {
      const gpumemSimCounters now = sim.read();
      out.initial_calls = calls_of(now);
      out.initial_reserved = now.bytes_in_use;
    }
  }
  out.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

template <class Allocator>
int run(Allocator& a, const std::string& config, const gpumem::compiled_trace& c,
        const std::string& trace_path, const sim_counters& sim) {
  a.start(c.stream_ids.size());
  // What the set-up did (streams, the allocator's own initialisation) is not the replay's.
  if (sim.reset() != 0) fail(1, "the CUDA simulator could not start");
  const outcome r = replay(c, a, sim);
  const gpumemSimCounters end = sim.read();
  const gpumem::call_counters calls = calls_of(end);
  const auto alloc_calls = [](const gpumem::call_counters& k) { return k.malloc + k.mem_create; };
  const auto free_calls = [](const gpumem::call_counters& k) { return k.free + k.mem_release; };

  json j;
  j["config"] = config;
  j["allocator"] = a.name();
  j["policy"] = a.policy();
  j["trace"] = trace_path;
  j["device_memory_bytes"] = end.total_memory;
  j["completed"] = r.completed;
  j["oom_event_index"] = r.oom_event ? json(*r.oom_event) : json(nullptr);
  j["oom_message"] = r.completed ? json(nullptr) : json(r.oom_message);
  j["oom_request_bytes"] = r.oom_request;
  j["events"] = c.ops.size();
  j["events_replayed"] = r.events_replayed;
  j["initial_events"] = c.initial_events;
  j["peak_requested_bytes"] = r.peak_requested;
  j["peak_allocated_bytes"] = a.peak_allocated();
  j["peak_reserved_bytes"] = end.peak_bytes_in_use;
  j["reserved_bytes_at_end"] = end.bytes_in_use;
  j["reserved_bytes_after_initial_events"] = r.initial_reserved;
  j["device_alloc_calls"] = alloc_calls(calls);
  j["device_free_calls"] = free_calls(calls);
  j["device_calls"] = calls.total();
  j["device_alloc_calls_after_initial_events"] = alloc_calls(calls) - alloc_calls(r.initial_calls);
  j["device_free_calls_after_initial_events"] = free_calls(calls) - free_calls(r.initial_calls);
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    j[fmt::format("calls_{}", gpumem::call_kind_name(k))] = calls[k];
  }
  j["sim_out_of_memory_calls"] = end.out_of_memory;
  j["sim_unimplemented_calls"] = end.unimplemented;
  j["simulated_device_seconds"] = nullptr;
  j["replay_seconds"] = r.wall_seconds;
  j["events_per_second"] = std::llround(
      r.wall_seconds > 0 ? static_cast<double>(r.events_replayed) / r.wall_seconds : 0.0);
  j.update(a.own_stats());
  std::printf("%s\n", json_line(j).c_str());
  std::fflush(stdout);
  // The allocators' blocks are still live: leave without running their teardown.
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string allocator;
  std::string trace_path;
  std::string config;
  int snapshot_device = 0;
  gpumem_tools::command_line cl(argc, argv, "gpumem-replay-peer");
  while (cl.next()) {
    if (cl.is("-h") || cl.is("--help")) {
      cl.no_value();
      print_help();
      return 0;
    } else if (cl.is("--list")) {
      cl.no_value();
#ifdef GPUMEM_PEER_PYTORCH
      std::printf("cub\npytorch\n");
#else
      std::printf("cub\n");
#endif
      return 0;
    } else if (cl.is("--allocator")) {
      allocator = cl.value();
    } else if (cl.is("--trace")) {
      trace_path = cl.value();
    } else if (cl.is("--config")) {
      config = cl.value();
    } else if (cl.is("--snapshot-device")) {
      snapshot_device = static_cast<int>(cl.unsigned_value(1023));
    } else {
      cl.unknown();
    }
  }
  if (trace_path.empty()) fail(2, "no --trace given");
  if (allocator != "pytorch" && allocator != "cub") {
    fail(2, fmt::format("--allocator must be pytorch or cub, got \"{}\"", allocator));
  }
#ifndef GPUMEM_PEER_PYTORCH
  if (allocator == "pytorch") {
    fail(3,
         "built without PyTorch: run `bash tools/setup_torch.sh`, then configure gpumem with "
         "-DGPUMEM_TORCH_PYTHON=.venv-torch/bin/python and rebuild");
  }
#endif
  gpumem::compiled_trace compiled;
  try {
    compiled = gpumem::compile_trace(gpumem::read_trace(trace_path, snapshot_device));
  } catch (const std::exception& e) {
    fail(1, e.what());
  }
  const sim_counters sim;
  try {
    if (allocator == "cub") {
      std::unique_ptr<gpumem::peers::cub_peer> a;
      try {
        a = std::make_unique<gpumem::peers::cub_peer>(config);
      } catch (const gpumem::peers::config_error& e) {
        fail(2, fmt::format("bad configuration \"{}\": {}", config, e.what()));
      }
      return run(*a, config, compiled, trace_path, sim);
    }
#ifdef GPUMEM_PEER_PYTORCH
    std::unique_ptr<gpumem::peers::pytorch_peer> a;
    try {
      a = std::make_unique<gpumem::peers::pytorch_peer>(config);
    } catch (const gpumem::peers::config_error& e) {
      fail(2, fmt::format("bad configuration \"{}\": {}", config, e.what()));
    }
    return run(*a, config, compiled, trace_path, sim);
#endif
  } catch (const std::exception& e) {
    fail(1, fmt::format("{} allocator failed: {}", allocator, e.what()));
  }
  return 1;
}
