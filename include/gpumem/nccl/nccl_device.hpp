// gpumem — a device whose segments come from ncclMemAlloc / ncclMemFree (NCCL's memory for
// symmetric and NVLink-SHARP collectives), for caching_allocator<nccl_device>: what is cached is
// NCCL memory, so every tensor served from it can be registered for zero-copy collectives.
//
//   gpumem::nccl::nccl_device device(0);
//   gpumem::caching_allocator<gpumem::nccl::nccl_device> pool(device,
//                                                           gpumem::allocator_config::parse(""));
//
// Everything else (streams, events, memory info) is cuda_device's. No virtual memory management:
// the allocator runs the classic policy. Thread safety and errors as cuda_device.
#pragma once

#include <nccl.h>

#include <cstddef>

#include <fmt/format.h>

#include "gpumem/device/cuda_device.hpp"
#include "gpumem/error.hpp"

namespace gpumem::nccl {

class nccl_device : public cuda_device {
 public:
  explicit nccl_device(int index = 0) noexcept : cuda_device(index) {}

  /// ncclMemAlloc. nullptr when out of memory (ncclSystemError/ncclUnhandledCudaError after a
  /// cudaErrorMemoryAllocation) or for 0 bytes; cuda_error for other failures.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    gpumem::detail::cuda_device_guard guard(index());
    void* ptr = nullptr;
    const ncclResult_t r = ncclMemAlloc(&ptr, bytes);
    if (r == ncclSuccess) return ptr;
    if (cudaGetLastError() == cudaErrorMemoryAllocation) return nullptr;
    throw cuda_error(static_cast<int>(r), fmt::format("ncclMemAlloc(&ptr, {}) on device {}: {}",
                                                      bytes, index(), ncclGetErrorString(r)));
  }

  /// ncclMemFree.
  void deallocate(void* ptr, std::size_t bytes) {
    if (ptr == nullptr) return;
    gpumem::detail::cuda_device_guard guard(index());
    const ncclResult_t r = ncclMemFree(ptr);
    if (r != ncclSuccess) {
      throw cuda_error(static_cast<int>(r), fmt::format("ncclMemFree({}) of {} bytes: {}", ptr,
                                                        bytes, ncclGetErrorString(r)));
    }
  }
};

}  // namespace gpumem::nccl
