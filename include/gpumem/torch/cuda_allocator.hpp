// gpumem — PyTorch's CUDA allocator interface (c10::cuda::CUDACachingAllocator::CUDAAllocator)
// implemented on gpumem, so that gpumem replaces PyTorch's caching allocator and everything that
// asks PyTorch's allocator keeps working: torch.cuda.memory_stats / memory_summary /
// max_memory_reserved / empty_cache / set_per_process_memory_fraction, snapshots and memory
// history, cudnn.benchmark's cacheInfo, ProcessGroupNCCL's segment registration (trace trackers),
// CUDA-graph private pools and the checkpoints CUDA-graph trees take of them
// (torch.compile(mode="reduce-overhead")), torch.cuda.MemPool / use_mem_pool (nested too) with
// use_on_oom and no_split, torch.cuda.caching_allocator_enable(False), IPC (torch.multiprocessing:
// cudaMalloc segments as CUDA IPC handles, the VMM policies' pages as PyTorch's expandable-segment
// handles) and torch.cuda.memory._set_allocator_settings: "expandable_segments:False" around code
// that needs cudaMalloc memory (set_legacy_segments), the sizing keys as PyTorch applies them
// (set_run_time_settings).
//
//   gpumem::torch::install();                          // before the first CUDA tensor
//   gpumem::torch::install("policy:stitch,max_split_size_mb:256");
//
// Structure (private pool: docs/architecture.md, "Vocabulary"): one
// caching_allocator<cuda_vmm_device> per GPU serves PyTorch's default pool; every private pool
// (MempoolId: a CUDA graph's, a torch.cuda.MemPool) gets its own caching_allocator on that GPU,
// so its blocks are never handed to anyone else, except that the default pool's miss may borrow
// a cached block of a pool marked use-on-OOM (the block stays that pool's). A no_split pool's
// allocator runs the classic policy and never splits. Device statistics add the pools up: current
// values and totals exactly, peaks as the sum of each allocator's peak (an upper bound). With
// caching disabled (enable(false)) allocations are plain cudaMalloc, outside every allocator.
// While legacy segments are asked for under expandable or stitch, the default pool's new
// allocations go to a second, classic allocator of the GPU (device_state::legacy): its blocks
// are the default pool's in statistics, snapshots and traces, and are freed back to it.
//
// With oom_snapshot:DIR set, an out-of-memory error is preceded by a snapshot of the failing GPU in
// DIR, replayable with gpumem-replay (gpumem/torch/oom_snapshot.hpp; README.md, "Snapshot on
// out-of-memory").
//
// Compiles against torch 2.8 through 2.15 (TORCH_VERSION_MAJOR/MINOR guards). Needs c10 and
// c10_cuda only (the headers under the wheel's torch/include and libc10_cuda.so); link
// ${TORCH_LIBRARIES} or gpumem's gpumem::c10_cuda.
//
// Thread safety: every member may be called from any thread, as PyTorch's allocator. Errors:
// PyTorch's own exception types (c10::OutOfMemoryError, c10::Error), so Python sees
// torch.OutOfMemoryError and RuntimeError as with PyTorch's allocator; what gpumem cannot do
// throws c10::Error "not supported by gpumem: <reason>", at the call that asks for it. What PyTorch
// calls from destructors (MemPool's, CUDAGraph's, a tensor's deleter: releasePool, emptyCache of a
// pool, setUseOnOOM(false), the DataPtr deleter) never throws; a failure there is reported on
// stderr.
#pragma once

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>  // torch >= 2.10
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#elif __has_include(<torch/csrc/api/include/torch/version.h>)
#include <torch/csrc/api/include/torch/version.h>  // torch 2.8, 2.9 with only torch/include
#endif
#ifndef TORCH_VERSION_MAJOR
#error "gpumem/torch/cuda_allocator.hpp: torch's version header was not found (torch/version.h)"
#endif

#define GPUMEM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if !GPUMEM_TORCH_AT_LEAST(2, 8)
#error "gpumem's LibTorch adapter supports torch 2.8 and newer"
#endif

#include <c10/core/Allocator.h>
#if GPUMEM_TORCH_AT_LEAST(2, 9)
#include <c10/core/AllocatorConfig.h>  // the settings' parse hook (follow_allocator_settings)
#endif
#include <c10/cuda/CUDAAllocatorConfig.h>  // the expandable-segment handle type; run-time keys
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/detail/format.hpp"
#include "gpumem/device/cuda_vmm_device.hpp"
#include "gpumem/device/shared_block.hpp"
#include "gpumem/error.hpp"
#include "gpumem/torch/oom_snapshot.hpp"

// pidfd_open and pidfd_getfd (Linux 5.3 and 5.6), for C libraries too old to name them: the
// numbers are the same on every architecture but alpha.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gpumem::torch {

namespace c10_alloc = ::c10::cuda::CUDACachingAllocator;
using mempool_id = ::c10::cuda::MempoolId_t;

/// The allocator gpumem runs on each GPU (and for each private pool).
using device_allocator = caching_allocator<cuda_vmm_device>;

class cuda_allocator;

/// Makes gpumem PyTorch's CUDA allocator (c10::cuda::CUDACachingAllocator and c10::GetAllocator
/// for CUDA), configured with `config`. Call it once per process, before the first CUDA
/// allocation. Returns the installed allocator (never destroyed: tensors may be freed during
/// exit). Throws gpumem::usage_error when gpumem is already installed or PyTorch's allocator has
/// already been initialised (a CUDA tensor exists or torch.cuda was initialised).
cuda_allocator& install(const allocator_config& config);

/// install(allocator_config::resolve(settings)): `settings` (PyTorch syntax plus gpumem's keys)
/// on top of GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF. Also throws
/// gpumem::config_error for a malformed string.
cuda_allocator& install(std::string_view settings = {});

/// The installed allocator, or nullptr. Thread-safe; never throws.
cuda_allocator* installed() noexcept;

namespace detail {

inline std::atomic<cuda_allocator*>& installed_slot() noexcept {
  static std::atomic<cuda_allocator*> slot{nullptr};
  return slot;
}

void raw_delete(void* ptr) noexcept;
void uncached_delete(void* ptr) noexcept;

[[noreturn]] inline void not_supported(const std::string& what, const std::string& why) {
  TORCH_CHECK(false, "gpumem: ", what, " is not supported by gpumem: ", why);
}

// Runs f for a call that PyTorch makes from a destructor (MemPool's, CUDAGraph's, a DataPtr's
// deleter), where an exception would end the process: a failure is reported on stderr instead.
// Never throws.
template <class F>
void reporting_failure(const char* what, F&& f) noexcept {
  const auto report = [what](const char* message) noexcept {
    constexpr std::string_view prefix = "gpumem: ";
    if (std::string_view(message).substr(0, prefix.size()) == prefix) message += prefix.size();
    std::fprintf(stderr, "gpumem: %s: %s\n", what, message);
  };
  try {
    f();
  } catch (const ::c10::Error& e) {
    report(e.what_without_backtrace());
  } catch (const std::exception& e) {
    report(e.what());
  } catch (...) {
    report("unknown error");
  }
}

inline c10_alloc::TraceEntry::Action trace_action(allocator_action a) noexcept {
  using A = c10_alloc::TraceEntry::Action;
  switch (a) {
    case allocator_action::alloc:
      return A::ALLOC;
    case allocator_action::free_requested:
      return A::FREE_REQUESTED;
    case allocator_action::free_completed:
      return A::FREE_COMPLETED;
    case allocator_action::segment_alloc:
      return A::SEGMENT_ALLOC;
    case allocator_action::segment_free:
      return A::SEGMENT_FREE;
    case allocator_action::segment_map:
      return A::SEGMENT_MAP;
    case allocator_action::segment_unmap:
      return A::SEGMENT_UNMAP;
    case allocator_action::oom:
      return A::OOM;
  }
  return A::ALLOC;
}

// memory_viz reads a trace entry's time as microseconds since the epoch from time_.t_ (PyTorch
// converts its TSC stamps the same way when it takes a snapshot).
inline std::time_t epoch_microseconds() noexcept {
  return static_cast<std::time_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count());
}

inline void copy_stat(const stat& from, ::c10::CachingAllocator::Stat& to) noexcept {
  to.current += from.current;
  to.peak += from.peak;
  to.allocated += from.allocated;
  to.freed += from.freed;
}

inline void copy_stats(const stat_array& from, ::c10::CachingAllocator::StatArray& to) noexcept {
  for (std::size_t i = 0; i < num_stat_types; ++i) copy_stat(from[i], to[i]);
}

// One CUDA-graph private pool (or torch.cuda.MemPool) on one GPU. A pool whose use count fell to
// 0 (its MemPool destroyed, its graphs reset) is dead: it keeps the blocks still allocated from
// it, and goes away, its cache returned to the device, when an emptyCache finds it empty.
struct private_pool {
  mempool_id id{0, 0};
  // MemPool(allocator): where the pool's segments come from, and the device that takes them
  // from it (the allocator keeps a reference). Declared before `allocator`, which frees its
  // segments through them when destroyed.
  std::unique_ptr<segment_source> source;
  std::unique_ptr<cuda_vmm_device> device;
  std::unique_ptr<device_allocator> allocator;
  int use_count = 1;
  std::function<bool(cudaStream_t)> filter;  // set between beginAllocateToPool and end
};

// A private pool's checkpoint (getCheckpointState): PyTorch's PrivatePoolState.
struct pool_checkpoint final : c10_alloc::AllocatorState {
  mempool_id id{0, 0};
  allocator_checkpoint<device_allocator::stream_type> layout;
};

#if GPUMEM_TORCH_AT_LEAST(2, 11)
using pool_allocator_handle = std::shared_ptr<c10_alloc::CUDAAllocator>;
#else
using pool_allocator_handle = c10_alloc::CUDAAllocator*;  // kept alive by the MemPool
#endif

// A MemPool's own allocator (a CUDAPluggableAllocator, NCCL's ncclMemAlloc through one) as the
// source of the pool's segments: PyTorch takes them from its raw_alloc and returns them with
// raw_delete. Holding it keeps it alive while the pool has segments (torch >= 2.11).
class pool_allocator_source final : public segment_source {
 public:
  explicit pool_allocator_source(pool_allocator_handle allocator)
      : allocator_(std::move(allocator)) {}
  void* allocate(std::size_t bytes) override { return allocator_->raw_alloc(bytes); }
  void deallocate(void* ptr, std::size_t) override { allocator_->raw_delete(ptr); }

 private:
  pool_allocator_handle allocator_;
};

// Per GPU: the device, the default pool's allocator and the private pools, created on first use.
struct device_state {
  explicit device_state(int index) : device(index) {}
  cuda_vmm_device device;
  std::once_flag created;
  std::unique_ptr<device_allocator> main;
  allocator_config config;  // what main and the pools run (classic where VMM is missing)
  std::mutex pools_mutex;   // pools and active
  std::vector<std::unique_ptr<private_pool>> pools;
  // The pools being allocated to (a filter set), in the order beginAllocateToPool was called: an
  // allocation goes to the newest whose filter takes its stream, as in PyTorch, so that nested
  // torch.cuda.use_mem_pool contexts allocate into the innermost pool.
  std::vector<private_pool*> active;
  std::atomic<int> allocating_to_pools{0};  // active.size(), read without the lock
  std::vector<int> peers;                   // devices given access (enablePeerAccess)
  // The live pools marked use-on-OOM (MemPool(use_on_oom=True)), in the order marked: on an
  // out-of-memory of the default pool, each lends a cached block (main's fallback). Its own mutex,
  // since main's fallback runs under main's lock, which pools_mutex holders take after theirs.
  // Lock order: pools_mutex, then use_on_oom_mutex; main's lock, then use_on_oom_mutex, then a
  // pool's lock.
  std::mutex use_on_oom_mutex;
  std::vector<private_pool*> use_on_oom;
  // The default pool's allocator of cudaMalloc segments (classic), made on the first allocation
  // while legacy segments are asked for and kept from then on, so that its blocks can be freed
  // whatever the setting is then. Read without a lock; set once, under pools_mutex.
  std::unique_ptr<device_allocator> legacy_owner;
  std::atomic<device_allocator*> legacy{nullptr};
  // Whether this GPU imports fabric handles (cuda_vmm_device::fabric_supported): -1 not asked yet.
  std::atomic<int> fabric_access{-1};
};

}  // namespace detail

/// gpumem as PyTorch's CUDA allocator. Obtain it with install(); see the top of this file.
class cuda_allocator final : public c10_alloc::CUDAAllocator {
 public:
  cuda_allocator(const cuda_allocator&) = delete;
  cuda_allocator& operator=(const cuda_allocator&) = delete;

  /// The configuration asked for at install (each GPU runs it, or classic where the GPU has no
  /// VMM); run_time_settings() has what set_run_time_settings changed since.
  const allocator_config& config() const noexcept { return config_; }

  /// config() with the values set_run_time_settings applied. Thread-safe.
  allocator_config run_time_settings() {
    std::lock_guard<std::mutex> lock(settings_mutex_);
    return run_time_config_;
  }

  /// The settings PyTorch lets a program change while it runs: max_split_size,
  /// max_non_split_rounding, large_segment_size (new cudaMalloc segments' size),
  /// roundup_power2_divisions and garbage_collection_threshold of `settings` go to every
  /// allocator of every GPU, private pools and legacy segments included, and act from their next
  /// request (caching_allocator::set_run_time_settings: cached blocks stay, statistics'
  /// max_split_size keeps the value the GPU started with); per_process_memory_fraction, as in
  /// PyTorch, only caps GPUs first used afterwards. The other keys keep their values. From torch
  /// 2.9, torch.cuda.memory._set_allocator_settings calls it (follow_allocator_settings) with
  /// PyTorch's values after its parse. Throws gpumem's config_error, changing nothing, for values
  /// out of range. Thread-safe.
  void set_run_time_settings(const allocator_config& settings) {
    std::lock_guard<std::mutex> settings_lock(settings_mutex_);
    allocator_config next = run_time_config_;
    next.take_run_time_settings(settings);
    next.per_process_memory_fraction = settings.per_process_memory_fraction;
    next.validate();
    for (const auto& s : devices_) {
      if (!s->main) continue;  // made under settings_mutex_ (state) from run_time_config_
      std::lock_guard<std::mutex> lock(s->pools_mutex);
      s->main->set_run_time_settings(next);
      if (device_allocator* legacy = legacy_of(*s)) legacy->set_run_time_settings(next);
      for (auto& p : s->pools) p->allocator->set_run_time_settings(next);
      // The allocators made later (pools, legacy segments) start from the GPU's config.
      s->config.take_run_time_settings(next);
    }
    run_time_config_ = std::move(next);
  }

  /// gpumem's allocator of PyTorch's default pool on `device` (creating it if needed): its
  /// stats(), snapshot() and memory_summary() are gpumem's own views. Throws c10::Error for a
  /// device index out of range.
  device_allocator& default_pool(c10::DeviceIndex device) { return *state(device).main; }

  /// Legacy segments: while on, the default pool's new allocations on a GPU running expandable or
  /// stitch come from cudaMalloc segments (a classic allocator of that GPU), which CUDA IPC
  /// (cudaIpcGetMemHandle, shareIpcHandle) shares and libraries that need cudaMalloc memory
  /// accept; off (the default), from the configured policy again. Blocks keep working across a
  /// switch and are freed where they came from; their cache stays until empty_cache (or an
  /// out-of-memory retry) returns it. No effect under classic, whose segments are all cudaMalloc
  /// ones, nor on private pools (MemPool, CUDA graphs), which keep their policy. From torch 2.9,
  /// torch.cuda.memory._set_allocator_settings with expandable_segments:False turns it on and
  /// expandable_segments:True off (follow_allocator_settings). Thread-safe; never throws.
  void set_legacy_segments(bool on) noexcept {
    legacy_segments_.store(on, std::memory_order_relaxed);
  }
  bool legacy_segments() const noexcept { return legacy_segments_.load(std::memory_order_relaxed); }

  /// gpumem's memory summary of `device` (PyTorch's table from getDeviceStats, then gpumem's
  /// section: largest free block, fragmentation, device calls, policy).
  std::string memory_summary(c10::DeviceIndex device, bool abbreviated = false) {
    device_allocator& a = default_pool(device);
    return gpumem::memory_summary(to_gpumem(getDeviceStats(device)), a.summary_numbers(),
                                  abbreviated);
  }

  // --- c10::Allocator ---------------------------------------------------------------------------

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (!enabled_.load(std::memory_order_relaxed)) {
      void* ptr = uncached_allocate(device, nbytes);
      return {ptr, ptr, &detail::uncached_delete, c10::Device(c10::DeviceType::CUDA, device)};
    }
    void* ptr = nullptr;
    if (nbytes != 0) {
      ptr = malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
    }
    return {ptr, ptr, &detail::raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &detail::raw_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // --- DeviceAllocator (CUDAAllocator before torch 2.9) ------------------------------------------

  bool initialized() override { return initialized_.load(std::memory_order_acquire); }

  /// torch.cuda.empty_cache(): with the default id, returns the cache of every GPU's default
  /// pool and of every dead private pool (see releasePool) to the device, and forgets the dead
  /// pools left empty; live private pools keep their cache, as in PyTorch. On a GPU where a
  /// CUDA graph is being captured (or a pool allocated to) it does nothing, as PyTorch leaves its
  /// default pool alone then. Throws gpumem's cuda_error on device failure. With a private pool's
  /// id (MemPool's destructor calls it): returns that pool's cache, and forgets the pool if it is
  /// dead and empty; never throws, a failure is reported on stderr.
  void emptyCache(mempool_id id = {0, 0}) override {
    if (!is_default(id)) {
      detail::reporting_failure("emptyCache of a private pool", [&] { empty_pool_cache(id); });
      return;
    }
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      detail::device_state& s = *devices_[d];
      if (!s.main) continue;
      // During a capture (or a use_mem_pool) nothing is emptied: PyTorch skips its default pool
      // then (it would synchronise and free memory the capture may use); gpumem skips the dead
      // pools too, whose cudaFree or unmap would break a capture in global mode.
      if (s.allocating_to_pools.load(std::memory_order_acquire) > 0) continue;
      pending_context() = free_context();
      struct reset_context {
        ~reset_context() { pending_context().reset(); }
      } reset;
      s.main->empty_cache();
      if (device_allocator* legacy = legacy_of(s)) legacy->empty_cache();
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      release_dead_pools(s);
    }
  }

  using c10_alloc::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &detail::raw_delete) return;
    device_allocator& a = owner_of(ptr.get(), ptr.device().index());
    a.record_stream(ptr.get(), stream.stream());
  }

  /// record_stream of a raw pointer from raw_alloc (what the CUDAPluggableAllocator route's
  /// record-stream function gets): `ptr`'s memory is reused only after the work queued on
  /// `stream` before its free. `stream` may belong to another GPU. Throws c10::Error for a pointer
  /// gpumem does not own.
  void record_stream_raw(void* ptr, cudaStream_t stream) {
    TORCH_CHECK(ptr != nullptr, "gpumem: record_stream of a null pointer");
    device_allocator& a = owner_of(ptr, devices_.size() == 1 ? 0 : c10::cuda::current_device());
    a.record_stream(ptr, stream);
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    detail::device_state& s = state(device);
    c10::CachingDeviceAllocator::DeviceStats out;
    const device_stats main_stats = s.main->stats();
    add_stats(out, main_stats);
    if (device_allocator* legacy = legacy_of(s)) add_stats(out, legacy->stats());
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    for (const auto& p : s.pools) {
      const device_stats pool_stats = p->allocator->stats();
      add_stats(out, pool_stats);
#if GPUMEM_TORCH_AT_LEAST(2, 13)
      detail::copy_stats(pool_stats.reserved_bytes, out.reserved_bytes_by_private_pools[p->id]);
#endif
    }
    out.max_split_size = main_stats.max_split_size;  // the GPU's first value, as PyTorch's
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    for_each_allocator(device, [](device_allocator& a) { a.reset_accumulated_stats(); });
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    for_each_allocator(device, [](device_allocator& a) { a.reset_peak_stats(); });
  }

  // --- CUDAAllocator
  // ------------------------------------------------------------------------------

  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (!enabled_.load(std::memory_order_relaxed)) return uncached_allocate(device, nbytes);
    return malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (!enabled_.load(std::memory_order_relaxed)) return uncached_allocate(device, nbytes);
    return malloc_on(device, nbytes, stream);
  }

  /// Frees memory from raw_alloc (or a DataPtr's, released): back to its pool's cache, or, for
  /// memory allocated while caching was disabled (enable(false)), to the device at once, whether
  /// caching is enabled now or not.
  void raw_delete(void* ptr) override {
    if (ptr == nullptr) return;
    const int hint = devices_.size() == 1 ? 0 : c10::cuda::current_device();
    if (!free_anywhere(ptr, hint) && !free_uncached(ptr)) {
      TORCH_CHECK(false, "gpumem: invalid device pointer ", ptr,
                  ": not allocated by gpumem, or already freed");
    }
  }

  void init(int device_count) override {
    std::call_once(init_once_, [&] {
      const int n = std::max(device_count, 0);
      devices_.reserve(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) devices_.push_back(std::make_unique<detail::device_state>(i));
      initialized_.store(true, std::memory_order_release);
    });
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    return state(device).main->memory_fraction();
  }

  /// The cap counts the private pools' memory with the default pool's, as PyTorch does.
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "gpumem: invalid fraction ", fraction,
                ": it must be between 0 and 1");
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    s.main->set_memory_fraction(fraction);
    if (device_allocator* legacy = legacy_of(s)) legacy->set_memory_fraction(fraction);
    for (auto& p : s.pools) p->allocator->set_memory_fraction(fraction);
  }

#if GPUMEM_TORCH_AT_LEAST(2, 10)
  std::vector<c10_alloc::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex device) override {
    std::vector<c10_alloc::StreamSegmentSize> out;
    device_allocator& a = *state(device).main;
    if (a.policy() != allocator_policy::expandable) return out;
    for (const auto& seg : a.snapshot()) {
      out.emplace_back(seg.stream, seg.is_small, seg.mapped_size);
    }
    return out;
  }
#endif

  /// torch.cuda.caching_allocator_enable(value). While disabled, as with PyTorch's allocator,
  /// every allocation is its own cudaMalloc, freed with cudaFree when its tensor is (no pool, no
  /// statistics, no trace, no memory fraction). Memory keeps the way it was allocated: what was
  /// cached before goes back to its pool when freed while disabled, and what was allocated while
  /// disabled is cudaFree'd when freed after caching is enabled again.
  void enable(bool value) override {
    enabled_.store(value, std::memory_order_relaxed);
  }
  bool isEnabled() const override {
    return enabled_.load(std::memory_order_relaxed);
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    detail::device_state& s = state(device);
    if (*largestBlock == 0) {
      std::size_t total = 0;
      s.device.memory_info(*largestBlock, total);  // PyTorch's optimistic first guess
    }
    for_each_allocator(device, [&](device_allocator& a) {
      *largestBlock = std::max(*largestBlock, a.summary_numbers().largest_free_block);
    });
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    device_allocator& a = owner_of(ptr, -1);
    if (a.policy() != allocator_policy::classic) {
      detail::not_supported("getBaseAllocation",
                            fmt::format("the {} policy maps pages into address ranges that CUDA "
                                        "IPC cannot share; use policy:classic",
                                        to_string(a.policy())));
    }
    const auto [base, bytes] = a.base_allocation(ptr);
    if (size != nullptr) *size = bytes;
    return base;
  }

#if GPUMEM_TORCH_AT_LEAST(2, 11)
  c10_alloc::SnapshotInfo snapshot(mempool_id id = {0, 0}, bool include_traces = true) override {
    return make_snapshot(id, include_traces);
  }
#else
  c10_alloc::SnapshotInfo snapshot(mempool_id id = {0, 0}) override {
    return make_snapshot(id, true);
  }
#endif

  /// From now until endAllocateToPool, allocations on `device` whose stream `filter` takes go to
  /// pool `id` (created if new; one more use of it), unless a pool begun later takes them too: the
  /// most recently begun pool wins, as in PyTorch (CUDA-graph capture, torch.cuda.use_mem_pool,
  /// nested or on several threads). Throws c10::Error when `id` is already being allocated to.
  void beginAllocateToPool(c10::DeviceIndex device, mempool_id id,
                           std::function<bool(cudaStream_t)> filter) override {
    TORCH_CHECK(filter, "gpumem: beginAllocateToPool for pool (", id.first, ", ", id.second,
                ") without a stream filter");
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    TORCH_CHECK(p == nullptr || !p->filter, "gpumem: beginAllocateToPool for pool (", id.first,
                ", ", id.second, ") while it is already being allocated to");
    s.active.reserve(s.active.size() + 1);  // nothing below throws once the pool is counted
    if (p == nullptr) {
      p = &make_pool(s, id);
    } else {
      ++p->use_count;
      p->allocator->set_memory_fixed(true);
    }
    p->filter = std::move(filter);
    s.active.push_back(p);
    s.allocating_to_pools.store(static_cast<int>(s.active.size()), std::memory_order_release);
    // PyTorch's captures_underway: every allocator of the device stops querying events, defers
    // the frees of blocks used on other streams, and frees or unmaps nothing until the end. The
    // setting that lets such a block be reused within the capture is read now, as PyTorch reads
    // it at each allocation (torch.cuda.memory._set_allocator_settings changes it at run time).
    const bool reuse = capture_record_stream_reuse();
    s.main->set_capture_record_stream_reuse(reuse);
    s.main->begin_capture();
    if (device_allocator* legacy = legacy_of(s)) {
      legacy->set_capture_record_stream_reuse(reuse);
      legacy->begin_capture();
    }
    for (auto& q : s.pools) {
      q->allocator->set_capture_record_stream_reuse(reuse);
      q->allocator->begin_capture();
    }
  }

  /// Ends beginAllocateToPool(device, id, ...) (the use it added stays until releasePool). Throws
  /// c10::Error when `id` is not being allocated to.
  void endAllocateToPool(c10::DeviceIndex device, mempool_id id) override {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    TORCH_CHECK(p != nullptr && p->filter, "gpumem: endAllocateToPool for pool (", id.first, ", ",
                id.second, ") that is not being allocated to");
    p->filter = nullptr;
    s.active.erase(std::find(s.active.begin(), s.active.end(), p));
    s.allocating_to_pools.store(static_cast<int>(s.active.size()), std::memory_order_release);
    s.main->end_capture();
    if (device_allocator* legacy = legacy_of(s)) legacy->end_capture();
    for (auto& q : s.pools) q->allocator->end_capture();
  }

  /// Drops one use of pool `id` (MemPool's destructor, CUDAGraph::reset, the end of
  /// torch.cuda.use_mem_pool). At none the pool is dead, as in PyTorch: what is still allocated
  /// from it stays valid, and its memory goes back to the device when an emptyCache finds it
  /// unused (MemPool's destructor calls one; torch.cuda.empty_cache() and an out-of-memory retry
  /// do too). Never throws, since PyTorch calls it from destructors: releasing a pool gpumem does
  /// not know, or more times than it was used, is reported on stderr and changes nothing.
  void releasePool(c10::DeviceIndex device, mempool_id id) override {
    detail::reporting_failure("releasePool", [&] {
      detail::device_state& s = state(device);
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      detail::private_pool* p = find_pool(s, id);
      TORCH_CHECK(p != nullptr && p->use_count > 0, "pool (", id.first, ", ", id.second,
                  ") is not in use (unknown, or already released)");
      // A dead pool's memory may go back to the device once nothing uses it (release_dead_pools);
      // it lends nothing on out-of-memory any more.
      if (--p->use_count == 0) {
        if (!p->filter) p->allocator->set_memory_fixed(false);
        stop_use_on_oom(s, p);
      }
    });
  }

  /// The uses of pool `id` (0 for a dead or unknown pool). Throws c10::Error for a bad device.
  int getPoolUseCount(c10::DeviceIndex device, mempool_id id) override {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    return p == nullptr ? 0 : p->use_count;
  }

  // MemPool's constructor calls createOrIncrefPool, then setUseOnOOM(true) and setNoSplit when
  // asked; its destructor setUseOnOOM(false) (torch >= 2.11), releasePool and emptyCache(id).

#if GPUMEM_TORCH_AT_LEAST(2, 11)
  /// Makes pool `id` on `device`, or adds a use to it. A pool with its own allocator
  /// (MemPool(allocator)) takes its segments from it and gives them back to it, as PyTorch's: the
  /// classic policy whatever the configuration, PyTorch's segment sizes.
  void createOrIncrefPool(c10::DeviceIndex device, mempool_id id,
                          std::shared_ptr<c10_alloc::CUDAAllocator> allocator = nullptr) override {
    create_or_incref_pool(device, id, std::move(allocator));
  }
  /// MemPool(use_on_oom=True) (true) and its destructor (false): see set_use_on_oom. Never throws
  /// for false.
  void setUseOnOOM(c10::DeviceIndex device, mempool_id id, bool use_on_oom) override {
    if (!use_on_oom) {
      detail::reporting_failure("setUseOnOOM", [&] { set_use_on_oom(device, id, false); });
      return;
    }
    set_use_on_oom(device, id, true);
  }
#else
  /// As above (torch < 2.11 passes no allocator ownership and calls setUseOnOOM only for true; a
  /// pool stops being used on out-of-memory when it dies, releasePool).
  void createOrIncrefPool(c10::DeviceIndex device, mempool_id id,
                          c10_alloc::CUDAAllocator* allocator = nullptr) override {
    create_or_incref_pool(device, id, allocator);
  }
  void setUseOnOOM(c10::DeviceIndex device, mempool_id id) override {
    set_use_on_oom(device, id, true);
  }
#endif

#if GPUMEM_TORCH_AT_LEAST(2, 10)
  /// MemPool(no_split=True): pool `id` never splits a block, as PyTorch's no_split pools: each
  /// allocation takes a whole segment (a new one sized as PyTorch sizes segments: 2 MiB for
  /// requests up to 1 MiB, 20 MiB up to 10 MiB, else the request rounded up to 2 MiB) or a whole
  /// cached block that fits. Such a pool runs the classic policy whatever the configuration, so
  /// that each segment is one cudaMalloc (one block); a pool already holding memory keeps its
  /// policy and stops splitting (expandable), or throws c10::Error "not supported by gpumem"
  /// (stitch). An unknown pool is left alone. Throws c10::Error for a bad device.
  void setNoSplit(c10::DeviceIndex device, mempool_id id) override {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    if (p == nullptr) return;
    const memory_usage used = p->allocator->usage();
    if (p->allocator->policy() != allocator_policy::classic && used.reserved == 0) {
      allocator_config classic = s.config;
      classic.policy = allocator_policy::classic;
      auto replacement = make_pool_allocator(s, id, classic, p->device.get());
      if (p->use_count <= 0 && !p->filter) replacement->set_memory_fixed(false);
      std::lock_guard<std::mutex> oom_lock(s.use_on_oom_mutex);  // main's fallback reads it
      p->allocator = std::move(replacement);
    }
    TORCH_CHECK(p->allocator->policy() != allocator_policy::stitch,
                "gpumem: MemPool(no_split=True) is not supported by gpumem for pool (", id.first,
                ", ", id.second,
                "), which already holds memory under the stitch policy (make the pool no_split "
                "before it allocates)");
    p->allocator->set_no_split(true);
  }
#endif

  bool checkPoolLiveAllocations(c10::DeviceIndex device, mempool_id id,
                                const std::unordered_set<void*>& expected) override {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    if (p == nullptr) return expected.empty();
    std::size_t live = 0;
    for (const auto& seg : p->allocator->snapshot()) {
      for (const auto& b : seg.blocks) {
        if (b.state != block_state::active_allocated) continue;
        ++live;
        if (expected.count(reinterpret_cast<void*>(b.address)) == 0) return false;
      }
    }
    return live == expected.size();
  }

  /// PyTorch's wire format: a version byte, then 'c' and the 64-byte cudaIpcMemHandle_t of the
  /// cudaMalloc segment (classic policy), or 'e' and the pages under the block (expandable and
  /// stitch: see share_vmm_block). The offset is the block's distance from what the handle names.
  c10_alloc::ShareableHandle shareIpcHandle(void* ptr) override {
    device_allocator& a = owner_of(ptr, -1);
    if (a.policy() != allocator_policy::classic) {
      if (auto shared = share_vmm_block(a, ptr)) return std::move(*shared);
    }
    void* base = a.base_allocation(ptr).first;
    cudaIpcMemHandle_t handle;
    C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
    std::string out;
    out.push_back(static_cast<char>(ipc_handle_version));
    out.push_back('c');
    out.append(reinterpret_cast<const char*>(&handle), sizeof handle);
    return {static_cast<char*>(ptr) - static_cast<char*>(base), std::move(out)};
  }

  /// Opens a handle from shareIpcHandle, gpumem's or PyTorch's allocator's: a cudaMalloc segment
  /// ('c', cudaIpcOpenMemHandle) or the pages of an expandable segment ('e': each page's file
  /// descriptor taken from the producer with pidfd_getfd, imported and mapped in a range of this
  /// process, on the current device). The same handle opened twice gives the same mapping; it is
  /// closed (unmapped) when its last user drops it.
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    if (handle.size() > 2 && handle[1] == 'e') return open_vmm_handle(std::move(handle));
    const char* raw = handle.data();
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) {  // 64 bytes: a bare legacy handle
      TORCH_CHECK(handle.size() == 2 + sizeof(cudaIpcMemHandle_t),
                  "gpumem: getIpcDevPtr: not a CUDA IPC handle (", handle.size(), " bytes)");
      TORCH_CHECK(handle[1] == 'c', "gpumem: getIpcDevPtr: unknown handle type '", handle[1],
                  "' (gpumem opens 'c', a cudaMalloc segment, and 'e', expandable pages)");
      raw += 2;
    }
    std::lock_guard<std::mutex> lock(ipc_mutex_);
    if (auto open = ipc_open_[handle].lock()) return open;
    cudaIpcMemHandle_t h;
    std::memcpy(&h, raw, sizeof h);
    void* dev_ptr = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev_ptr, h, cudaIpcMemLazyEnablePeerAccess));
    std::shared_ptr<void> open(dev_ptr, [this, handle](void* p) noexcept {
      detail::reporting_failure("closing a CUDA IPC handle", [&] {
        std::lock_guard<std::mutex> l(ipc_mutex_);
        ipc_open_.erase(handle);
      });
      (void)cudaIpcCloseMemHandle(p);
    });
    ipc_open_[handle] = open;
    return open;
  }

  bool isHistoryEnabled() override {
    return history_enabled_.load(std::memory_order_acquire);
  }

#if GPUMEM_TORCH_AT_LEAST(2, 11)
  void recordHistory(bool enabled, c10_alloc::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, c10_alloc::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clear_history,
                   skip_actions);
  }
#else
  void recordHistory(bool enabled, c10_alloc::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, c10_alloc::RecordContext when,
                     bool clear_history) override {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, {});
  }
#endif

#if GPUMEM_TORCH_AT_LEAST(2, 11)
  // torch.cuda.memory._record_memory_history's annotations (record_function markers): kept, while
  // history is recorded, as the snapshot's external_annotations.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!history_enabled_.load(std::memory_order_acquire)) return;
    ::c10::CachingDeviceAllocator::AnnotationEntry entry(c10::cuda::current_device(),
                                                         c10::getApproximateTime());
    entry.time_.t_ = detail::epoch_microseconds();
    for (const auto& [name, value] : md) entry.recordUserMetadata(name, value);
    std::lock_guard<std::mutex> lock(trace_mutex_);
    annotations_.push_back(std::move(entry));
    while (annotations_.size() > max_entries_) annotations_.pop_front();
  }

  // torch.compile's context (the graph being compiled or run), per GPU as in PyTorch: the newest
  // pushed is written on every trace entry of that GPU.
  void pushCompileContext(std::string& md) override {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    per_device(compile_contexts_).push_back(md);
  }

  void popCompileContext() override {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    auto& stack = per_device(compile_contexts_);
    if (!stack.empty()) stack.pop_back();
  }

  // torch.cuda.memory._set_memory_metadata: written on every later trace entry of the GPU.
  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    per_device(user_metadata_) = metadata;
  }

  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    return per_device(user_metadata_);
  }
#endif

#if GPUMEM_TORCH_AT_LEAST(2, 15)
  bool supportsUserMetadata() override {
    return true;
  }

  // torch.cuda.memory._annotate_memory: an "annotate" trace entry for the live allocation at
  // `ptr`, its payload in user_metadata, while history is recorded.
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    if (!history_enabled_.load(std::memory_order_acquire)) return;
    void* p = const_cast<void*>(ptr);
    device_allocator& a = owner_of(p, devices_.size() == 1 ? 0 : c10::cuda::current_device());
    const auto device = static_cast<c10::DeviceIndex>(a.device().index());
    const std::size_t size = a.allocation_size(p);
    std::lock_guard<std::mutex> lock(trace_mutex_);
    c10_alloc::TraceEntry entry(
        c10_alloc::TraceEntry::ANNOTATE, device, reinterpret_cast<std::size_t>(ptr), size, nullptr,
        {0, 0}, c10::getApproximateTime(), nullptr, top_compile_context(device), metadata);
    entry.time_.t_ = detail::epoch_microseconds();
    keep_in_history(device, std::move(entry));
  }
#endif

  void attachOutOfMemoryObserver(c10_alloc::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(c10_alloc::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    trackers_.push_back(std::move(tracker));
    trace_wanted_.store(true, std::memory_order_release);
  }

#if GPUMEM_TORCH_AT_LEAST(2, 12)
  /// Called for each request that throw_on_cudamalloc_oom refuses, with PyTorch's arguments
  /// (device, the segment the miss needed, the reserved bytes counted against the limit, the
  /// device's total memory), on the allocating thread before torch.OutOfMemoryError is raised and
  /// outside every allocator lock (PyTorch calls them on a detached thread). An observer's
  /// exception is reported on stderr, as PyTorch logs it.
  void attachOomRejectionObserver(c10_alloc::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    rejection_observers_.push_back(std::move(observer));
  }
#endif

  /// `dev` may access `dev_to_access`'s memory: peer access for its cudaMalloc segments, and
  /// (PyTorch's addPeerAccess) cuMemSetAccess for every VMM page of every allocator of
  /// `dev_to_access`, mapped now or later, which peer access does not cover.
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    {
      gpumem::detail::cuda_device_guard guard(dev);
      const cudaError_t status = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        C10_CUDA_CHECK(status);
      }
    }
    detail::device_state& s = state(dev_to_access);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    if (std::find(s.peers.begin(), s.peers.end(), dev) != s.peers.end()) return;
    try {
      s.main->add_peer_access(dev);
      if (device_allocator* legacy = legacy_of(s)) legacy->add_peer_access(dev);
      for (auto& p : s.pools) p->allocator->add_peer_access(dev);
    } catch (const cuda_error& e) {
      TORCH_CHECK(false, e.what());
    }
    s.peers.push_back(dev);
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // Pages mapped by the VMM policies are accessible from their own GPU only: across GPUs they
    // go through cudaMemcpyPeerAsync, which works with or without peer access.
    // (enablePeerAccess grants peers the VMM pages too, but a copy engine path through
    // cudaMemcpyPeerAsync is correct either way.)
    const bool vmm = config_.effective_policy(true) != allocator_policy::classic;
    if (dstDevice == srcDevice || (p2p_enabled && !vmm)) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  /// A live private pool's block layout (CUDA-graph trees take one after each recording):
  /// setCheckpointPoolState returns the pool to it. Throws c10::Error for a pool gpumem does not
  /// know or one no longer in use (as PyTorch refuses to checkpoint a freeable pool).
  std::shared_ptr<c10_alloc::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                                mempool_id id) override {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool& p = live_pool(s, id, "getCheckpointState");
    auto out = std::make_shared<detail::pool_checkpoint>();
    out->id = id;
    out->layout = p.allocator->checkpoint();
    return out;
  }

  /// Returns the checkpointed pool to `as` (caching_allocator::restore, under every policy): what
  /// is allocated in the pool now is freed (ptrs_freed; the tensors that held it must not free it
  /// again: CUDA-graph trees swap their deleters), and every block allocated at the checkpoint is
  /// allocated again at its address, handed back as a DataPtr with gpumem's deleter
  /// (dataptrs_allocd; one whose DataPtr is dropped without its deleter stays allocated until
  /// raw_delete). Throws c10::Error for a state gpumem did not make, a pool not in use, or a
  /// checkpoint the pool no longer fits.
  c10_alloc::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10_alloc::AllocatorState> as) override {
    const auto cp = std::dynamic_pointer_cast<detail::pool_checkpoint>(as);
    TORCH_CHECK(cp != nullptr, "gpumem: setCheckpointPoolState of a state that is not from ",
                "gpumem's getCheckpointState");
    detail::device_state& s = state(device);
    checkpoint_delta delta;
    {
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      detail::private_pool& p = live_pool(s, cp->id, "setCheckpointPoolState");
      try {
        delta = p.allocator->restore(cp->layout);
      } catch (const usage_error& e) {
        TORCH_CHECK(false, e.what());
      }
    }
    c10_alloc::CheckpointDelta out;
    out.ptrs_freed = delta.freed;
    for (void* ptr : delta.freed) forget_freed(ptr);
    out.dataptrs_allocd.reserve(delta.allocated.size());
    for (void* ptr : delta.allocated) {
      out.dataptrs_allocd.emplace_back(ptr, ptr, &detail::raw_delete,
                                       c10::Device(c10::DeviceType::CUDA, device));
    }
    return out;
  }

  std::string name() override {
    return "gpumem";
  }

 private:
  friend cuda_allocator& install(const allocator_config& config);

  // PyTorch's native allocator writes version 2 up to torch 2.12, version 3 from 2.13; a reader
  // refuses newer versions, so write the one the running torch reads.
  static constexpr int ipc_handle_version = GPUMEM_TORCH_AT_LEAST(2, 13) ? 3 : 2;

  // --- IPC of the VMM policies' memory, in PyTorch's expandable-segment layout -------------------
  //
  // After the version byte and 'e', PyTorch's ExpandableSegment header as it lays it out on 64-bit
  // Linux — the producer's pid, 4 zero bytes, the page size, the number of pages; from version 3
  // (torch 2.13) also the handle type (PyTorch's Expandable_Segments_Handle_Type: 1 POSIX file
  // descriptors, 2 fabric handles) and 4 zero bytes — then one int per page: the producer's file
  // descriptor for it (cuMemExportToShareableHandle, POSIX), which the consumer duplicates with
  // pidfd_getfd; or, for memory created with fabric handles (expandable_segments_handle_type),
  // the page's 64-byte CUmemFabricHandle, which the consumer imports as it is (version 2 does not
  // name the type: 64 bytes a page tell). The pages are those under the block, from the one holding
  // its first byte to the one holding its last, as PyTorch shares them; the handle's offset is the
  // block's distance from the first page. PyTorch's pages are its segment's (2 MiB small, 20 MiB
  // large), gpumem's its range's: the same under expandable, the granularity (2 MiB) under stitch,
  // where a block lies on part of a range and its pages may be mapped at a second address too — the
  // descriptors name the physical pages, wherever they are mapped.
  struct vmm_share_header {
    std::int32_t pid;
    std::uint32_t zero;  // PyTorch's padding, zeroed so that equal handles are equal strings
    std::uint64_t page_size;
    std::uint64_t pages;
  };
  static_assert(sizeof(vmm_share_header) == 24, "PyTorch's ShareHeader on 64-bit Linux");
  // What version 3 adds to the header. torch 2.15 leaves its padding bytes uninitialised; gpumem
  // zeroes them, and reads neither.
  struct vmm_share_handle_type {
    std::int32_t type;
    std::uint32_t zero;
  };
  static constexpr std::int32_t vmm_posix_fd = 1;  // Expandable_Segments_Handle_Type::POSIX_FD
  static constexpr std::int32_t vmm_fabric = 2;    // Expandable_Segments_Handle_Type::FABRIC_HANDLE

  // The version byte of the 'e' handles gpumem writes: the one PyTorch's allocator of the running
  // torch writes and reads (torch 2.13 and newer read every 'e' handle as version 3). Both are
  // read, whatever the torch.
  static constexpr char vmm_handle_version = GPUMEM_TORCH_AT_LEAST(2, 13) ? 3 : 2;

  static constexpr const char* ipc_cuda_malloc_advice =
      "Or share this tensor from cudaMalloc memory, which CUDA IPC opens without pidfd: allocate "
      "it under policy:classic (with PyTorch's allocator: expandable_segments:False)";

  // The 'e' handle of `ptr`, or nothing when its block lies in a cudaMalloc segment (shared as
  // 'c'). The block's descriptors stay open in this process until it is freed
  // (forget_vmm_export): the consumer takes them from here when it opens the handle.
  std::optional<c10_alloc::ShareableHandle> share_vmm_block(device_allocator& a, void* ptr) {
    std::lock_guard<std::mutex> lock(ipc_mutex_);
    auto it = vmm_exports_.find(ptr);
    if (it == vmm_exports_.end()) {
      shared_block shared;
      try {
        shared = a.share_block(ptr);
      } catch (const usage_error&) {
        return std::nullopt;
      } catch (const cuda_error& e) {
        TORCH_CHECK(false, "gpumem: sharing ", ptr, " with another process: ", e.what());
      }
      it = vmm_exports_.emplace(ptr, std::move(shared)).first;
      vmm_exports_count_.store(vmm_exports_.size(), std::memory_order_release);
    }
    const shared_block& s = it->second;
    const bool fabric = !s.fabric.empty();
    vmm_share_header header{};
    header.pid = static_cast<std::int32_t>(::getpid());
    header.page_size = s.page_size;
    header.pages = s.pages();
    std::string out;
    out.push_back(vmm_handle_version);
    out.push_back('e');
    out.append(reinterpret_cast<const char*>(&header), sizeof header);
    if constexpr (vmm_handle_version >= 3) {
      const vmm_share_handle_type type{fabric ? vmm_fabric : vmm_posix_fd, 0};
      out.append(reinterpret_cast<const char*>(&type), sizeof type);
    }
    for (const int fd : s.fds) {
      const std::int32_t v = fd;
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    for (const fabric_handle& f : s.fabric) {
      out.append(reinterpret_cast<const char*>(f.data()), f.size());
    }
    return c10_alloc::ShareableHandle{static_cast<std::ptrdiff_t>(s.offset), std::move(out)};
  }

  // What the adapter keeps about `ptr`, which is being freed (by a caller or by a checkpoint's
  // restore): its exported descriptors and its recorded allocation context.
  void forget_freed(void* ptr) {
    forget_vmm_export(ptr);
    if (history_enabled_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(trace_mutex_);
      contexts_.erase(ptr);
    }
  }

  // Closes the descriptors exported for `ptr`, which is being freed. Costs one atomic load while
  // nothing is exported.
  void forget_vmm_export(void* ptr) {
    if (vmm_exports_count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard<std::mutex> lock(ipc_mutex_);
    const auto it = vmm_exports_.find(ptr);
    if (it == vmm_exports_.end()) return;
    close_descriptors(it->second);
    vmm_exports_.erase(it);
    vmm_exports_count_.store(vmm_exports_.size(), std::memory_order_release);
  }

  // getIpcDevPtr of an 'e' handle: the producer's pages mapped in a range of this process on the
  // current device, readable and writable there; unmapped when the last user drops the pointer.
  std::shared_ptr<void> open_vmm_handle(std::string handle) {
    vmm_share_header header{};
    TORCH_CHECK(handle.size() >= 2 + sizeof header, "gpumem: getIpcDevPtr: an expandable-segment ",
                "handle of ", handle.size(), " bytes is too short");
    const int version = handle[0];
    TORCH_CHECK(version == 2 || version == 3, "gpumem: getIpcDevPtr: an expandable-segment ",
                "handle of version ", version, ": gpumem reads versions 2 and 3 (PyTorch's ",
                "allocator's up to torch 2.12, and from torch 2.13). ", ipc_cuda_malloc_advice);
    std::memcpy(&header, handle.data() + 2, sizeof header);
    std::size_t header_size = sizeof header;
    bool fabric = false;
    if (version == 3) {
      vmm_share_handle_type type{};
      TORCH_CHECK(handle.size() >= 2 + sizeof header + sizeof type, "gpumem: getIpcDevPtr: a ",
                  "version-3 expandable-segment handle of ", handle.size(), " bytes is too short");
      std::memcpy(&type, handle.data() + 2 + sizeof header, sizeof type);
      TORCH_CHECK(type.type == vmm_posix_fd || type.type == vmm_fabric,
                  "gpumem: getIpcDevPtr: ", "an expandable-segment handle of unknown handle type ",
                  type.type, " (1: POSIX file descriptors, 2: fabric handles)");
      header_size += sizeof type;
      fabric = type.type == vmm_fabric;
    }
    const std::size_t payload = handle.size() - 2 - header_size;
    TORCH_CHECK(
        header.pages > 0 && header.page_size > 0 && header.pages <= payload / sizeof(std::int32_t),
        "gpumem: getIpcDevPtr: malformed expandable-segment handle (", header.pages, " pages of ",
        header.page_size, " bytes, ", payload, " bytes of handles)");
    // Version 2 does not name the handle type: 64 bytes a page are fabric handles.
    if (version == 2 && payload == header.pages * sizeof(fabric_handle)) fabric = true;
    const std::size_t per_page = fabric ? sizeof(fabric_handle) : sizeof(std::int32_t);
    TORCH_CHECK(payload == header.pages * per_page, "gpumem: getIpcDevPtr: malformed ",
                "expandable-segment handle (", payload, " bytes of ",
                fabric ? "fabric handles" : "file descriptors", " for ", header.pages, " pages)");
    const c10::DeviceIndex device = c10::cuda::current_device();
    detail::device_state& s = state(device);
    // As PyTorch, a GPU without fabric access refuses fabric handles before importing any.
    TORCH_CHECK(!fabric || fabric_access(s), "gpumem: getIpcDevPtr: process ", header.pid,
                " shared an expandable segment with fabric handles, but CUDA device ",
                static_cast<int>(device), " does not support fabric access (fabric handles need ",
                "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED and an IMEX channel). Configure ",
                "expandable_segments_handle_type:posix_fd on the producer, or share from ",
                "cudaMalloc memory there (expandable_segments:False)");
    std::lock_guard<std::mutex> lock(ipc_mutex_);
    if (auto open = ipc_open_[handle].lock()) return open;
    ipc_open_.erase(handle);
    shared_block received;
    received.page_size = header.page_size;
    received.size = header.pages * header.page_size;
    const char* payload_start = handle.data() + 2 + header_size;
    if (fabric) {
      received.fabric.resize(header.pages);
      for (std::size_t i = 0; i < received.fabric.size(); ++i) {
        std::memcpy(received.fabric[i].data(), payload_start + i * per_page, per_page);
      }
    } else {
      std::vector<int> remote(header.pages);
      for (std::size_t i = 0; i < remote.size(); ++i) {
        std::int32_t fd = 0;
        std::memcpy(&fd, payload_start + i * per_page, sizeof fd);
        remote[i] = fd;
      }
      received.fds = take_descriptors(header.pid, remote);
    }
    std::shared_ptr<opened_block<cuda_vmm_device>> view;
    try {
      view = std::make_shared<opened_block<cuda_vmm_device>>(s.device, received);
    } catch (const std::exception& e) {
      close_descriptors(received);
      TORCH_CHECK(false, "gpumem: getIpcDevPtr: mapping the ", header.pages,
                  " shared pages of process ", header.pid, " on device ", static_cast<int>(device),
                  ": ", e.what());
    }
    close_descriptors(received);  // the imported handles keep the memory
    cuda_vmm_device* dev = &s.device;
    // The view goes with the deleter, after the device has finished the work that uses it.
    std::shared_ptr<void> open(view->data(), [this, handle, view, dev](void*) noexcept {
      detail::reporting_failure("closing a shared expandable segment", [&] {
        {
          std::lock_guard<std::mutex> l(ipc_mutex_);
          const auto it = ipc_open_.find(handle);
          if (it != ipc_open_.end() && it->second.expired()) ipc_open_.erase(it);
        }
        dev->synchronize();
      });
    });
    ipc_open_[handle] = open;
    return open;
  }

  // The producer's descriptors `remote`, duplicated into this process with pidfd_getfd (Linux
  // 5.6; needs ptrace permission over the producer). Throws c10::Error saying what to do.
  static std::vector<int> take_descriptors(std::int32_t pid, const std::vector<int>& remote) {
    const long pidfd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
    if (pidfd < 0) {
      const int err = errno;
      TORCH_CHECK(false, "gpumem: getIpcDevPtr: pidfd_open(", pid, ") failed: ", std::strerror(err),
                  err == ENOSYS  ? " (the kernel is older than Linux 5.3, or a seccomp filter "
                                   "refuses the call)"
                  : err == ESRCH ? " (the producing process has exited)"
                                 : "",
                  ". ", ipc_cuda_malloc_advice);
    }
    std::vector<int> local;
    local.reserve(remote.size());
    for (const int fd : remote) {
      const long mine = ::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
      if (mine < 0) {
        const int err = errno;
        for (const int m : local) ::close(m);
        ::close(static_cast<int>(pidfd));
        TORCH_CHECK(
            false, "gpumem: getIpcDevPtr: pidfd_getfd(descriptor ", fd, " of process ", pid,
            ") failed: ", std::strerror(err),
            err == EPERM
                ? " (this process may not ptrace the producer: under kernel.yama.ptrace_scope=1, "
                  "Ubuntu's default, only an ancestor may, unless the producer allows it with "
                  "prctl(PR_SET_PTRACER); or set the sysctl to 0, or give the consumer "
                  "CAP_SYS_PTRACE, which containers drop by default)"
            : err == ENOSYS ? " (the kernel is older than Linux 5.6, or a seccomp filter refuses "
                              "the call)"
            : err == EBADF  ? " (the producer no longer has it open: the tensor was freed before "
                              "this process opened it)"
                            : "",
            ". ", ipc_cuda_malloc_advice);
      }
      local.push_back(static_cast<int>(mine));
    }
    ::close(static_cast<int>(pidfd));
    return local;
  }

  explicit cuda_allocator(allocator_config config)
      : config_(std::move(config)), run_time_config_(config_) {
    trace_wanted_.store(oom_snapshot_on(), std::memory_order_release);
  }

  bool oom_snapshot_on() const noexcept {
    return !config_.oom_snapshot.empty();
  }

  static bool is_default(const mempool_id& id) noexcept {
    return id.first == 0 && id.second == 0;
  }

  detail::device_state& state(c10::DeviceIndex device) {
    if (!initialized()) init(cuda_device::device_count());
    TORCH_CHECK(device >= 0 && static_cast<std::size_t>(device) < devices_.size(),
                "gpumem: invalid device index ", static_cast<int>(device), " (", devices_.size(),
                " CUDA device(s))");
    detail::device_state& s = *devices_[static_cast<std::size_t>(device)];
    std::call_once(s.created, [&] {
      std::lock_guard<std::mutex> settings_lock(settings_mutex_);  // set_run_time_settings
      s.config = run_time_config_;
      if (s.config.effective_policy(true) != allocator_policy::classic &&
          !cuda_vmm_device::supported(device)) {
        s.config.policy = allocator_policy::classic;  // as PyTorch falls back from expandable
      }
      if (s.config.effective_policy(true) != allocator_policy::classic) {
        s.device = cuda_vmm_device(device, handle_type_for(s));
      }
      try {
        s.main = make_allocator(s, {0, 0});
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "gpumem: cannot start on CUDA device ", static_cast<int>(device), ": ",
                    e.what());
      }
    });
    return s;
  }

  // The handle type GPU `s` creates VMM memory with: gpumem's expandable_segments_handle_type,
  // else PyTorch's setting of that name where set from C++. `fabric` on a GPU without fabric
  // access is refused, as PyTorch 2.13 and newer refuse it.
  static cuda_vmm_device::shareable_handle handle_type_for(detail::device_state& s) {
    vmm_handle_type type = s.config.expandable_segments_handle_type;
    if (type == vmm_handle_type::automatic) {
      using pytorch_type = c10_alloc::Expandable_Segments_Handle_Type;
      const pytorch_type set = c10_alloc::CUDAAllocatorConfig::expandable_segments_handle_type();
      if (set == pytorch_type::POSIX_FD) type = vmm_handle_type::posix_fd;
      if (set == pytorch_type::FABRIC_HANDLE) type = vmm_handle_type::fabric;
    }
    switch (type) {
      case vmm_handle_type::posix_fd:
        return cuda_vmm_device::shareable_handle::posix_fd;
      case vmm_handle_type::fabric:
        TORCH_CHECK(fabric_access(s), "gpumem: expandable_segments_handle_type:fabric, but CUDA ",
                    "device ", s.device.index(), " does not support fabric access (fabric ",
                    "handles need CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED and an IMEX ",
                    "channel). Set expandable_segments_handle_type:posix_fd in GPUMEM_ALLOC_CONF, ",
                    "or use policy:classic");
        return cuda_vmm_device::shareable_handle::fabric;
      case vmm_handle_type::automatic:
        break;
    }
    return fabric_access(s) ? cuda_vmm_device::shareable_handle::fabric
                            : cuda_vmm_device::shareable_handle::posix_fd;
  }

  // Whether GPU `s` exports and imports fabric handles, asked once.
  static bool fabric_access(detail::device_state& s) {
    int known = s.fabric_access.load(std::memory_order_acquire);
    if (known < 0) {
      known = s.device.fabric_supported() ? 1 : 0;
      s.fabric_access.store(known, std::memory_order_release);
    }
    return known == 1;
  }

  std::unique_ptr<device_allocator> make_allocator(detail::device_state& s, mempool_id id) {
    return make_allocator(s, id, s.config);
  }

  std::unique_ptr<device_allocator> make_allocator(detail::device_state& s, mempool_id id,
                                                   const allocator_config& config,
                                                   cuda_vmm_device* own_device = nullptr) {
    // own_device: a pool's own (one with a segment source), else the GPU's.
    auto a =
        std::make_unique<device_allocator>(own_device != nullptr ? *own_device : s.device, config);
    const auto device = static_cast<c10::DeviceIndex>(s.device.index());
    a->set_event_observer(
        [this, device, id](const allocator_event<cudaStream_t>& e) { on_event(device, id, e); });
    if (history_enabled_.load(std::memory_order_acquire) || oom_snapshot_on()) {
      a->set_reserved_events(true);
    }
    if (is_default(id)) {
      // PyTorch's try_mempool_fallback: the default pool's miss borrows from the pools marked
      // use-on-OOM before it frees its cache (an allocation into a private pool never does).
      a->set_out_of_memory_fallback([&s](std::size_t size, cudaStream_t stream) {
        return borrow_from_use_on_oom_pools(s, size, stream);
      });
    }
    return a;
  }

  // A cached block of the first pool marked use-on-OOM that has one for `size` on `stream`, or
  // nullptr. Runs under main's lock (its out-of-memory fallback).
  static void* borrow_from_use_on_oom_pools(detail::device_state& s, std::size_t size,
                                            cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(s.use_on_oom_mutex);
    for (detail::private_pool* p : s.use_on_oom) {
      if (void* ptr = p->allocator->allocate_cached(size, stream)) return ptr;
    }
    return nullptr;
  }

  // Marks pool `id` of `device` use-on-OOM (appended to the list once) or not. An unknown or dead
  // pool is not marked. Throws c10::Error for a bad device.
  void set_use_on_oom(c10::DeviceIndex device, const mempool_id& id, bool use_on_oom) {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    detail::private_pool* p = find_pool(s, id);
    if (p == nullptr) return;
    if (!use_on_oom || p->use_count <= 0) {
      stop_use_on_oom(s, p);
      return;
    }
    std::lock_guard<std::mutex> oom_lock(s.use_on_oom_mutex);
    if (std::find(s.use_on_oom.begin(), s.use_on_oom.end(), p) == s.use_on_oom.end()) {
      s.use_on_oom.push_back(p);
    }
  }

  // Takes pool p off the use-on-OOM list. Call with s.pools_mutex held.
  static void stop_use_on_oom(detail::device_state& s, detail::private_pool* p) {
    std::lock_guard<std::mutex> lock(s.use_on_oom_mutex);
    s.use_on_oom.erase(std::remove(s.use_on_oom.begin(), s.use_on_oom.end(), p),
                       s.use_on_oom.end());
  }

  // Pool `id`, which must be known and in use, for `what`. Call with s.pools_mutex held.
  static detail::private_pool& live_pool(detail::device_state& s, const mempool_id& id,
                                         const char* what) {
    detail::private_pool* p = find_pool(s, id);
    TORCH_CHECK(p != nullptr, "gpumem: ", what, ": no pool (", id.first, ", ", id.second, ")");
    TORCH_CHECK(p->use_count > 0, "gpumem: ", what, ": pool (", id.first, ", ", id.second,
                ") is no longer in use");
    return *p;
  }

  static detail::private_pool* find_pool(detail::device_state& s, const mempool_id& id) {
    for (auto& p : s.pools) {
      if (p->id == id) return p.get();
    }
    return nullptr;
  }

  // A pool's allocator: its memory fixed while the pool is in use (a captured graph keeps using
  // its addresses), counted with the device's against the memory fraction, granted to the
  // device's peers, and in every capture under way on the device.
  // A pool with a segment source runs classic on it (PyTorch's pools with their own allocator
  // never use expandable segments).
  detail::private_pool& make_pool(detail::device_state& s, const mempool_id& id,
                                  std::unique_ptr<segment_source> source = nullptr) {
    auto p = std::make_unique<detail::private_pool>();
    p->id = id;
    allocator_config config = s.config;
    if (source) {
      p->source = std::move(source);
      p->device = std::make_unique<cuda_vmm_device>(s.device);
      p->device->set_segment_source(p->source.get());
      config.policy = allocator_policy::classic;
    }
    p->allocator = make_pool_allocator(s, id, config, p->device.get());
    s.pools.push_back(std::move(p));
    return *s.pools.back();
  }

  // A pool's allocator running `config`, set up as above (memory fixed: for a pool in use). Call
  // with s.pools_mutex held.
  std::unique_ptr<device_allocator> make_pool_allocator(detail::device_state& s,
                                                        const mempool_id& id,
                                                        const allocator_config& config,
                                                        cuda_vmm_device* device) {
    auto a = make_allocator(s, id, config, device);
    a->set_memory_fixed(true);
    join_device(s, *a);
    return a;
  }

  // What every allocator of a GPU besides its default pool's shares with it: the memory limit and
  // fraction, the peers given access, and the captures under way. Call with s.pools_mutex held.
  void join_device(detail::device_state& s, device_allocator& a) const {
    a.share_memory_limit_with(*s.main);
    const double fraction = s.main->memory_fraction();
    if (fraction < 1.0) a.set_memory_fraction(fraction);
    for (int peer : s.peers) a.add_peer_access(peer);
    if (!s.active.empty()) a.set_capture_record_stream_reuse(capture_record_stream_reuse());
    for (std::size_t i = 0; i < s.active.size(); ++i) a.begin_capture();
  }

  // graph_capture_record_stream_reuse: gpumem's setting, or PyTorch's as set at run time.
  bool capture_record_stream_reuse() const {
#if GPUMEM_TORCH_AT_LEAST(2, 9)
    if (c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::graph_capture_record_stream_reuse()) {
      return true;
    }
#endif
    return config_.graph_capture_record_stream_reuse;
  }

  // Call with s.pools_mutex held.
  static void erase_pool(detail::device_state& s, const mempool_id& id) {
    if (detail::private_pool* p = find_pool(s, id)) stop_use_on_oom(s, p);
    s.pools.erase(
        std::remove_if(s.pools.begin(), s.pools.end(), [&](const auto& p) { return p->id == id; }),
        s.pools.end());
  }

  void create_or_incref_pool(c10::DeviceIndex device, mempool_id id,
                             detail::pool_allocator_handle allocator) {
    detail::device_state& s = state(device);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    if (detail::private_pool* p = find_pool(s, id)) {
      ++p->use_count;
      p->allocator->set_memory_fixed(true);
    } else if (allocator != nullptr && &*allocator != this) {
      make_pool(s, id, std::make_unique<detail::pool_allocator_source>(std::move(allocator)));
    } else {
      make_pool(s, id);
    }
  }

  // Returns the cache of s's dead pools to the device and forgets those left holding nothing.
  // True when any memory went back. Call with s.pools_mutex held. Throws cuda_error on device
  // failure (the pools freed so far stay freed).
  static bool release_dead_pools(detail::device_state& s) {
    bool released = false;
    for (std::size_t i = 0; i < s.pools.size();) {
      detail::private_pool& p = *s.pools[i];
      if (p.use_count > 0 || p.filter) {
        ++i;
        continue;
      }
      const std::size_t reserved = p.allocator->usage().reserved;
      p.allocator->empty_cache();
      const memory_usage now = p.allocator->usage();
      released = released || now.reserved < reserved;
      if (now.allocated == 0 && now.reserved == 0) {
        stop_use_on_oom(s, &p);
        s.pools.erase(s.pools.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    return released;
  }

  // emptyCache(id) for a private pool: its cache back to the device on every GPU that has it;
  // a dead pool left holding nothing is forgotten.
  void empty_pool_cache(const mempool_id& id) {
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      detail::device_state& s = *devices_[d];
      if (!s.main) continue;
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      detail::private_pool* p = find_pool(s, id);
      if (p == nullptr) continue;
      p->allocator->empty_cache();
      const memory_usage now = p->allocator->usage();
      if (p->use_count <= 0 && !p->filter && now.allocated == 0 && now.reserved == 0) {
        erase_pool(s, id);
      }
    }
  }

  template <class F>
  void for_each_allocator(c10::DeviceIndex device, F&& f) {
    detail::device_state& s = state(device);
    f(*s.main);
    if (device_allocator* legacy = legacy_of(s)) f(*legacy);
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    for (auto& p : s.pools) f(*p->allocator);
  }

  static void add_stats(c10::CachingDeviceAllocator::DeviceStats& out, const device_stats& in) {
    detail::copy_stats(in.allocation, out.allocation);
    detail::copy_stats(in.segment, out.segment);
    detail::copy_stats(in.active, out.active);
    detail::copy_stats(in.inactive_split, out.inactive_split);
    detail::copy_stats(in.allocated_bytes, out.allocated_bytes);
    detail::copy_stats(in.reserved_bytes, out.reserved_bytes);
    detail::copy_stats(in.active_bytes, out.active_bytes);
    detail::copy_stats(in.inactive_split_bytes, out.inactive_split_bytes);
    detail::copy_stats(in.requested_bytes, out.requested_bytes);
    out.num_alloc_retries += in.num_alloc_retries;
    out.num_ooms += in.num_ooms;
    out.num_sync_all_streams += in.num_sync_all_streams;
    out.num_device_alloc += in.num_device_alloc;
    out.num_device_free += in.num_device_free;
#if GPUMEM_TORCH_AT_LEAST(2, 12)
    out.num_oom_rejections += in.num_oom_rejections;
#endif
    detail::copy_stat(in.oversize_allocations, out.oversize_allocations);
    detail::copy_stat(in.oversize_segments, out.oversize_segments);
  }

  static device_stats to_gpumem(const c10::CachingDeviceAllocator::DeviceStats& in) {
    device_stats out;
    auto copy = [](const auto& from, stat_array& to) {
      for (std::size_t i = 0; i < num_stat_types; ++i) {
        to[i] = stat{from[i].current, from[i].peak, from[i].allocated, from[i].freed};
      }
    };
    copy(in.allocation, out.allocation);
    copy(in.segment, out.segment);
    copy(in.active, out.active);
    copy(in.inactive_split, out.inactive_split);
    copy(in.allocated_bytes, out.allocated_bytes);
    copy(in.reserved_bytes, out.reserved_bytes);
    copy(in.active_bytes, out.active_bytes);
    copy(in.inactive_split_bytes, out.inactive_split_bytes);
    copy(in.requested_bytes, out.requested_bytes);
    out.num_alloc_retries = in.num_alloc_retries;
    out.num_ooms = in.num_ooms;
    out.num_sync_all_streams = in.num_sync_all_streams;
    out.num_device_alloc = in.num_device_alloc;
    out.num_device_free = in.num_device_free;
#if GPUMEM_TORCH_AT_LEAST(2, 12)
    out.num_oom_rejections = in.num_oom_rejections;
#endif
    out.oversize_allocations = {in.oversize_allocations.current, in.oversize_allocations.peak,
                                in.oversize_allocations.allocated, in.oversize_allocations.freed};
    out.oversize_segments = {in.oversize_segments.current, in.oversize_segments.peak,
                             in.oversize_segments.allocated, in.oversize_segments.freed};
    out.max_split_size = in.max_split_size;
    return out;
  }

  // --- allocation
  // ---------------------------------------------------------------------------------

  void* malloc_on(c10::DeviceIndex device, std::size_t nbytes, cudaStream_t stream) {
    // PyTorch's words for a size no device has (before any statistic moves, as in PyTorch).
    TORCH_CHECK_WITH(OutOfMemoryError, nbytes <= gpumem::detail::k_max_request,
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    detail::device_state& s = state(device);
    std::shared_ptr<c10::GatheredContext> context;
    const bool history = history_enabled_.load(std::memory_order_acquire);
    if (history && record_context_ >= c10_alloc::RecordContext::STATE && context_recorder_) {
      context = context_recorder_();  // outside every allocator lock, as PyTorch does
    }
    pending_context() = history && record_context_ >= c10_alloc::RecordContext::ALLOC
                            ? context
                            : std::shared_ptr<c10::GatheredContext>{};
    void* ptr = nullptr;
    for (bool retried = false;; retried = true) {
      try {
        ptr = allocate_routed(s, nbytes, stream);
        break;
      } catch (const out_of_memory& e) {
        pending_context().reset();
        if (e.info().preemptive_rejection) {  // no retry: PyTorch frees nothing either
          report_rejection(device, e);
          TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
        }
        if (!retried && release_dead_pools_after_oom(s)) continue;
        write_oom_snapshot(device);
        report_oom(device, nbytes, e);
        TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
      } catch (const cuda_error& e) {
        pending_context().reset();
        TORCH_CHECK(false, e.what());
      }
    }
    pending_context().reset();
    if (context) {
      std::lock_guard<std::mutex> lock(trace_mutex_);
      contexts_[ptr] = std::move(context);
    }
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      report_to_profiler(device, ptr, static_cast<std::int64_t>(nbytes));
    }
    return ptr;
  }

  // torch.profiler(profile_memory=True): each allocation (+) and free (-) with the GPU's
  // allocated and reserved totals, as PyTorch's allocator reports them.
  void report_to_profiler(c10::DeviceIndex device, void* ptr, std::int64_t bytes) {
    const c10::CachingDeviceAllocator::DeviceStats stats = getDeviceStats(device);
    c10::reportMemoryUsageToProfiler(ptr, bytes,
                                     static_cast<std::size_t>(stats.allocated_bytes[0].current),
                                     static_cast<std::size_t>(stats.reserved_bytes[0].current),
                                     c10::Device(c10::DeviceType::CUDA, device));
  }

  // Under _record_memory_history(context="all"): the stack of a free or an empty_cache, for the
  // trace entries it causes (PyTorch records them too); empty otherwise.
  std::shared_ptr<c10::GatheredContext> free_context() {
    if (!history_enabled_.load(std::memory_order_acquire)) return nullptr;
    c10_alloc::CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> lock(trace_mutex_);
      if (record_context_ != c10_alloc::RecordContext::ALL) return nullptr;
      recorder = context_recorder_;
    }
    return recorder != nullptr ? recorder() : nullptr;
  }

  static device_allocator* legacy_of(const detail::device_state& s) noexcept {
    return s.legacy.load(std::memory_order_acquire);
  }

  // The default pool's allocator for a new allocation: s's legacy allocator while legacy segments
  // are asked for and the GPU runs a VMM policy, else main.
  device_allocator& default_allocator(detail::device_state& s) {
    if (C10_LIKELY(!legacy_segments_.load(std::memory_order_relaxed)) ||
        s.main->policy() == allocator_policy::classic) {
      return *s.main;
    }
    if (device_allocator* legacy = legacy_of(s)) return *legacy;
    return make_legacy_allocator(s);
  }

  // s's legacy allocator, made once: the default pool's (its trace entries and out-of-memory
  // fallback are main's), classic, counted with main against the memory fraction, granted to the
  // GPU's peers, and in every capture under way on the GPU.
  device_allocator& make_legacy_allocator(detail::device_state& s) {
    std::lock_guard<std::mutex> lock(s.pools_mutex);
    if (device_allocator* legacy = legacy_of(s)) return *legacy;
    allocator_config classic = s.config;
    classic.policy = allocator_policy::classic;
    auto a = make_allocator(s, {0, 0}, classic);
    join_device(s, *a);
    s.legacy_owner = std::move(a);
    s.legacy.store(s.legacy_owner.get(), std::memory_order_release);
    return *s.legacy_owner;
  }

  // Allocates where PyTorch would: in the most recently begun pool being allocated to whose
  // filter takes `stream`, else in the default pool.
  void* allocate_routed(detail::device_state& s, std::size_t nbytes, cudaStream_t stream) {
    if (s.allocating_to_pools.load(std::memory_order_acquire) == 0) {
      return default_allocator(s).allocate(nbytes, stream);
    }
    std::unique_lock<std::mutex> pools_lock(s.pools_mutex);  // keeps the pool alive meanwhile
    device_allocator* a = nullptr;
    for (auto it = s.active.rbegin(); it != s.active.rend(); ++it) {
      if ((*it)->filter(stream)) {
        a = (*it)->allocator.get();
        break;
      }
    }
    if (a == nullptr) {
      pools_lock.unlock();
      return default_allocator(s).allocate(nbytes, stream);
    }
    // During stream capture, cudaMalloc is allowed only in relaxed mode (as PyTorch does).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* ptr = nullptr;
    try {
      ptr = a->allocate(nbytes, stream);
    } catch (...) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    return ptr;
  }

  // After an out-of-memory error, as PyTorch does: returns the dead pools' caches to the device,
  // true when that freed anything (the allocation is then tried once more; the first failure
  // stays counted in num_ooms). Not while any pool is being allocated to, since a CUDA-graph
  // capture may be under way and device memory must not be freed during one. Never throws.
  bool release_dead_pools_after_oom(detail::device_state& s) noexcept {
    if (s.allocating_to_pools.load(std::memory_order_acquire) > 0) return false;
    try {
      // A live private pool's miss cannot free its own memory: the default pool's cache goes
      // too, as PyTorch's retry frees it for any pool.
      bool main_released = false;
      for (device_allocator* a : {s.main.get(), legacy_of(s)}) {
        if (a == nullptr) continue;
        const std::size_t before = a->usage().reserved;
        a->empty_cache();
        main_released = a->usage().reserved < before || main_released;
      }
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      return release_dead_pools(s) || main_released;
    } catch (...) {
      return false;  // the out-of-memory error stands
    }
  }

  void report_oom(c10::DeviceIndex device, std::size_t nbytes, const out_of_memory& e) {
    std::vector<c10_alloc::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mutex_);
      observers = oom_observers_;
    }
    // PyTorch's arguments: the device, the size asked of the device (the segment or pages the
    // miss needed), the memory allowed (the fraction's cap when one is set, else the device's
    // total) and the device's free memory.
    (void)nbytes;
    const auto& d = e.info();
    const std::optional<std::size_t> cap = state(device).main->memory_cap_bytes();
    const std::size_t allowed = cap && *cap < d.device_total_bytes ? *cap : d.device_total_bytes;
    for (const auto& observer : observers) {
      observer(device, d.device_request_bytes, allowed, d.device_free_bytes);
    }
  }

  // PyTorch's arguments for the OOM rejection observers. Never throws.
  void report_rejection(c10::DeviceIndex device, const out_of_memory& e) noexcept {
#if GPUMEM_TORCH_AT_LEAST(2, 12)
    const auto& d = e.info();
    std::vector<c10_alloc::OomRejectionObserver> observers;
    try {
      std::lock_guard<std::mutex> lock(observers_mutex_);
      observers = rejection_observers_;
    } catch (...) {
      return;
    }
    for (const auto& observer : observers) {
      detail::reporting_failure("OOM rejection observer", [&] {
        observer(device, d.device_request_bytes, d.counted_reserved_bytes, d.device_total_bytes);
      });
    }
#else
    (void)device, (void)e;
#endif
  }

  // --- caching disabled (enable(false))
  // -----------------------------------------------------------

  // PyTorch's uncached_allocate: one cudaMalloc on `device` (current), remembered so that its free
  // is a cudaFree whenever it comes.
  void* uncached_allocate(c10::DeviceIndex device, std::size_t nbytes) {
    if (nbytes == 0) return nullptr;
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                       gpumem::detail::format_size(nbytes), " on CUDA device ",
                       static_cast<int>(device),
                       " with the caching allocator disabled "
                       "(torch.cuda.caching_allocator_enable(False)): cudaMalloc failed");
    }
    C10_CUDA_CHECK(status);
    try {
      std::lock_guard<std::mutex> lock(uncached_mutex_);
      uncached_.emplace(ptr, device);
    } catch (...) {
      (void)cudaFree(ptr);
      throw;
    }
    return ptr;
  }

  // cudaFree of memory from uncached_allocate: false (nothing done) for any other pointer.
  bool free_uncached(void* ptr) {
    c10::DeviceIndex device = 0;
    {
      std::lock_guard<std::mutex> lock(uncached_mutex_);
      auto it = uncached_.find(ptr);
      if (it == uncached_.end()) return false;
      device = it->second;
      uncached_.erase(it);
    }
    gpumem::detail::cuda_device_guard guard(device);
    C10_CUDA_CHECK(cudaFree(ptr));
    return true;
  }

  // Frees `ptr` in whichever allocator has it: the hinted device's default pool first.
  bool free_anywhere(void* ptr, int hint) {
    forget_freed(ptr);
    pending_context() = free_context();
    struct reset_context {
      ~reset_context() { pending_context().reset(); }
    } reset;
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      for (const auto& state : devices_) {
        if (state->main && state->main->owns(ptr)) {
          const std::size_t size = state->main->allocation_size(ptr);
          const bool freed = state->main->try_deallocate(ptr);
          if (freed) {
            report_to_profiler(static_cast<c10::DeviceIndex>(state->device.index()), ptr,
                               -static_cast<std::int64_t>(size));
          }
          return freed;
        }
      }
    }
    const std::size_t n = devices_.size();
    for (std::size_t k = 0; k < n; ++k) {
      detail::device_state& s = *devices_[(static_cast<std::size_t>(hint) + k) % n];
      if (!s.main) continue;
      if (s.main->try_deallocate(ptr)) return true;
      if (device_allocator* legacy = legacy_of(s); legacy && legacy->try_deallocate(ptr)) {
        return true;
      }
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      for (auto& p : s.pools) {
        if (p->allocator->try_deallocate(ptr)) return true;
      }
    }
    return false;
  }

  device_allocator& owner_of(void* ptr, int hint) {
    const std::size_t n = devices_.size();
    const std::size_t first = hint >= 0 ? static_cast<std::size_t>(hint) : 0;
    for (std::size_t k = 0; k < n; ++k) {
      detail::device_state& s = *devices_[(first + k) % n];
      if (!s.main) continue;
      if (s.main->owns(ptr)) return *s.main;
      if (device_allocator* legacy = legacy_of(s); legacy && legacy->owns(ptr)) return *legacy;
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      for (auto& p : s.pools) {
        if (p->allocator->owns(ptr)) return *p->allocator;
      }
    }
    TORCH_CHECK(false, "gpumem: ", ptr, " is not a live allocation of gpumem");
  }

  // --- history and trace trackers -------------------------------------------------------------

  static std::shared_ptr<c10::GatheredContext>& pending_context() {
    thread_local std::shared_ptr<c10::GatheredContext> context;
    return context;
  }

  void record_history(bool enabled, c10_alloc::CreateContextFn context_recorder,
                      std::size_t max_entries, c10_alloc::RecordContext when, bool clear_history,
                      const std::vector<std::string>& skip_actions) {
    set_history_options(enabled, context_recorder, max_entries, when, clear_history, skip_actions);
    // After trace_mutex_ is released: an allocator's lock comes before it.
    for (const auto& state : devices_) {
      if (!state->main) continue;
      const bool reserved_events = enabled || oom_snapshot_on();
      state->main->set_reserved_events(reserved_events);
      if (device_allocator* legacy = legacy_of(*state))
        legacy->set_reserved_events(reserved_events);
      std::lock_guard<std::mutex> lock(state->pools_mutex);
      for (auto& p : state->pools) p->allocator->set_reserved_events(reserved_events);
    }
  }

  void set_history_options(bool enabled, c10_alloc::CreateContextFn context_recorder,
                           std::size_t max_entries, c10_alloc::RecordContext when,
                           bool clear_history, const std::vector<std::string>& skip_actions) {
    std::lock_guard<std::mutex> lock(trace_mutex_);
    context_recorder_ = enabled ? context_recorder : nullptr;
    record_context_ = enabled ? when : c10_alloc::RecordContext::NEVER;
    max_entries_ = std::max<std::size_t>(max_entries, 1);
    skip_ = 0;
    for (const std::string& name : skip_actions) {
      for (int a = 0; a <= static_cast<int>(allocator_action::oom); ++a) {
        if (name == gpumem::to_string(static_cast<allocator_action>(a))) skip_ |= 1u << a;
      }
    }
    if (clear_history || !enabled) {
      for (auto& h : history_) h.clear();
#if GPUMEM_TORCH_AT_LEAST(2, 11)
      annotations_.clear();
#endif
    }
    history_enabled_.store(enabled, std::memory_order_release);
    trace_wanted_.store(enabled || !trackers_.empty() || oom_snapshot_on(),
                        std::memory_order_release);
  }

  // Called by every allocator with its lock held: builds PyTorch's trace entry, hands it to the
  // trackers, keeps it in the history. While history is recorded, stitch reports its segment
  // events twice (set_reserved_events): the device's mappings go to the trackers (NCCL registers
  // every mapped address), what reserved memory counts to the history (a page mapped at two
  // addresses counts once, so memory_viz rebuilds memory_reserved() event by event).
  void on_event(c10::DeviceIndex device, mempool_id pool, const allocator_event<cudaStream_t>& e) {
    if (!trace_wanted_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(trace_mutex_);
    // The snapshot's events follow reserved memory, as the history does (segment_view).
    if (oom_snapshot_on() && e.view != segment_view::device) {
      if (oom_rings_.size() <= static_cast<std::size_t>(device)) oom_rings_.resize(device + 1);
      auto& ring = oom_rings_[static_cast<std::size_t>(device)];
      if (!ring) ring = std::make_unique<oom_event_ring>(config_.oom_snapshot_max_entries);
      // No time stamp: reading a clock would cost more than the rest of the recording.
      ring->push(
          {e.action, e.address, e.size, gpumem::detail::snapshot_stream_id(e.stream), no_time});
      ++oom_ring_pushes_;
    }
    if (trackers_.empty() && !history_enabled_.load(std::memory_order_relaxed)) return;
    // An alloc's stack (context >= "alloc"); a free's or empty_cache's (context="all": set by
    // free_anywhere / emptyCache only then).
    std::shared_ptr<c10::GatheredContext> context = pending_context();
#if GPUMEM_TORCH_AT_LEAST(2, 11)
    c10_alloc::TraceEntry entry(detail::trace_action(e.action), device, e.address, e.size, e.stream,
                                pool, c10::getApproximateTime(), std::move(context),
                                top_compile_context(device), user_metadata_of(device));
#else
    c10_alloc::TraceEntry entry(detail::trace_action(e.action), device, e.address, e.size, e.stream,
                                pool, c10::getApproximateTime(), std::move(context));
#endif
    entry.time_.t_ = detail::epoch_microseconds();
    if (e.view != segment_view::reserved) {
      for (const auto& tracker : trackers_) tracker(entry);
    }
    if (e.view == segment_view::device) return;
    if (!history_enabled_.load(std::memory_order_relaxed)) return;
    if ((skip_ >> static_cast<int>(e.action)) & 1u) return;
    keep_in_history(device, std::move(entry));
  }

  // With trace_mutex_ held: the newest `max_entries_` entries per GPU.
  void keep_in_history(c10::DeviceIndex device, c10_alloc::TraceEntry entry) {
    if (history_.size() <= static_cast<std::size_t>(device)) history_.resize(device + 1);
    auto& h = history_[static_cast<std::size_t>(device)];
    h.push_back(std::move(entry));
    while (h.size() > max_entries_) h.pop_front();
  }

  // With trace_mutex_ held: the current GPU's element of a per-GPU list, grown as needed.
  template <class T>
  static T& per_device(std::vector<T>& v, int device = c10::cuda::current_device()) {
    if (v.size() <= static_cast<std::size_t>(device))
      v.resize(static_cast<std::size_t>(device) + 1);
    return v[static_cast<std::size_t>(device)];
  }

  std::string top_compile_context(c10::DeviceIndex device) {
    const auto& stack = per_device(compile_contexts_, device);
    return stack.empty() ? std::string() : stack.back();
  }

  std::string user_metadata_of(c10::DeviceIndex device) {
    return per_device(user_metadata_, device);
  }

  // --- snapshot on out-of-memory (oom_snapshot:DIR; gpumem/torch/oom_snapshot.hpp) ------------

  // Before the out-of-memory error of `device` is raised: writes its snapshot and says on stderr
  // where and how to replay it, or why not. Never throws: the out-of-memory error is what the
  // caller must see.
  void write_oom_snapshot(c10::DeviceIndex device) noexcept {
    if (!oom_snapshot_on()) return;
    try {
      std::lock_guard<std::mutex> serial(oom_snapshot_mutex_);  // one failure's file at a time
      if (oom_snapshots_written_ >= oom_snapshot_max_files) {
        std::fprintf(stderr,
                     "gpumem: out of memory on cuda:%d: no snapshot written (this process wrote "
                     "%zu already, the most it writes)\n",
                     static_cast<int>(device), oom_snapshot_max_files);
        return;
      }
      detail::device_state& s = state(device);
      std::vector<segment_snapshot<cudaStream_t>> segments;
      std::vector<snapshot_trace_entry> events;
      // The segments and the events must describe the same moment: another thread may allocate
      // in between, so take both again when an event arrived meanwhile (events are pushed with an
      // allocator's lock held, and snapshot() takes it).
      for (int attempt = 0; attempt < 3; ++attempt) {
        std::uint64_t pushes = 0;
        {
          std::lock_guard<std::mutex> lock(trace_mutex_);
          pushes = oom_ring_pushes_;
        }
        segments = s.main->snapshot();
        if (device_allocator* legacy = legacy_of(s)) {
          auto more = legacy->snapshot();
          segments.insert(segments.end(), std::make_move_iterator(more.begin()),
                          std::make_move_iterator(more.end()));
        }
        {
          std::lock_guard<std::mutex> lock(s.pools_mutex);
          for (auto& p : s.pools) {
            auto more = p->allocator->snapshot();
            segments.insert(segments.end(), std::make_move_iterator(more.begin()),
                            std::make_move_iterator(more.end()));
          }
        }
        std::lock_guard<std::mutex> lock(trace_mutex_);
        const auto d = static_cast<std::size_t>(device);
        events = d < oom_rings_.size() && oom_rings_[d] ? oom_rings_[d]->events()
                                                        : std::vector<snapshot_trace_entry>{};
        if (pushes == oom_ring_pushes_) break;
      }
      // Out-of-memory errors the program caught earlier leave the history: the reader takes the
      // first oom event for the request that failed, and a replay must go past those (their
      // requests allocated nothing) to this one.
      std::size_t last_oom = events.size();
      for (std::size_t i = 0; i < events.size(); ++i) {
        if (events[i].action == allocator_action::oom) last_oom = i;
      }
      std::vector<snapshot_trace_entry> kept;
      kept.reserve(events.size());
      for (std::size_t i = 0; i < events.size(); ++i) {
        if (events[i].action != allocator_action::oom || i == last_oom) kept.push_back(events[i]);
      }
      events.swap(kept);
      const std::string name =
          oom_snapshot_file_name(oom_snapshot_rank(), oom_snapshot_host(),
                                 static_cast<long>(::getpid()), oom_snapshots_written_ + 1);
      const std::string path = gpumem::torch::write_oom_snapshot(
          config_.oom_snapshot, name, segments, events, recorded_settings(s.config), device);
      ++oom_snapshots_written_;
      std::fprintf(stderr, "%s\n", oom_snapshot_message(device, path).c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "gpumem: out of memory on cuda:%d: the snapshot was not written to %s: %s\n",
                   static_cast<int>(device), config_.oom_snapshot.c_str(), e.what());
    } catch (...) {
      std::fprintf(stderr, "gpumem: out of memory on cuda:%d: the snapshot was not written to %s\n",
                   static_cast<int>(device), config_.oom_snapshot.c_str());
    }
  }

  // --- snapshot
  // -----------------------------------------------------------------------------------

  // The settings a snapshot records (allocator_settings' PYTORCH_CUDA_ALLOC_CONF, which
  // gpumem-replay's "--config recorded" replays): the GPU's, with the policy it ran named (auto
  // would replay as classic) and without oom_snapshot's keys, which shape no allocation.
  static std::string recorded_settings(const allocator_config& device_config) {
    allocator_config recorded = device_config;
    recorded.policy = device_config.effective_policy(true);
    recorded.oom_snapshot.clear();
    recorded.oom_snapshot_max_entries = allocator_config{}.oom_snapshot_max_entries;
    return recorded.to_string();
  }

  c10_alloc::SnapshotInfo make_snapshot(mempool_id id, bool include_traces) {
    c10_alloc::SnapshotInfo out;
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      detail::device_state& s = *devices_[d];
      if (!s.main) continue;
      const auto device = static_cast<c10::DeviceIndex>(d);
      if (is_default(id)) {
        add_segments(out, device, {0, 0}, *s.main);
        if (device_allocator* legacy = legacy_of(s)) add_segments(out, device, {0, 0}, *legacy);
      }
      std::lock_guard<std::mutex> lock(s.pools_mutex);
      for (auto& p : s.pools) {
        if (is_default(id) || p->id == id) add_segments(out, device, p->id, *p->allocator);
      }
    }
    {
      std::lock_guard<std::mutex> lock(trace_mutex_);
      out.device_traces.resize(devices_.size());
      if (include_traces) {
        for (std::size_t d = 0; d < history_.size() && d < devices_.size(); ++d) {
          out.device_traces[d].assign(history_[d].begin(), history_[d].end());
        }
#if GPUMEM_TORCH_AT_LEAST(2, 11)
        out.external_annotations.assign(annotations_.begin(), annotations_.end());
#endif
      }
    }
    auto& c = out.config_metadata;
    const allocator_config now = run_time_settings();  // what PyTorch's snapshot reports
    c.garbage_collection_threshold = now.garbage_collection_threshold;
    c.max_split_size = now.max_split_size;
    c.pinned_num_register_threads = config_.pinned_num_register_threads;
    c.expandable_segments = config_.expandable_segments;
    c.release_lock_on_malloc = config_.release_lock_on_cudamalloc;
    c.pinned_use_host_register = config_.pinned_use_cuda_host_register;
#if GPUMEM_TORCH_AT_LEAST(2, 9)
    c.graph_capture_record_stream_reuse = config_.graph_capture_record_stream_reuse;
#endif
    c.last_allocator_settings = recorded_settings(now);
    for (const auto& s : devices_) {
      if (s->main) {
        std::lock_guard<std::mutex> lock(s->pools_mutex);  // set_run_time_settings writes it
        c.last_allocator_settings = recorded_settings(s->config);  // classic without VMM
        break;
      }
    }
    c.roundup_power2_divisions.assign(now.roundup_power2_divisions.begin(),
                                      now.roundup_power2_divisions.end());
    return out;
  }

  // One SegmentInfo per part of memory reserved memory counts (segment_parts: a VMM range shows
  // the pages it accounts for, as PyTorch shows expandable segments; a page stitch maps at two
  // addresses is listed once), with the blocks' states and allocation contexts.
  void add_segments(c10_alloc::SnapshotInfo& out, c10::DeviceIndex device, mempool_id pool,
                    const device_allocator& a) {
    const bool vmm = a.policy() != allocator_policy::classic;
    const auto segments = a.snapshot();  // before trace_mutex_: the allocator's lock comes first
    std::lock_guard<std::mutex> lock(trace_mutex_);
    for (const auto& seg : segments) {
      for (const segment_part& part : segment_parts(seg)) {
        c10_alloc::SegmentInfo& info = out.segments.emplace_back();
        info.device = device;
        info.address = part.address;
        info.stream = seg.stream;
        info.is_large = !seg.is_small;
        info.is_expandable = vmm;
        info.owner_private_pool_id = pool;
        for (const block_snapshot& b : part.blocks) {
          c10_alloc::BlockInfo block;
          block.size = b.size;
          block.requested_size = b.requested_size;
          block.allocated = b.state == block_state::active_allocated;
          block.active = b.state != block_state::inactive;
          if (block.active) {
            auto it = contexts_.find(reinterpret_cast<void*>(b.address));
            if (it != contexts_.end()) block.context_when_allocated = it->second;
          }
          info.total_size += b.size;
          if (block.allocated) info.allocated_size += b.size;
          if (block.active) {
            info.active_size += b.size;
            info.requested_size += b.requested_size;
          }
          info.blocks.push_back(std::move(block));
        }
      }
    }
  }

  allocator_config config_;
  std::mutex settings_mutex_;         // run_time_config_, and devices' creation
  allocator_config run_time_config_;  // config_ with set_run_time_settings' values
  std::once_flag init_once_;
  std::atomic<bool> initialized_{false};
  std::vector<std::unique_ptr<detail::device_state>> devices_;  // fixed once init ran

  std::mutex observers_mutex_;
  std::vector<c10_alloc::OutOfMemoryObserver> oom_observers_;
#if GPUMEM_TORCH_AT_LEAST(2, 12)
  std::vector<c10_alloc::OomRejectionObserver> rejection_observers_;
#endif

  std::mutex trace_mutex_;  // everything below
  std::atomic<bool> trace_wanted_{false};
  std::atomic<bool> history_enabled_{false};
  std::vector<c10_alloc::AllocatorTraceTracker> trackers_;
  c10_alloc::CreateContextFn context_recorder_ = nullptr;
  c10_alloc::RecordContext record_context_ = c10_alloc::RecordContext::NEVER;
  std::size_t max_entries_ = 1;
  unsigned skip_ = 0;  // bit per allocator_action
  std::vector<std::deque<c10_alloc::TraceEntry>> history_;
  std::vector<std::vector<std::string>> compile_contexts_;  // per GPU, newest last
  std::vector<std::string> user_metadata_;                  // per GPU
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  std::deque<::c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
#endif
  std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;
  std::vector<std::unique_ptr<oom_event_ring>> oom_rings_;  // per device, with oom_snapshot
  std::uint64_t oom_ring_pushes_ = 0;

  std::mutex oom_snapshot_mutex_;
  std::size_t oom_snapshots_written_ = 0;

  std::mutex ipc_mutex_;                                           // ipc_open_, vmm_exports_
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_open_;  // getIpcDevPtr, per handle
  std::unordered_map<void*, shared_block> vmm_exports_;  // shared live blocks' open descriptors
  std::atomic<std::size_t> vmm_exports_count_{0};        // vmm_exports_.size()

  std::atomic<bool> enabled_{true};           // enable(); false: uncached_allocate
  std::atomic<bool> legacy_segments_{false};  // set_legacy_segments
  std::mutex uncached_mutex_;
  std::unordered_map<void*, c10::DeviceIndex> uncached_;  // live memory from uncached_allocate
};

namespace detail {

// The deleter of gpumem's DataPtrs, called from destructors (a tensor's storage): a failure is
// reported on stderr, never thrown.
inline void raw_delete(void* ptr) noexcept {
  reporting_failure("freeing a CUDA tensor's memory", [ptr] {
    cuda_allocator* a = installed();
    TORCH_CHECK(a != nullptr, "a gpumem DataPtr freed while gpumem is not installed");
    a->raw_delete(ptr);
  });
}

// The deleter of DataPtrs allocated while caching was disabled: cudaFree, whatever the setting is
// now. Reported on stderr, never thrown.
inline void uncached_delete(void* ptr) noexcept {
  if (ptr == nullptr) return;
  reporting_failure("freeing a CUDA tensor's memory", [ptr] {
    cuda_allocator* a = installed();
    TORCH_CHECK(a != nullptr, "a gpumem DataPtr freed while gpumem is not installed");
    a->raw_delete(ptr);
  });
}

}  // namespace detail

inline cuda_allocator* installed() noexcept {
  return detail::installed_slot().load(std::memory_order_acquire);
}

namespace detail {

#if GPUMEM_TORCH_AT_LEAST(2, 9)
// Whether PyTorch allocator settings ("key:value,key:[list],...") set `key`.
inline bool names_key(const std::string& settings, std::string_view key) {
  const ::c10::CachingAllocator::ConfigTokenizer tokens(settings);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == key) return true;
    i = tokens.skipKey(i) + 1;  // past the value (or list) to the comma
  }
  return false;
}

// The sizing settings after PyTorch parsed `settings` at run time, on top of `current`: PyTorch
// resets max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold to their
// defaults unless `settings` names them, and keeps every other key it does not name.
inline allocator_config run_time_settings_of(const std::string& settings,
                                             allocator_config current) {
  using accelerator_config = ::c10::CachingAllocator::AcceleratorAllocatorConfig;
  current.max_split_size = accelerator_config::max_split_size();
  current.garbage_collection_threshold = accelerator_config::garbage_collection_threshold();
  const std::vector<size_t>& divisions = accelerator_config::roundup_power2_divisions();
  for (std::size_t i = 0; i < current.roundup_power2_divisions.size(); ++i) {
    current.roundup_power2_divisions[i] = i < divisions.size() ? divisions[i] : 0;
  }
  if (names_key(settings, "max_non_split_rounding_mb")) {
    current.max_non_split_rounding = accelerator_config::max_non_split_rounding_size();
  }
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  if (names_key(settings, "large_segment_size_mb")) {
    current.large_segment_size = accelerator_config::large_segment_size();
    current.max_non_split_rounding = accelerator_config::max_non_split_rounding_size();
  }
#endif
#if GPUMEM_TORCH_AT_LEAST(2, 10)
  if (names_key(settings, "per_process_memory_fraction")) {
    const double fraction =
        ::c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::per_process_memory_fraction();
    current.per_process_memory_fraction = fraction;
  }
#endif
  return current;
}

// What gpumem's hook does around CUDA's parse of `settings` (cuda_parse): settings naming
// expandable_segments switch legacy segments on (False) or off (True), and the sizing settings
// go to every allocator as PyTorch left them (set_run_time_settings).
inline void follow_settings(const std::string& settings,
                            const std::function<void(const std::string&)>& cuda_parse) {
  using accelerator_config = ::c10::CachingAllocator::AcceleratorAllocatorConfig;
  bool sets = false;
  try {
    sets = names_key(settings, "expandable_segments");
  } catch (...) {
    // Malformed: PyTorch's parsers have refused it or will (cuda_parse below).
  }
  cuda_allocator* a = installed();
  if (sets && a != nullptr) a->set_legacy_segments(!accelerator_config::use_expandable_segments());
  if (cuda_parse) cuda_parse(settings);
  if (a != nullptr) {
    a->set_run_time_settings(run_time_settings_of(settings, a->run_time_settings()));
  }
}

// torch.cuda.memory._set_allocator_settings (c10::CachingAllocator::setAllocatorSettings) makes
// no call on the allocator: PyTorch's own reads its settings again at each allocation.
// setAllocatorSettings parses the settings (the keys shared by every device, resetting
// max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold), then calls the
// device configuration hook (CUDA's keys): gpumem's hook runs CUDA's parse and follows.
inline void follow_allocator_settings() {
  using accelerator_config = ::c10::CachingAllocator::AcceleratorAllocatorConfig;
#if GPUMEM_TORCH_AT_LEAST(2, 11)
  auto& hook = accelerator_config::getConfigParserHook();
  hook = [cuda_parse = hook](const std::string& settings) {
    follow_settings(settings, cuda_parse);
  };
#else
  // torch 2.9 and 2.10 keep the hook private; registering one replaces it, so gpumem's runs
  // CUDA's parse itself, as the hook CUDA registers does (no key is added).
  accelerator_config::registerDeviceConfigParserHook(
      [](const std::string& settings) {
        follow_settings(settings, [](const std::string& text) {
          ::c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::instance().parseArgs(text);
        });
      },
      {});
#endif
}
#else
// torch 2.8: _set_allocator_settings parses CUDA's settings (CUDAAllocatorConfig::parseArgs)
// without a hook or a call on the allocator: not followed.
inline void follow_allocator_settings() {}
#endif

}  // namespace detail

inline cuda_allocator& install(const allocator_config& config) {
  static std::mutex install_mutex;
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installed() != nullptr) {
    throw usage_error(
        "gpumem::torch::install: gpumem is already PyTorch's CUDA allocator in this process "
        "(install it once)");
  }
  c10_alloc::CUDAAllocator* current = c10_alloc::get();
  if (current != nullptr && current->initialized()) {
    throw usage_error(fmt::format(
        "gpumem::torch::install: too late: PyTorch's CUDA allocator ({}) is already initialised "
        "(a CUDA tensor was created or torch.cuda was initialised); install gpumem before the "
        "first CUDA allocation",
        current->name()));
  }
  auto* a = new cuda_allocator(config);  // never deleted: tensors may be freed during exit
  c10_alloc::allocator.store(a);
  c10::SetAllocator(c10::DeviceType::CUDA, a, std::numeric_limits<std::uint8_t>::max());
  detail::installed_slot().store(a, std::memory_order_release);
  detail::follow_allocator_settings();
  return *a;
}

inline cuda_allocator& install(std::string_view settings) {
  return install(allocator_config::resolve(settings));
}

}  // namespace gpumem::torch
