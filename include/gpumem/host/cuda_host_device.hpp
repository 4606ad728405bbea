// gpumem — cuda_host_device: pinned host memory from the CUDA runtime.
//
// A model of the host-device concept (host/host_device.hpp): cudaHostAlloc/cudaFreeHost,
// cudaHostRegister/cudaHostUnregister, events through gpumem::cuda_device. Needs the CUDA
// runtime's headers; link gpumem::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include <fmt/format.h>

#include "gpumem/device/cuda_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host/host_device.hpp"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// cuda_host_device
// ---------------------------------------------------------------------------------------------

/// Pinned host memory from the CUDA runtime. Each call makes `device` current for its duration
/// (pinned memory is usable from every GPU under unified addressing; the device decides which
/// context the runtime initialises). Events and streams are those of gpumem::cuda_device.
/// Out of memory is not an error: host_alloc returns nullptr and host_register false, with CUDA's
/// last-error state cleared. Every other failure throws cuda_error naming the call, its
/// arguments, the CUDA error and the device. Nothing runs at construction, so a cuda_host_device
/// can be built on a machine without a GPU; its calls then throw cuda_error.
///
/// A small value type (just the ordinal); thread safety: every member may be called concurrently
/// (the CUDA runtime is thread-safe). Link gpumem::cuda.
class cuda_host_device {
 public:
  using stream_type = cuda_device::stream_type;
  using event_type = cuda_device::event_type;

  /// Pinned memory allocated with GPU `device` current. Makes no CUDA call. Never throws.
  explicit cuda_host_device(int device = 0) noexcept : gpu_(device) {}

  /// Number of CUDA devices, 0 when there is no GPU or no usable driver. Thread-safe; never
  /// throws.
  static int device_count() noexcept { return cuda_device::device_count(); }

  /// The device ordinal. Thread-safe; never throws.
  int index() const noexcept { return gpu_.index(); }

  /// cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault). nullptr for cudaErrorMemoryAllocation
  /// (cleared) and for 0 bytes. Thread-safe. Throws cuda_error for any other failure.
  void* host_alloc(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    detail::cuda_device_guard guard(gpu_.index());
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status,
                               fmt::format("cudaHostAlloc(&ptr, {}, cudaHostAllocDefault)", bytes),
                               gpu_.index());
    }
    return ptr;
  }

  /// cudaFreeHost(ptr); `bytes` is unused by CUDA. Thread-safe. Throws cuda_error.
  void host_free(void* ptr, std::size_t bytes) {
    detail::cuda_device_guard guard(gpu_.index());
    const cudaError_t status = cudaFreeHost(ptr);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(status, fmt::format("cudaFreeHost({}) of {} bytes", ptr, bytes),
                               gpu_.index());
    }
  }

  /// cudaHostRegister(ptr, bytes, cudaHostRegisterDefault). false for cudaErrorMemoryAllocation
  /// (cleared). Thread-safe. Throws cuda_error for any other failure (for example
  /// cudaErrorHostMemoryAlreadyRegistered).
  bool host_register(void* ptr, std::size_t bytes) {
    detail::cuda_device_guard guard(gpu_.index());
    const cudaError_t status = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return false;
    }
    if (status != cudaSuccess) {
      detail::throw_cuda_error(
          status, fmt::format("cudaHostRegister({}, {}, cudaHostRegisterDefault)", ptr, bytes),
          gpu_.index());
    }
    return true;
  }

  /// cudaHostUnregister(ptr); `bytes` is unused by CUDA. Thread-safe. Throws cuda_error.
  void host_unregister(void* ptr, std::size_t bytes) {
    detail::cuda_device_guard guard(gpu_.index());
    const cudaError_t status = cudaHostUnregister(ptr);
    if (status != cudaSuccess) {
      detail::throw_cuda_error(
          status, fmt::format("cudaHostUnregister({}) of {} bytes", ptr, bytes), gpu_.index());
    }
  }

  /// The legacy default stream (nullptr). Thread-safe; never throws.
  stream_type default_stream() const noexcept { return gpu_.default_stream(); }
  /// cuda_device::create_event. Thread-safe. Throws cuda_error.
  event_type create_event() { return gpu_.create_event(); }
  /// cuda_device::destroy_event. Thread-safe. Throws cuda_error.
  void destroy_event(event_type event) { gpu_.destroy_event(event); }
  /// cuda_device::record_event (on the stream's device). Thread-safe. Throws cuda_error.
  void record_event(event_type event, stream_type stream) { gpu_.record_event(event, stream); }
  /// cuda_device::stream_device: the GPU a stream belongs to. Thread-safe. Throws cuda_error.
  int stream_device(stream_type stream) const { return gpu_.stream_device(stream); }
  /// cuda_device::create_event_for: an event of the stream's GPU (pinned memory is copied to
  /// several GPUs). Thread-safe. Throws cuda_error.
  event_type create_event_for(stream_type stream) { return gpu_.create_event_for(stream); }
  /// cuda_device::query_event. Thread-safe. Throws cuda_error.
  bool query_event(event_type event) { return gpu_.query_event(event); }
  /// cuda_device::synchronize_event. Thread-safe. Throws cuda_error.
  void synchronize_event(event_type event) { gpu_.synchronize_event(event); }

  /// The cuda_device behind the events (streams: create_stream / destroy_stream there).
  /// Thread-safe; never throws.
  cuda_device& gpu() noexcept { return gpu_; }

 private:
  cuda_device gpu_;
};

static_assert(is_host_device_v<cuda_host_device>,
              "cuda_host_device must model the host-device concept");

}  // namespace gpumem
