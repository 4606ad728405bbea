// The hot-path race: gpumem's caching allocator beside PyTorch's (libc10_cuda.so) and CUB's
// (CachingDeviceAllocator), all four on the CUDA simulator (tools/cudasim) in the same process, so
// that every allocator pays the same CUDA runtime for whatever CUDA calls it makes on its hot path.
//
//   gpumem_classic  caching_allocator<cuda_device>, policy classic (cudaMalloc segments)
//   gpumem_stitch   caching_allocator<cuda_vmm_device>, policy stitch (cuMemCreate / cuMemMap)
//   pytorch         c10::cuda::CUDACachingAllocator raw_alloc_with_stream / raw_delete
//   cub             cub::CachingDeviceAllocator DeviceAllocate / DeviceFree
//
// Cases: one size (512B ... 256MiB), `mixed` (bench/mixed_sizes.hpp, as gpumem_bench_hot_path) and
// `trace` (the alloc/free sequence of a real trace, warmed with whole passes until one makes no
// device memory call, then replayed; gpumem must get there). Each iteration is one allocation and
// its free (for `trace`: one allocation and the frees the trace makes before the next allocation),
// so the time per iteration is the time per pair. With 2 threads both threads share one allocator,
// and the time is per pair of either thread while both run (bench/timed_loop.hpp).
//
//   gpumem_bench_compare [--trace=<file>] [Google Benchmark flags]
//   bench/compare.sh [build dir]          (the tables of bench/README.md)
//
// The program sets GPUMEM_SIM_MEMORY=80GiB unless it is set. Where it does not run on the simulator
// (LD_LIBRARY_PATH naming a real CUDA runtime, which is searched before the RUNPATH), the
// device-call counts are not available and are reported as -1.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <benchmark/benchmark.h>
#include <cub/util_allocator.cuh>

// gpumem.hpp first: with gpumem/detail/size_units.hpp seen before gpumem/config.hpp, config.hpp's
// locals named `mib` trip -Wshadow.
#include "gpumem/gpumem.hpp"
// clang-format off
#include "gpumem/device/cuda_device.hpp"
#include "gpumem/device/cuda_vmm_device.hpp"
// clang-format on
#include "gpumem/trace/trace_io.hpp"
#include "gpumem_cudasim.h"
#include "mixed_sizes.hpp"
#include "timed_loop.hpp"

#if GPUMEM_BENCH_HAVE_C10
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

// Exported by libc10_cuda.so and declared in no installed header. ATen installs this hook in a
// full PyTorch; without it, c10 calls a placeholder that throws when it asks whether the device
// has a primary context (which it does when freeing blocks used on other streams).
namespace c10::cuda::_internal {
C10_CUDA_API void setHasPrimaryContext(bool (*func)(DeviceIndex));
}  // namespace c10::cuda::_internal
#endif

namespace {

// --- the simulator's counters

/// Device calls counted by the simulator; -1 when not running on the simulator.
struct device_calls {
  long long memory = 0;  ///< calls that obtain, map, release or synchronise device memory
  long long events = 0;  ///< event create / record / query / destroy
};

gpumemSimGetCounters_t simulator_counters() {
  static const auto get =
      reinterpret_cast<gpumemSimGetCounters_t>(dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME));
  return get;
}

device_calls count_device_calls() {
  device_calls d{-1, -1};
  gpumemSimCounters c{};
  const gpumemSimGetCounters_t get = simulator_counters();
  if (get == nullptr || get(&c, sizeof c) != 0) return d;
  const gpumemSimCallCounts& k = c.calls;
  d.memory =
      static_cast<long long>(k.malloc + k.free + k.address_reserve + k.address_free + k.mem_create +
                             k.mem_release + k.mem_map + k.mem_unmap + k.set_access +
                             k.device_synchronize + k.event_synchronize + c.stream_synchronize);
  d.events =
      static_cast<long long>(k.event_create + k.event_record + k.event_query + k.event_destroy);
  return d;
}

device_calls operator-(const device_calls& a, const device_calls& b) {
  if (a.memory < 0 || b.memory < 0) return device_calls{-1, -1};
  return device_calls{a.memory - b.memory, a.events - b.events};
}

// --- the allocators

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status));
  }
}

/// One allocator under test: allocate / free on one stream, plus what the report needs.
struct peer {
  std::string name;
  bool is_gpumem = false;
  virtual ~peer() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual void release_cache() = 0;
};

template <class Device>
class gpumem_peer final : public peer {
 public:
  gpumem_peer(const char* peer_name, const char* config, cudaStream_t stream)
      : allocator_(device_, gpumem::allocator_config::parse(config)), stream_(stream) {
    name = peer_name;
    is_gpumem = true;
  }
  void* allocate(std::size_t bytes) override { return allocator_.allocate(bytes, stream_); }
  void deallocate(void* ptr) override { allocator_.deallocate(ptr); }
  void release_cache() override { allocator_.empty_cache(); }

 private:
  Device device_{0};
  gpumem::caching_allocator<Device> allocator_;
  cudaStream_t stream_;
};

class cub_peer final : public peer {
 public:
  // Power-of-two bins from 512 B to 1 GiB and a cache limited only by the device: CUB's default
  // (bins of x8 up to 2 MiB, 6 MiB cached) frees every block above 2 MiB to the device at once,
  // which would race cudaMalloc rather than a cache.
  explicit cub_peer(cudaStream_t stream)
      : allocator_(2, 9, 30, std::size_t{64} << 30, /*skip_cleanup=*/true), stream_(stream) {
    name = "cub";
  }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check_cuda(allocator_.DeviceAllocate(&p, bytes, stream_), "cub DeviceAllocate");
    return p;
  }
  void deallocate(void* ptr) override { check_cuda(allocator_.DeviceFree(ptr), "cub DeviceFree"); }
  void release_cache() override { (void)allocator_.FreeAllCached(); }

 private:
  cub::CachingDeviceAllocator allocator_;
  cudaStream_t stream_;
};

#if GPUMEM_BENCH_HAVE_C10
namespace cca = c10::cuda::CUDACachingAllocator;

class pytorch_peer final : public peer {
 public:
  explicit pytorch_peer(cudaStream_t stream) : stream_(stream) {
    name = "pytorch";
    c10::cuda::_internal::setHasPrimaryContext([](c10::DeviceIndex) { return true; });
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    cca::init(count);
  }
  void* allocate(std::size_t bytes) override { return cca::raw_alloc_with_stream(bytes, stream_); }
  void deallocate(void* ptr) override { cca::raw_delete(ptr); }
  void release_cache() override { cca::emptyCache(); }

 private:
  cudaStream_t stream_;
};
#endif

// --- the trace, as a replay plan

/// A trace's allocations and frees in order. Step k allocates `size` bytes into live slot `slot`,
/// then frees the slots frees[steps[k-1].frees_end .. steps[k].frees_end). Blocks still live at the
/// end of the trace are freed by the last step, so passes can follow each other.
struct replay_plan {
  struct step {
    std::size_t size;
    std::uint32_t slot;
    std::uint32_t frees_end;
  };
  std::vector<step> steps;
  std::vector<std::uint32_t> frees;
  std::uint32_t slots = 0;
  std::string source;
};

/// Blocks go back to the allocator at free_completed when the trace has one for them (PyTorch
/// snapshots), else at free_requested (gpumem's own traces). Streams are ignored: every block is
/// replayed on one stream.
replay_plan make_plan(const gpumem::allocation_trace& trace, const std::string& path) {
  using kind = gpumem::trace_event_kind;
  struct live_block {
    std::uint32_t slot;
    std::size_t requested_at;  // step of free_requested, or npos
  };
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  replay_plan plan;
  plan.source = path;
  std::vector<std::vector<std::uint32_t>> frees_at;
  std::unordered_map<std::uint64_t, live_block> live;
  std::vector<std::uint32_t> free_slots;
  auto release = [&](const live_block& b, std::size_t at) {
    frees_at[at].push_back(b.slot);
    free_slots.push_back(b.slot);
  };
  for (const gpumem::trace_event& e : trace.events) {
    if (e.kind == kind::alloc) {
      auto it = live.find(e.address);
      if (it != live.end()) {  // freed (requested) earlier, never completed
        release(it->second,
                it->second.requested_at != npos ? it->second.requested_at : frees_at.size() - 1);
        live.erase(it);
      }
      std::uint32_t slot = plan.slots;
      if (free_slots.empty()) {
        ++plan.slots;
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      plan.steps.push_back({static_cast<std::size_t>(e.size), slot, 0});
      frees_at.emplace_back();
      live.emplace(e.address, live_block{slot, npos});
    } else if (e.kind == kind::free_requested) {
      auto it = live.find(e.address);
      if (it != live.end() && !frees_at.empty()) it->second.requested_at = frees_at.size() - 1;
    } else if (e.kind == kind::free_completed) {
      auto it = live.find(e.address);
      if (it != live.end()) {
        release(it->second, frees_at.size() - 1);
        live.erase(it);
      }
    }
  }
  for (const auto& [address, b] : live) {
    (void)address;
    release(b, b.requested_at != npos ? b.requested_at : frees_at.size() - 1);
  }
  for (std::size_t k = 0; k < plan.steps.size(); ++k) {
    plan.frees.insert(plan.frees.end(), frees_at[k].begin(), frees_at[k].end());
    plan.steps[k].frees_end = static_cast<std::uint32_t>(plan.frees.size());
  }
  return plan;
}

/// One thread's position in a replay plan and its live blocks.
struct replay_cursor {
  const replay_plan* plan;
  std::vector<void*> live;
  std::size_t next = 0;

  explicit replay_cursor(const replay_plan& p) : plan(&p), live(p.slots, nullptr) {}

  /// One step: one allocation and the frees that follow it.
  template <class Peer>
  void step(Peer& a) {
    const replay_plan::step& s = plan->steps[next];
    live[s.slot] = a.allocate(s.size);
    const std::uint32_t begin = next == 0 ? 0 : plan->steps[next - 1].frees_end;
    for (std::uint32_t f = begin; f < s.frees_end; ++f) {
      a.deallocate(live[plan->frees[f]]);
      live[plan->frees[f]] = nullptr;
    }
    if (++next == plan->steps.size()) next = 0;
  }

  /// Frees what is live and goes back to the start of the plan.
  template <class Peer>
  void reset(Peer& a) {
    for (void*& p : live) {
      if (p != nullptr) a.deallocate(p);
      p = nullptr;
    }
    next = 0;
  }
};

// --- the benchmarks

/// Runs `body` and turns an exception into a skipped benchmark with its message.
template <class F>
void guarded(benchmark::State& state, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void set_call_counters(benchmark::State& state, const device_calls& d, std::int64_t pairs) {
  if (state.thread_index() != 0) return;
  state.counters["dev_calls"] = static_cast<double>(d.memory);
  state.counters["event_calls_per_pair"] =
      d.events < 0 || pairs <= 0 ? -1.0
                                 : static_cast<double>(d.events) / static_cast<double>(pairs);
}

void bench_size(benchmark::State& state, peer& a, std::size_t size) {
  guarded(state, [&] {
    a.deallocate(a.allocate(size));  // warm: the block is cached
    const device_calls before = count_device_calls();
    gpumem_bench::timed_loop(state, [&] {
      void* p = a.allocate(size);
      benchmark::DoNotOptimize(p);
      a.deallocate(p);
    });
    set_call_counters(state, count_device_calls() - before, state.iterations() * state.threads());
    state.SetItemsProcessed(state.iterations());
  });
}

void bench_mixed(benchmark::State& state, peer& a) {
  guarded(state, [&] {
    const auto& sizes = gpumem_bench::mixed_sizes();
    for (std::size_t s : sizes) a.deallocate(a.allocate(s));
    std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
    const device_calls before = count_device_calls();
    gpumem_bench::timed_loop(state, [&] {
      void* p = a.allocate(sizes[i++ & (gpumem_bench::mixed_count - 1)]);
      benchmark::DoNotOptimize(p);
      a.deallocate(p);
    });
    set_call_counters(state, count_device_calls() - before, state.iterations() * state.threads());
    state.SetItemsProcessed(state.iterations());
  });
}

/// Result of warming an allocator for a replay plan.
struct warm_result {
  int passes = 0;             ///< single-thread passes until one made no device memory call
  long long check_calls = 0;  ///< device memory calls of the last pass (-1 off the simulator)
};

/// Warms `a` for the plan: with several threads first as many interleaved passes (the threads'
/// replays overlap), then single passes until one makes no device memory call (at most
/// `max_passes`). The last pass is the check: gpumem must make no device call in it.
warm_result warm_for_trace(peer& a, const replay_plan& plan, int threads, int max_passes) {
  if (threads > 1) {
    std::vector<replay_cursor> several(static_cast<std::size_t>(threads), replay_cursor(plan));
    for (std::size_t k = 0; k < plan.steps.size(); ++k) {
      for (replay_cursor& c : several) c.step(a);
    }
  }
  replay_cursor one(plan);
  warm_result r;
  while (r.passes < max_passes) {
    const device_calls before = count_device_calls();
    for (std::size_t k = 0; k < plan.steps.size(); ++k) one.step(a);
    ++r.passes;
    r.check_calls = (count_device_calls() - before).memory;
    if (r.check_calls <= 0) break;
  }
  return r;
}

void bench_trace(benchmark::State& state, peer& a, const replay_plan& plan) {
  guarded(state, [&] {
    if (plan.steps.empty()) {
      state.SkipWithError("the trace has no allocation");
      return;
    }
    if (state.thread_index() == 0) {
      // Each allocator starts the trace from an emptied cache, as a program does between phases
      // (torch.cuda.empty_cache()): what the single-size and mixed cases left cached would
      // otherwise shape where the trace's blocks go.
      a.release_cache();
      const warm_result w = warm_for_trace(a, plan, state.threads(), 12);
      state.counters["warm_passes"] = w.passes;
      state.counters["check_pass_dev_calls"] = static_cast<double>(w.check_calls);
      if (a.is_gpumem && w.check_calls > 0) {
        static std::string message;  // SkipWithError keeps the pointer
        message = "gpumem made " + std::to_string(w.check_calls) +
                  " device memory calls in the steady state of the trace (pass " +
                  std::to_string(w.passes) + ")";
        state.SkipWithError(message.c_str());
      }
    }
    replay_cursor cursor(plan);
    const device_calls before = count_device_calls();
    gpumem_bench::timed_loop(state, [&] { cursor.step(a); });
    set_call_counters(state, count_device_calls() - before, state.iterations() * state.threads());
    cursor.reset(a);
    state.SetItemsProcessed(state.iterations());
  });
}

/// The simulator's cost of the calls PyTorch and CUB make on every pair (gpumem makes none).
void bench_cuda_get_device(benchmark::State& state) {
  for (auto _ : state) {
    int device = -1;
    benchmark::DoNotOptimize(cudaGetDevice(&device));
    benchmark::DoNotOptimize(device);
  }
}

void bench_cuda_event_record(benchmark::State& state, cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
    state.SkipWithError("cudaEventCreateWithFlags failed");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(cudaEventRecord(event, stream));
  (void)cudaEventDestroy(event);
}

struct size_case {
  const char* name;
  std::size_t bytes;
};

constexpr size_case size_cases[] = {{"512B", 512},
                                    {"64KiB", std::size_t{64} << 10},
                                    {"1MiB", std::size_t{1} << 20},
                                    {"16MiB", std::size_t{16} << 20},
                                    {"256MiB", std::size_t{256} << 20}};

void register_peer(peer& a, const replay_plan& plan) {
  for (const size_case& c : size_cases) {
    const std::size_t bytes = c.bytes;
    benchmark::RegisterBenchmark((a.name + "/" + c.name).c_str(),
                                 [&a, bytes](benchmark::State& s) { bench_size(s, a, bytes); })
        ->Threads(1)
        ->Threads(2)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark((a.name + "/mixed").c_str(),
                               [&a](benchmark::State& s) { bench_mixed(s, a); })
      ->Threads(1)
      ->Threads(2)
      ->UseManualTime();
  benchmark::RegisterBenchmark((a.name + "/trace").c_str(),
                               [&a, &plan](benchmark::State& s) { bench_trace(s, a, plan); })
      ->Threads(1)
      ->Threads(2)
      ->UseManualTime();
}

std::string take_trace_flag(int& argc, char** argv) {
  std::string path = GPUMEM_BENCH_DEFAULT_TRACE;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const char* prefix = "--trace=";
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) {
      path = argv[i] + std::strlen(prefix);
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  // Before the first CUDA call: the simulator reads its settings once.
  setenv("GPUMEM_SIM_MEMORY", "80GiB", /*overwrite=*/0);
  const std::string trace_path = take_trace_flag(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const bool on_simulator = simulator_counters() != nullptr;
  benchmark::AddCustomContext("cuda_runtime",
                              on_simulator ? "gpumem cudasim" : "not the simulator");
  benchmark::AddCustomContext("cuda_toolkit", GPUMEM_BENCH_CUDA_VERSION);
  benchmark::AddCustomContext("sim_memory", std::getenv("GPUMEM_SIM_MEMORY"));
  benchmark::AddCustomContext("trace", trace_path);
#if GPUMEM_BENCH_HAVE_C10
  benchmark::AddCustomContext("torch", GPUMEM_BENCH_TORCH_VERSION);
#else
  benchmark::AddCustomContext("torch", "not built");
  std::fprintf(stderr,
               "gpumem_bench_compare: PyTorch's allocator is not built in (configure with "
               "-DGPUMEM_TORCH_PYTHON=<python with torch> or -DGPUMEM_TORCH_DIR=<torch "
               "folder>); the pytorch/* benchmarks are not registered.\n");
#endif
  if (!on_simulator) {
    std::fprintf(stderr,
                 "gpumem_bench_compare: not running on the CUDA simulator; device calls are not "
                 "counted (-1).\n");
  }

  int status = 0;
  try {
    replay_plan plan = make_plan(gpumem::read_trace(trace_path), trace_path);
    benchmark::AddCustomContext("trace_pairs", std::to_string(plan.steps.size()));

    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    std::vector<std::unique_ptr<peer>> peers;
    peers.push_back(std::make_unique<gpumem_peer<gpumem::cuda_device>>("gpumem_classic",
                                                                       "policy:classic", stream));
    peers.push_back(std::make_unique<gpumem_peer<gpumem::cuda_vmm_device>>(
        "gpumem_stitch", "policy:stitch", stream));
#if GPUMEM_BENCH_HAVE_C10
    peers.push_back(std::make_unique<pytorch_peer>(stream));
#endif
    peers.push_back(std::make_unique<cub_peer>(stream));
    for (auto& p : peers) register_peer(*p, plan);
    benchmark::RegisterBenchmark("cudasim/cudaGetDevice", bench_cuda_get_device);
    benchmark::RegisterBenchmark("cudasim/cudaEventRecord", [stream](benchmark::State& s) {
      bench_cuda_event_record(s, stream);
    });

    benchmark::RunSpecifiedBenchmarks();
    for (auto& p : peers) p->release_cache();
    peers.clear();
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem_bench_compare: %s\n", e.what());
    status = 1;
  }
  benchmark::Shutdown();
  return status;
}
