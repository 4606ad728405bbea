// gpumem_bench_replay — how fast gpumem-replay replays a trace: events per second per policy.
//
// The traces are the synthetic workloads of workloads.hpp, recorded in-process
// (workload_traces.hpp) and compiled once; each iteration replays one on a fresh simulated
// device of 80 GiB with the device cost model on, as gpumem-replay does. Google Benchmark's
// items_per_second is events per second.
#include <cstddef>
#include <string>

#include <benchmark/benchmark.h>

#include "gpumem/config.hpp"
#include "gpumem/trace/replay.hpp"
#include "workload_traces.hpp"

namespace {

void replay_workload(benchmark::State& state, const gpumem::bench::workload_info* w,
                     const char* config) {
  const gpumem::compiled_trace trace = gpumem::compile_trace(gpumem::bench::record_workload(*w, 1));
  gpumem::replay_options options;
  options.config = gpumem::allocator_config::parse(config);
  std::size_t events = 0;
  for (auto _ : state) {
    const gpumem::replay_result r = gpumem::replay_trace(trace, options);
    if (!r.completed) state.SkipWithError("the replay ran out of memory");
    events += r.events_replayed;
    benchmark::DoNotOptimize(r.peak_reserved);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events));
  state.counters["events"] = static_cast<double>(trace.ops.size());
}

int register_all() {
  for (const gpumem::bench::workload_info& w : gpumem::bench::all_workloads()) {
    for (const char* config : {"policy:classic", "policy:expandable", "policy:stitch"}) {
      benchmark::RegisterBenchmark(
          (std::string("replay/") + std::string(w.name) + "/" + config).c_str(), replay_workload,
          &w, config)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
