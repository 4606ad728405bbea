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
//
// What NCCL needs of the memory it registers (ncclCommRegister, symmetric and NVLS collectives):
// memory from ncclMemAlloc (which requests the shareable handle types NCCL imports into peers:
// POSIX file descriptors, or fabric handles with IMEX) is registered without copies. cudaMalloc
// memory (cuda_device) registers for the intra-node paths through legacy CUDA IPC; VMM memory of
// cuda_vmm_device is created without shareable handle types, so NCCL cannot import it into peers
// and falls back to copies through its own buffers.
#pragma once

#include <nccl.h>

#include <cstddef>

#include <fmt/format.h>

#include "gpumem/device/cuda_device.hpp"
#include "gpumem/error.hpp"

namespace gpumem::nccl {

namespace detail {

/// Whether a failed ncclMemAlloc of `bytes` ran out of device memory. NCCL allocates with the
/// driver's cuMemCreate, which never sets the runtime's last error, and reports the failure as
/// ncclUnhandledCudaError or ncclSystemError: out of memory is recognised from the runtime's last
/// error when NCCL went through the runtime (`last`), else from the device's free memory
/// (`free_bytes`, from cudaMemGetInfo) being short of the request rounded up to NCCL's
/// granularity (at most 2 MiB of recommended granularity per allocation on current GPUs, plus
/// the same again for alignment).
inline bool nccl_alloc_out_of_memory(ncclResult_t result, cudaError_t last, std::size_t free_bytes,
                                     std::size_t bytes) noexcept {
  if (result == ncclSuccess) return false;
  if (last == cudaErrorMemoryAllocation) return true;
  if (result != ncclUnhandledCudaError && result != ncclSystemError) return false;
  constexpr std::size_t slack = std::size_t{4} << 20;
  return free_bytes < bytes || free_bytes - bytes < slack;
}

}  // namespace detail

class nccl_device : public cuda_device {
 public:
  explicit nccl_device(int index = 0) noexcept : cuda_device(index) {}

  /// ncclMemAlloc. nullptr when out of memory (see detail::nccl_alloc_out_of_memory: the free and
  /// retry of caching_allocator then runs) or for 0 bytes; cuda_error for other failures.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    gpumem::detail::cuda_device_guard guard(index());
    void* ptr = nullptr;
    const ncclResult_t r = ncclMemAlloc(&ptr, bytes);
    if (r == ncclSuccess) return ptr;
    const cudaError_t last = cudaGetLastError();  // cleared either way
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      free_bytes = 0;  // cannot tell: an out-of-memory retry is the safe answer
    }
    if (detail::nccl_alloc_out_of_memory(r, last, free_bytes, bytes)) return nullptr;
    throw cuda_error(static_cast<int>(r), fmt::format("ncclMemAlloc(&ptr, {}) on device {}: {}",
                                                      bytes, index(), ncclGetErrorString(r)));
  }

  /// ncclMemFree, after waiting for the device as cudaFree does: ncclMemFree unmaps and releases
  /// VMM memory (cuMemUnmap, cuMemRelease), which do not wait for the work that still uses it,
  /// and the classic policy frees segments relying on cudaFree's implicit synchronisation.
  void deallocate(void* ptr, std::size_t bytes) {
    if (ptr == nullptr) return;
    synchronize();
    gpumem::detail::cuda_device_guard guard(index());
    const ncclResult_t r = ncclMemFree(ptr);
    if (r != ncclSuccess) {
      throw cuda_error(static_cast<int>(r), fmt::format("ncclMemFree({}) of {} bytes: {}", ptr,
                                                        bytes, ncclGetErrorString(r)));
    }
  }
};

}  // namespace gpumem::nccl
