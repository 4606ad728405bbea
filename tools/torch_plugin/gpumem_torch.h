/* gpumem's LibTorch plugin, libgpumem_torch.so — its C interface.
 *
 * Loading the library (torch.ops.load_library(path) or ctypes.CDLL(path), before the first CUDA
 * tensor) makes gpumem PyTorch's CUDA allocator, configured from GPUMEM_ALLOC_CONF on top of
 * PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF. A problem (a malformed setting, loading too late)
 * is reported once on stderr at load, and PyTorch's allocator stays in place.
 *
 * With GPUMEM_TORCH_INSTALL_AT_LOAD=0 in the environment when it is loaded, the library installs
 * nothing by itself: gpumem_install() does, and says why when it cannot (the Python package,
 * gpumem.install(), loads it that way).
 *
 * The functions below never throw and never abort. Those returning int give 0 on success and -1
 * on failure, with gpumem_last_error() saying why (per thread).
 */
#ifndef GPUMEM_TORCH_H
#define GPUMEM_TORCH_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* gpumem_stream_t; /* cudaStream_t */

/* 1 when gpumem is PyTorch's CUDA allocator in this process, else 0. */
int gpumem_installed(void);

/* Why the last failing call of this thread failed ("" when none has). */
const char* gpumem_last_error(void);

/* Makes gpumem PyTorch's CUDA allocator with `settings` (PYTORCH_CUDA_ALLOC_CONF syntax plus
 * gpumem's keys; NULL or "" for none) on top of GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF /
 * PYTORCH_ALLOC_CONF. Returns 0 on success; -2 when the settings are malformed; -1 when gpumem
 * cannot be installed (already installed, or too late: PyTorch's allocator is already
 * initialised). gpumem_last_error() says why; nothing changes on failure. */
int gpumem_install(const char* settings);

/* The torch version the library was built against (torch.__version__ then), e.g. "2.11.0+cu130".
 * The library works only with that torch build. */
const char* gpumem_torch_version(void);

/* torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free"): allocate on
 * `device` for use on `stream`; NULL on failure (an out-of-memory message is in
 * gpumem_last_error and on stderr). Freeing a pointer gpumem does not own is reported, not fatal.
 */
void* gpumem_malloc(ssize_t size, int device, gpumem_stream_t stream);
void gpumem_free(void* ptr, ssize_t size, int device, gpumem_stream_t stream);

/* record_stream for the CUDAPluggableAllocator route: `ptr` (from gpumem_malloc) is also used on
 * `stream`, so its memory is reused only after the work queued there before its free. The route
 * replaces gpumem's full adapter, and PyTorch's CUDAPluggableAllocator ignores
 * tensor.record_stream() unless a record-stream function is set: from C++, register this one
 * (CUDAPluggableAllocator::set_record_stream_fn(gpumem_record_stream)); Python's
 * CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free") cannot, so programs that use
 * record_stream must load the plugin as PyTorch's allocator instead (the default), or call this
 * themselves. Failures (a pointer gpumem does not own) are reported, not fatal; never throws. */
void gpumem_record_stream(void* ptr, gpumem_stream_t stream);

/* gpumem's memory summary of `device` (PyTorch's table, then gpumem's section) or its statistics
 * as JSON with torch.cuda.memory_stats()'s keys, written to buf (at most len bytes with the
 * terminating NUL). Returns the full length without the NUL (call with len 0 to size the buffer),
 * or (size_t)-1 on failure. */
size_t gpumem_memory_summary(int device, char* buf, size_t len);
size_t gpumem_memory_stats_json(int device, char* buf, size_t len);

/* torch.cuda.empty_cache() / reset_peak_memory_stats(device) for gpumem. */
int gpumem_empty_cache(void);
int gpumem_reset_peak_stats(int device);

/* Legacy segments on (1) or off (0): while on, new allocations of PyTorch's default pool come from
 * cudaMalloc segments under the expandable and stitch policies, which CUDA IPC
 * (cudaIpcGetMemHandle) can share; what torch.cuda.memory._set_allocator_settings(
 * "expandable_segments:False") does, without changing PyTorch's setting. Returns the state before
 * (0 or 1), or -1 when gpumem is not installed. */
int gpumem_set_legacy_segments(int on);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_TORCH_H */
