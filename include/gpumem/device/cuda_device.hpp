// gpumem — cuda_device: the device concept on the CUDA runtime API (cudaMalloc and friends).
//
// Each call makes its device current for the duration of the call (a small RAII guard restores the
// caller's current device), so one cuda_device per GPU can be used from any thread. Out of memory
// is not an error here: allocate returns nullptr and clears CUDA's last-error state, so that the
// caching allocator can free cached memory and retry. Every other failure throws cuda_error whose
// message names the CUDA error (cudaGetErrorName / cudaGetErrorString), the call and its
// arguments, and the device.
//
// Link with cudart (CUDA::cudart). Nothing here runs at construction, so a cuda_device can be built
// on a machine without a GPU; its calls then throw cuda_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpumem/device/device.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

namespace detail {

/// Throws cuda_error for `status` from `call` (the call with its arguments) on `device`, after
/// clearing the runtime's last-error state so the error does not resurface in an unrelated call.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const std::string& call, int device) {
  (void)cudaGetLastError();
  const char* name = cudaGetErrorName(status);
  const char* text = cudaGetErrorString(status);
  throw cuda_error(static_cast<int>(status),
                   fmt::format("{} on CUDA device {} failed: {} ({})", call, device,
                               name != nullptr ? name : "unknown error",
                               text != nullptr ? text : "no description"));
}

/// Makes `device` current for its lifetime and restores the previous device afterwards (only
/// calling cudaSetDevice when they differ). Throws cuda_error when either query or switch fails;
/// the destructor never throws.
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) {
    const cudaError_t got = cudaGetDevice(&previous_);
    if (got != cudaSuccess) throw_cuda_error(got, "cudaGetDevice(&device)", device);
    if (previous_ != device) {
      const cudaError_t set = cudaSetDevice(device);
      if (set != cudaSuccess)
        throw_cuda_error(set, fmt::format("cudaSetDevice({})", device), device);
      switched_ = true;
    }
  }
  ~cuda_device_guard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace detail

/// Where a device's segments come from instead of cudaMalloc / cudaFree: another allocator that
/// owns a memory pool's segments (PyTorch's MemPool(allocator), such as ncclMemAlloc for NCCL's
/// registered buffers). Called with the device current.
class segment_source {
 public:
  virtual ~segment_source() = default;
  /// A segment of `bytes` bytes, or nullptr when there is no memory for it. May throw: the
  /// exception reaches the caching allocator's caller.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Frees a segment that allocate returned, `bytes` being what was asked for. Called once no work
  /// on the GPU may use it.
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
};

/// One CUDA GPU through the runtime API. A small value type (the ordinal and an optional segment
/// source): copies refer to the same GPU. Thread safety: every member function may be called
/// concurrently (the CUDA runtime is thread-safe; the guard changes only the calling thread's
/// current device, and restores it).
class cuda_device {
 public:
  using stream_type = cudaStream_t;
  using event_type = cudaEvent_t;
  static constexpr bool supports_vmm = false;  // the driver-API device is cuda_vmm_device

  /// The GPU with ordinal `index`. Makes no CUDA call. Never throws.
  explicit cuda_device(int index = 0) noexcept : index_(index) {}

  /// Number of CUDA devices, 0 when there is no GPU or no usable driver (the error is cleared).
  /// Thread-safe; never throws.
  static int device_count() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return count;
  }

  /// The device ordinal. Thread-safe; never throws.
  int index() const noexcept { return index_; }

  /// Total device memory in bytes (cudaMemGetInfo). Thread-safe. Throws cuda_error.
  std::size_t total_memory() const {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    query_memory(free_bytes, total_bytes);
    return total_bytes;
  }

  /// cudaMemGetInfo. Thread-safe. Throws cuda_error.
  void memory_info(std::size_t& free_bytes, std::size_t& total_bytes) {
    query_memory(free_bytes, total_bytes);
  }

  /// Segments from now on come from `source` instead of cudaMalloc / cudaFree (nullptr: back to
  /// them). The source must outlive every copy of this device that allocates through it and the
  /// segments it made. Not thread-safe: set it before the device is used.
  void set_segment_source(segment_source* source) noexcept { source_ = source; }
  segment_source* source() const noexcept { return source_; }

  /// cudaMalloc of one segment, or the segment source's allocate. Returns nullptr when the device
  /// is out of memory (cudaErrorMemoryAllocation, whose last-error state is cleared) and for 0
  /// bytes. Thread-safe. Throws cuda_error for any other failure.
  void* allocate(std::size_t bytes) {
    detail::cuda_device_guard guard(index_);
    if (source_ != nullptr) return from_source(bytes);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
      return nullptr;
    }
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, fmt::format("cudaMalloc(&ptr, {})", bytes), index_);
    }
    return ptr;
  }

  /// cudaFree (which synchronises the device). `bytes` is unused by CUDA; nullptr is a no-op.
  /// With a segment source: the device synchronised first, as cudaFree does (the caching
  /// allocator frees a segment only when no work may still use it; a source such as ncclMemFree
  /// may not wait), then the source's deallocate. Thread-safe. Throws cuda_error.
  void deallocate(void* ptr, std::size_t bytes) {
    detail::cuda_device_guard guard(index_);
    if (source_ != nullptr) {
      if (ptr == nullptr) return;
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize() before a segment source's free");
      source_->deallocate(ptr, bytes);
      return;
    }
    const cudaError_t status = cudaFree(ptr);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, fmt::format("cudaFree({}) of {} bytes", ptr, bytes), index_);
    }
  }

  using graph_node_type = cudaGraphNode_t;

  /// Whether `stream` is being captured into a CUDA graph; if so, `out` receives the capture's
  /// current terminal nodes on it (what work queued next would depend on;
  /// cudaStreamGetCaptureInfo). Thread-safe. Throws cuda_error, also for an invalidated capture.
  bool capture_terminals(stream_type stream, std::vector<graph_node_type>& out) {
    detail::cuda_device_guard guard(stream_device(stream));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const graph_node_type* terminals = nullptr;
    std::size_t count = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t got =
        cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &terminals, nullptr, &count);
#else
    const cudaError_t got =
        cudaStreamGetCaptureInfo_v2(stream, &status, nullptr, nullptr, &terminals, &count);
#endif
    if (got != cudaSuccess) {
      detail::throw_cuda_error(
          got, fmt::format("cudaStreamGetCaptureInfo(stream {}, ...)", ptr(stream)), index_);
    }
    if (status == cudaStreamCaptureStatusInvalidated) {
      detail::throw_cuda_error(cudaErrorStreamCaptureInvalidated,
                               fmt::format("cudaStreamGetCaptureInfo(stream {}, ...): the capture "
                                           "was invalidated",
                                           ptr(stream)),
                               index_);
    }
    out.assign(terminals, terminals + (status == cudaStreamCaptureStatusActive ? count : 0));
    return status == cudaStreamCaptureStatusActive;
  }

  /// The nodes `node` depends on (cudaGraphNodeGetDependencies). Thread-safe. Throws cuda_error.
  void graph_node_dependencies(graph_node_type node, std::vector<graph_node_type>& out) {
    std::size_t count = 0;
#if CUDART_VERSION >= 13000
    check(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count),
          "cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count)");
    out.resize(count);
    if (count != 0) {
      check(cudaGraphNodeGetDependencies(node, out.data(), nullptr, &count),
            "cudaGraphNodeGetDependencies(node, deps, nullptr, &count)");
    }
#else
    check(cudaGraphNodeGetDependencies(node, nullptr, &count),
          "cudaGraphNodeGetDependencies(node, nullptr, &count)");
    out.resize(count);
    if (count != 0) {
      check(cudaGraphNodeGetDependencies(node, out.data(), &count),
            "cudaGraphNodeGetDependencies(node, deps, &count)");
    }
#endif
    out.resize(count);
  }

  /// The legacy default stream (nullptr). Thread-safe; never throws.
  stream_type default_stream() const noexcept {
    return nullptr;
  }

  /// cudaEventCreateWithFlags(cudaEventDisableTiming). Thread-safe. Throws cuda_error.
  event_type create_event() {
    detail::cuda_device_guard guard(index_);
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
          "cudaEventCreateWithFlags(&event, cudaEventDisableTiming)");
    return event;
  }

  /// cudaEventDestroy. Thread-safe. Throws cuda_error.
  void destroy_event(event_type event) {
    detail::cuda_device_guard guard(index_);
    check_handle(cudaEventDestroy(event), "cudaEventDestroy", ptr(event));
  }

  /// The device `stream` belongs to (cudaStreamGetDevice; this device for the legacy and
  /// per-thread default streams, which are the current device's). Thread-safe. Throws cuda_error.
  int stream_device(stream_type stream) const {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
      return index_;
    }
#if CUDART_VERSION >= 12080
    int device = index_;
    const cudaError_t status = cudaStreamGetDevice(stream, &device);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, fmt::format("cudaStreamGetDevice({}, &device)", ptr(stream)),
                               index_);
    }
    return device;
#else
    return index_;
#endif
  }

  /// An event (cudaEventDisableTiming) on the device of `stream`, so that it can be recorded
  /// there: a record_stream on another GPU's stream needs one of that GPU. Thread-safe. Throws
  /// cuda_error.
  event_type create_event_for(stream_type stream) {
    detail::cuda_device_guard guard(stream_device(stream));
    cudaEvent_t event = nullptr;
    const cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, "cudaEventCreateWithFlags(&event, cudaEventDisableTiming)",
                               index_);
    }
    return event;
  }

  /// cudaEventRecord, with the stream's device current (the event must be of that device:
  /// create_event_for). Thread-safe. Throws cuda_error.
  void record_event(event_type event, stream_type stream) {
    detail::cuda_device_guard guard(stream_device(stream));
    const cudaError_t status = cudaEventRecord(event, stream);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(
          status, fmt::format("cudaEventRecord({}, stream {})", ptr(event), ptr(stream)), index_);
    }
  }

  /// cudaEventQuery: true on cudaSuccess, false on cudaErrorNotReady (cleared). Thread-safe.
  /// Throws cuda_error for any other status.
  bool query_event(event_type event) {
    detail::cuda_device_guard guard(index_);
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // as PyTorch does: never leave "not ready" as the last error
      return false;
    }
    detail::throw_cuda_error(status, fmt::format("cudaEventQuery({})", ptr(event)), index_);
  }

  /// cudaStreamWaitEvent(stream, event, 0): the stream's later work waits for the event's work
  /// on the GPU; the host does not wait. Thread-safe. Throws cuda_error.
  void stream_wait_event(stream_type stream, event_type event) {
    detail::cuda_device_guard guard(index_);
    const cudaError_t status = cudaStreamWaitEvent(stream, event, 0);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(
          status, fmt::format("cudaStreamWaitEvent(stream {}, {})", ptr(stream), ptr(event)),
          index_);
    }
  }

  /// cudaEventSynchronize. Thread-safe. Throws cuda_error.
  void synchronize_event(event_type event) {
    detail::cuda_device_guard guard(index_);
    check_handle(cudaEventSynchronize(event), "cudaEventSynchronize", ptr(event));
  }

  /// cudaDeviceSynchronize. Thread-safe. Throws cuda_error.
  void synchronize() {
    detail::cuda_device_guard guard(index_);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize()");
  }

  /// cudaStreamCreateWithFlags(cudaStreamNonBlocking): a stream that does not synchronise with the
  /// legacy default stream. Thread-safe. Throws cuda_error.
  stream_type create_stream() {
    detail::cuda_device_guard guard(index_);
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)");
    return stream;
  }

  /// cudaStreamDestroy. Thread-safe. Throws cuda_error.
  void destroy_stream(stream_type stream) {
    detail::cuda_device_guard guard(index_);
    check_handle(cudaStreamDestroy(stream), "cudaStreamDestroy", ptr(stream));
  }

 private:
  template <class T>
  static const void* ptr(T* handle) noexcept {
    return static_cast<const void*>(handle);
  }

  void check(cudaError_t status, const char* call) const {
    if (status != cudaSuccess) detail::throw_cuda_error(status, call, index_);
  }

  // check() for a call on one handle: the error names it as "call(handle)".
  void check_handle(cudaError_t status, const char* call, const void* handle) const {
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, fmt::format("{}({})", call, handle), index_);
    }
  }

  void query_memory(std::size_t& free_bytes, std::size_t& total_bytes) const {
    detail::cuda_device_guard guard(index_);
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo(&free, &total)");
  }

  // The source's segment; its nullptr is out of memory. A source that calls cudaMalloc leaves
  // cudaErrorMemoryAllocation as the last error when it fails: cleared, as allocate clears it.
  void* from_source(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* ptr = source_->allocate(bytes);
    if (ptr == nullptr && cudaPeekAtLastError() == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
    }
    return ptr;
  }

  int index_;
  segment_source* source_ = nullptr;
};

static_assert(is_device_v<cuda_device>, "cuda_device must model the device concept");

}  // namespace gpumem
