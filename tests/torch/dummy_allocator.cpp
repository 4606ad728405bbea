// A CUDAPluggableAllocator for the memory-pool tests (test_mempool.py): MemPool(allocator) gives
// a pool its own allocator, as PyTorch's TestMemPool does with a load_inline extension. Built as a
// shared library linked against the CUDA simulator's libcudart; the counters let a test see
// whether PyTorch called it.
#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {

__attribute__((visibility("default"))) int called_dummy_alloc = 0;
__attribute__((visibility("default"))) int called_dummy_free = 0;

/// PyTorch's pluggable-allocator malloc: `size` bytes on the current device, nullptr on failure.
__attribute__((visibility("default"))) void* dummy_alloc(std::size_t size, int, cudaStream_t) {
  called_dummy_alloc = 123;
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, size) != cudaSuccess) return nullptr;
  return ptr;
}

/// PyTorch's pluggable-allocator free of what dummy_alloc returned. Never throws.
__attribute__((visibility("default"))) void dummy_free(void* ptr, std::size_t, int, cudaStream_t) {
  called_dummy_free = 321;
  (void)cudaFree(ptr);
}

}  // extern "C"
