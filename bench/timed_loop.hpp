// The timing of the multi-threaded benchmarks (gpumem_bench_hot_path, gpumem_bench_compare).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include <benchmark/benchmark.h>

namespace gpumem_bench {

namespace detail {
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// When the first thread of the running benchmark started its loop (0: not yet).
inline std::atomic<std::int64_t> loop_start{0};
}  // namespace detail

/// Runs `body` once per iteration and reports, as the benchmark's manual time
/// (->UseManualTime()), the wall time from the first iteration of any thread until every thread
/// has finished its loop (the end of Google Benchmark's loop waits for the others). Google
/// Benchmark divides that time by the iterations of all threads: with several threads on one
/// allocator, the figure is the time per operation while they share it. Its real time would stop
/// each thread's clock when that thread finishes and average the threads, which rewards a lock
/// that lets one thread run ahead.
template <class F>
void timed_loop(benchmark::State& state, F&& body) {
  // Before Google Benchmark's start barrier: no thread has started this run's loop yet.
  if (state.thread_index() == 0) detail::loop_start.store(0);
  bool first = true;
  for (auto _ : state) {
    if (first) {
      std::int64_t none = 0;
      detail::loop_start.compare_exchange_strong(none, detail::now_ns());
      first = false;
    }
    body();
  }
  if (!first) {
    state.SetIterationTime(static_cast<double>(detail::now_ns() - detail::loop_start.load()) *
                           1e-9);
  }
}

}  // namespace gpumem_bench
