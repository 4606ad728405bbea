// The hot path: a malloc+free pair that hits the cache, on the simulated device, beside glibc's
// malloc/free of the same sizes in the same run (the CPU reference).
//
//   build/bench/gpumem_bench_hot_path --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <cstdlib>
#include <vector>

#include <benchmark/benchmark.h>

#include "gpumem/gpumem.hpp"
#include "mixed_sizes.hpp"
#include "timed_loop.hpp"

namespace {

using allocator = gpumem::caching_allocator<gpumem::simulated_device>;

gpumem::simulated_device& shared_device() {
  static gpumem::simulated_device device([] {
    gpumem::simulated_device::options o;
    o.capacity = std::size_t{80} << 30;
    return o;
  }());
  return device;
}

allocator& shared_allocator() {
  static allocator a(shared_device(), gpumem::allocator_config::parse("policy:classic"));
  return a;
}

using gpumem_bench::mixed_sizes;

void gpumem_pair(benchmark::State& state) {
  allocator& a = shared_allocator();
  const auto size = static_cast<std::size_t>(state.range(0));
  a.deallocate(a.allocate(size));  // warm: the segment is cached
  gpumem_bench::timed_loop(state, [&] {
    void* p = a.allocate(size);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  });
  state.SetItemsProcessed(state.iterations());
}

void glibc_pair(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  gpumem_bench::timed_loop(state, [&] {
    void* p = std::malloc(size);
    benchmark::DoNotOptimize(p);
    std::free(p);
  });
  state.SetItemsProcessed(state.iterations());
}

void gpumem_mixed(benchmark::State& state) {
  allocator& a = shared_allocator();
  const auto& sizes = mixed_sizes();
  for (std::size_t s : sizes) a.deallocate(a.allocate(s));
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  gpumem_bench::timed_loop(state, [&] {
    void* p = a.allocate(sizes[i++ & 4095]);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  });
  state.SetItemsProcessed(state.iterations());
}

void glibc_mixed(benchmark::State& state) {
  const auto& sizes = mixed_sizes();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  gpumem_bench::timed_loop(state, [&] {
    void* p = std::malloc(sizes[i++ & 4095]);
    benchmark::DoNotOptimize(p);
    std::free(p);
  });
  state.SetItemsProcessed(state.iterations());
}

void sizes(benchmark::internal::Benchmark* b) {
  for (long s : {512L, 64L << 10, 1L << 20, 16L << 20, 256L << 20}) b->Arg(s);
}

}  // namespace

BENCHMARK(gpumem_pair)->Apply(sizes)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(glibc_pair)->Apply(sizes)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(gpumem_mixed)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(glibc_mixed)->Threads(1)->Threads(2)->UseManualTime();

BENCHMARK_MAIN();
