// gpumem — cuda_vmm_device: the device concept and its VMM extension on the CUDA driver's
// virtual-memory API (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, ...).
//
// Segments, events and streams are cuda_device's (cudaMalloc and friends, inherited unchanged);
// the VMM members call the driver. The driver entry points are looked up once per process through
// the CUDA runtime (cudaGetDriverEntryPointByVersion, as NVIDIA's CCCL and Transformer Engine do),
// so nothing links against libcuda: link gpumem::cuda (cudart) as for cuda_device. Nothing runs at
// construction, so a cuda_vmm_device can be built on a machine without a GPU; its calls then
// throw cuda_error.
//
// Errors. Every failure throws cuda_error whose code() is the CUDA status — a CUresult for the
// driver calls (CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
// CUDA_ERROR_INVALID_HANDLE = 400: the values simulated_device uses), a cudaError_t for the runtime
// calls — and whose message names the call with its arguments, the device, and the error
// (cuGetErrorName / cuGetErrorString; cudaGetErrorName / cudaGetErrorString). The one failure that
// is not an error is running out of physical memory in create_physical, which returns
// invalid_physical_handle (0) so the caller can free cached pages and retry, as allocate returns
// nullptr.
//
// Differences from simulated_device (whose VMM semantics this mirrors; both follow the driver):
//  * cuMemMap currently requires offset == 0 (driver documentation: "currently must be zero"); the
//    simulated device also accepts other granular offsets. Map whole handles, or the first `size`
//    bytes of one.
//  * cuMemRelease of an invalid or already released handle is undefined behaviour in the driver;
//    the simulated device reports it. Release each handle exactly once.
//  * cuMemAddressFree of a range that still has mappings: unmap first (the simulated device
//    enforces it; the driver does not promise to).
//
// What VMM memory means for its users (CUDA IPC, sharing with other processes, peer access,
// GPUDirect RDMA, waiting before unmap): docs/vmm_memory.md.
//
// Thread safety: every member function may be called concurrently from any thread. The CUDA
// runtime and driver are thread-safe; the entry points are resolved once under a function-local
// static (a failed lookup is retried by the next call). The VMM calls name this device explicitly
// (the allocation and access locations), so they neither need nor change the calling thread's
// current device or context; the inherited cuda_device members switch the current device for the
// duration of the call and restore it. Concurrent calls on overlapping ranges (mapping and
// unmapping the same addresses from two threads) are the caller's race, as with the driver.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "gpumem/device/cuda_device.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/shared_block.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

namespace detail {

/// The CUDA version whose ABI of each driver function is requested. Every function used here has
/// had one signature since CUDA 10.2; 12.0 is also what CCCL requests, for minor-version
/// compatibility.
inline constexpr unsigned int cuda_driver_abi_version = 12000;

/// The driver entry points cuda_vmm_device uses, resolved through the CUDA runtime. Each member is
/// non-null in a table returned by cuda_driver().
struct cuda_driver_api {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 mem_get_allocation_properties = nullptr;
};

/// Looks `symbol` up through the runtime into `fn`. Throws cuda_error naming the lookup (and
/// `device`, the device whose call needed it) when the runtime fails (no driver, no device) or the
/// driver does not export the symbol.
template <class Fn>
void resolve_driver_symbol(Fn& fn, const char* symbol, int device) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t status = cudaGetDriverEntryPointByVersion(
      symbol, &address, cuda_driver_abi_version, cudaEnableDefault, &found);
  const auto call = [&] {
    return fmt::format("cudaGetDriverEntryPointByVersion(\"{}\", &fn, {}, cudaEnableDefault)",
                       symbol, cuda_driver_abi_version);
  };
#else
  const cudaError_t status = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
  const auto call = [&] {
    return fmt::format("cudaGetDriverEntryPoint(\"{}\", &fn, cudaEnableDefault)", symbol);
  };
#endif
  if (status != cudaSuccess) throw_cuda_error(status, call(), device);
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    throw cuda_error(
        static_cast<int>(cudaErrorSymbolNotFound),
        fmt::format("{} on CUDA device {} failed: the CUDA driver does not provide {} "
                    "({}); virtual memory management needs a driver for CUDA 10.2 or "
                    "newer",
                    call(), device, symbol,
                    found == cudaDriverEntryPointVersionNotSufficent ? "version not sufficient"
                                                                     : "symbol not found"));
  }
  static_assert(sizeof(Fn) == sizeof(void*), "driver entry points are plain function pointers");
  std::memcpy(&fn, &address, sizeof(fn));  // object pointer -> function pointer, portably
}

/// The process-wide table of driver entry points, resolved on first use. Thread-safe. Throws
/// cuda_error (see resolve_driver_symbol); a later call tries again.
inline const cuda_driver_api& cuda_driver(int device) {
  static const cuda_driver_api api = [device] {
    cuda_driver_api a;
    resolve_driver_symbol(a.get_error_name, "cuGetErrorName", device);
    resolve_driver_symbol(a.get_error_string, "cuGetErrorString", device);
    resolve_driver_symbol(a.device_get, "cuDeviceGet", device);
    resolve_driver_symbol(a.device_get_attribute, "cuDeviceGetAttribute", device);
    resolve_driver_symbol(a.mem_get_allocation_granularity, "cuMemGetAllocationGranularity",
                          device);
    resolve_driver_symbol(a.mem_address_reserve, "cuMemAddressReserve", device);
    resolve_driver_symbol(a.mem_address_free, "cuMemAddressFree", device);
    resolve_driver_symbol(a.mem_create, "cuMemCreate", device);
    resolve_driver_symbol(a.mem_release, "cuMemRelease", device);
    resolve_driver_symbol(a.mem_map, "cuMemMap", device);
    resolve_driver_symbol(a.mem_unmap, "cuMemUnmap", device);
    resolve_driver_symbol(a.mem_set_access, "cuMemSetAccess", device);
    resolve_driver_symbol(a.mem_export_to_shareable_handle, "cuMemExportToShareableHandle", device);
    resolve_driver_symbol(a.mem_import_from_shareable_handle, "cuMemImportFromShareableHandle",
                          device);
    resolve_driver_symbol(a.mem_get_allocation_properties, "cuMemGetAllocationPropertiesFromHandle",
                          device);
    return a;
  }();
  return api;
}

/// Throws cuda_error for the driver status `status` from `call` (the call with its arguments) on
/// `device`, named with cuGetErrorName / cuGetErrorString.
[[noreturn]] inline void throw_cu_error(const cuda_driver_api& api, CUresult status,
                                        const std::string& call, int device) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name(status, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.get_error_string(status, &text) != CUDA_SUCCESS) text = nullptr;
  throw cuda_error(static_cast<int>(status),
                   fmt::format("{} on CUDA device {} failed: {} ({})", call, device,
                               name != nullptr ? name : fmt::format("CUresult {}", int{status}),
                               text != nullptr ? text : "no description"));
}

}  // namespace detail

/// One CUDA GPU through the runtime API (segments, events, streams: everything cuda_device does)
/// and the driver's virtual-memory API. A small value type (just the ordinal): copies refer to the
/// same GPU. Thread safety and errors: see the top of this file.
class cuda_vmm_device : public cuda_device {
 public:
  static constexpr bool supports_vmm = true;
  using physical_handle = CUmemGenericAllocationHandle;
  /// The handle create_physical returns when the device is out of memory.
  static constexpr physical_handle invalid_physical_handle = 0;

  /// The kind of handle other processes and libraries can open the physical memory with
  /// (CUmemAllocationProp::requestedHandleTypes). POSIX file descriptors by default; fabric
  /// handles (multi-node NVLink, IMEX channels) on request, falling back to file descriptors where
  /// the GPU or the system refuses them; `automatic`: fabric handles where fabric_supported()
  /// says the full cycle works, else file descriptors, decided at the first create_physical (what
  /// PyTorch 2.13 and newer do for expandable segments by default); `none` for memory nobody else
  /// opens.
  enum class shareable_handle : unsigned char { none, posix_fd, fabric, automatic };

  /// The GPU with ordinal `index`, its memory exportable as `handles`. Makes no CUDA call. Never
  /// throws.
  explicit cuda_vmm_device(int index = 0,
                           shareable_handle handles = shareable_handle::posix_fd) noexcept
      : cuda_device(index), handles_(handles) {}

  /// The handle type new physical memory is created with: the one asked for, or what
  /// create_physical fell back to (fabric -> posix_fd -> none) when the driver refused it, or
  /// what `automatic` resolved to (it stays `automatic` until the first create_physical).
  shareable_handle shareable_handle_type() const noexcept { return handles_; }

  /// Whether this GPU and system share memory with fabric handles: the GPU reports
  /// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, and one page created with
  /// CU_MEM_HANDLE_TYPE_FABRIC exports and imports again (which fails without an IMEX channel,
  /// as on a single H100/H200 server without the IMEX service). PyTorch makes the same cycle
  /// after asking NVML for the GPU's fabric state. Costs a few driver calls and one page for a
  /// moment; callers keep the answer. False when any step fails. Thread-safe; never throws.
  bool fabric_supported() const noexcept {
    try {
      const detail::cuda_driver_api& api = driver();
      CUdevice dev = 0;
      int value = 0;
      if (api.device_get(&dev, index()) != CUDA_SUCCESS ||
          api.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) !=
              CUDA_SUCCESS ||
          value == 0) {
        return false;
      }
      CUmemAllocationProp prop = allocation_prop();
      std::size_t g = 0;
      if (api.mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
          CUDA_SUCCESS) {
        return false;
      }
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
      physical_handle made = invalid_physical_handle;
      if (api.mem_create(&made, g, &prop, 0) != CUDA_SUCCESS) return false;
      CUmemFabricHandle exported{};
      physical_handle imported = invalid_physical_handle;
      const bool ok = api.mem_export_to_shareable_handle(&exported, made, CU_MEM_HANDLE_TYPE_FABRIC,
                                                         0) == CUDA_SUCCESS &&
                      api.mem_import_from_shareable_handle(
                          &imported, &exported, CU_MEM_HANDLE_TYPE_FABRIC) == CUDA_SUCCESS;
      if (ok) (void)api.mem_release(imported);
      (void)api.mem_release(made);
      return ok;
    } catch (...) {
      (void)cudaGetLastError();
      return false;
    }
  }

  /// True when device `device` exists and supports virtual memory management
  /// (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED). False when there is no GPU or no
  /// usable driver, the ordinal is out of range, or any query fails (runtime errors are cleared).
  /// Thread-safe; never throws.
  static bool supported(int device) noexcept {
    if (device < 0 || device >= device_count()) return false;
    try {
      const detail::cuda_driver_api& api = detail::cuda_driver(device);
      CUdevice dev = 0;
      if (api.device_get(&dev, device) != CUDA_SUCCESS) return false;
      int value = 0;
      if (api.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   dev) != CUDA_SUCCESS) {
        return false;
      }
      return value != 0;
    } catch (...) {
      (void)cudaGetLastError();
      return false;
    }
  }

  /// cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM) for pinned memory on this
  /// device: the unit of every VMM size, offset and address (2 MiB on current GPUs). A driver call
  /// each time; callers that need it often keep the value. Thread-safe. Throws cuda_error.
  std::size_t granularity() const {
    const detail::cuda_driver_api& api = driver();
    const CUmemAllocationProp prop = allocation_prop();
    std::size_t g = 0;
    const CUresult status =
        api.mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             "cuMemGetAllocationGranularity(&granularity, {pinned, device}, "
                             "CU_MEM_ALLOC_GRANULARITY_MINIMUM)",
                             index());
    }
    return g;
  }

  /// cuMemAddressReserve: `size` bytes of virtual addresses aligned to `alignment` (0: the
  /// driver's default, at least the granularity), consuming no memory. Thread-safe. Throws
  /// cuda_error: CUDA_ERROR_INVALID_VALUE for a size of 0 or not a multiple of the granularity or
  /// an alignment that is not a power of two; CUDA_ERROR_OUT_OF_MEMORY when the address space is
  /// exhausted.
  std::uintptr_t reserve_address(std::size_t size, std::size_t alignment = 0) {
    const detail::cuda_driver_api& api = driver();
    CUdeviceptr va = 0;
    const CUresult status = api.mem_address_reserve(&va, size, alignment, 0, 0);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(
          api, status,
          fmt::format("cuMemAddressReserve(&va, size={}, alignment={}, addr=0, flags=0)", size,
                      alignment),
          index());
    }
    return static_cast<std::uintptr_t>(va);
  }

  /// cuMemAddressFree of a whole reservation (the start and size reserve_address gave). Unmap
  /// its mappings first. Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE for an unknown
  /// reservation or a different size).
  void free_address(std::uintptr_t va, std::size_t size) {
    const detail::cuda_driver_api& api = driver();
    const CUresult status = api.mem_address_free(static_cast<CUdeviceptr>(va), size);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status, fmt::format("cuMemAddressFree({:#x}, {})", va, size),
                             index());
    }
  }

  /// cuMemCreate: `size` bytes of pinned physical memory on this device
  /// (CU_MEM_ALLOCATION_TYPE_PINNED) with the shareable handle type (shareable_handle_type()) and,
  /// where the GPU supports it (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED),
  /// GPUDirect RDMA (allocFlags.gpuDirectRDMACapable): what NCCL's network transports want of a
  /// registered buffer, as ncclMemAlloc makes it. Returns invalid_physical_handle (0) when the
  /// device is out of memory (CUDA_ERROR_OUT_OF_MEMORY). Thread-safe. Throws cuda_error for any
  /// other failure (CUDA_ERROR_INVALID_VALUE for a size of 0 or not a multiple of the
  /// granularity).
  physical_handle create_physical(std::size_t size) {
    const detail::cuda_driver_api& api = driver();
    if (handles_ == shareable_handle::automatic) {
      handles_ = fabric_supported() ? shareable_handle::fabric : shareable_handle::posix_fd;
    }
    const bool rdma = gpu_direct_rdma_supported(api);
    for (;;) {
      CUmemAllocationProp prop = allocation_prop();
      prop.requestedHandleTypes = requested_types(handles_);
      prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
      physical_handle handle = invalid_physical_handle;
      const CUresult status = api.mem_create(&handle, size, &prop, 0);
      if (status == CUDA_ERROR_OUT_OF_MEMORY) return invalid_physical_handle;
      // A handle type the GPU, driver or system does not offer: fall back as PyTorch does.
      if ((status == CUDA_ERROR_NOT_SUPPORTED || status == CUDA_ERROR_NOT_PERMITTED) &&
          handles_ != shareable_handle::none) {
        handles_ = handles_ == shareable_handle::fabric ? shareable_handle::posix_fd
                                                        : shareable_handle::none;
        continue;
      }
      if (status != CUDA_SUCCESS) {
        detail::throw_cu_error(api, status,
                               fmt::format("cuMemCreate(&handle, size={}, {{pinned, device {}, "
                                           "handle types {}}}, flags=0)",
                                           size, index(), unsigned{prop.requestedHandleTypes}),
                               index());
      }
      return handle;
    }
  }

  /// cuMemGetAllocationPropertiesFromHandle: what `handle` was created with (its handle types,
  /// allocFlags.gpuDirectRDMACapable). Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE
  /// for a handle that is not live).
  CUmemAllocationProp allocation_properties(physical_handle handle) const {
    const detail::cuda_driver_api& api = driver();
    CUmemAllocationProp prop{};
    const CUresult status = api.mem_get_allocation_properties(&prop, handle);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(
          api, status, fmt::format("cuMemGetAllocationPropertiesFromHandle(&prop, {:#x})", handle),
          index());
    }
    return prop;
  }

  /// cuMemExportToShareableHandle as a POSIX file descriptor (the caller owns and closes it):
  /// what another process imports, after receiving it over a Unix socket or with pidfd_getfd.
  /// Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE for memory created without
  /// posix_fd: see shareable_handle_type()).
  int export_handle(physical_handle handle) const {
    const detail::cuda_driver_api& api = driver();
    int fd = -1;
    const CUresult status = api.mem_export_to_shareable_handle(
        &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             fmt::format("cuMemExportToShareableHandle(&fd, handle={:#x}, "
                                         "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)",
                                         handle),
                             index());
    }
    return fd;
  }

  /// cuMemExportToShareableHandle as a fabric handle: 64 bytes that any process allowed to (same
  /// node, or the NVLink domain through IMEX) imports with import_fabric_handle; nothing to
  /// close. Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE for memory created without
  /// fabric handles: see shareable_handle_type()).
  fabric_handle export_fabric_handle(physical_handle handle) const {
    static_assert(sizeof(CUmemFabricHandle) == sizeof(fabric_handle),
                  "CUmemFabricHandle is 64 opaque bytes");
    const detail::cuda_driver_api& api = driver();
    CUmemFabricHandle exported{};
    const CUresult status =
        api.mem_export_to_shareable_handle(&exported, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             fmt::format("cuMemExportToShareableHandle(&fabric, handle={:#x}, "
                                         "CU_MEM_HANDLE_TYPE_FABRIC, 0)",
                                         handle),
                             index());
    }
    fabric_handle out{};
    std::memcpy(out.data(), &exported, out.size());
    return out;
  }

  /// cuMemImportFromShareableHandle of a fabric handle export_fabric_handle made (here or in
  /// another process): a handle to the same physical memory, to map and release like one
  /// create_physical made. Thread-safe. Throws cuda_error (CUDA_ERROR_NOT_PERMITTED without an
  /// IMEX channel, CUDA_ERROR_NOT_SUPPORTED on a GPU without fabric handles).
  physical_handle import_fabric_handle(const fabric_handle& bytes) const {
    const detail::cuda_driver_api& api = driver();
    CUmemFabricHandle received{};
    std::memcpy(&received, bytes.data(), bytes.size());
    physical_handle handle = invalid_physical_handle;
    const CUresult status =
        api.mem_import_from_shareable_handle(&handle, &received, CU_MEM_HANDLE_TYPE_FABRIC);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             "cuMemImportFromShareableHandle(&handle, &fabric, "
                             "CU_MEM_HANDLE_TYPE_FABRIC)",
                             index());
    }
    return handle;
  }

  /// cuMemImportFromShareableHandle of a POSIX file descriptor export_handle made (here or in
  /// another process): a handle to the same physical memory, to map with map() and release with
  /// release_physical() like one create_physical made. The descriptor stays the caller's.
  /// Thread-safe. Throws cuda_error.
  physical_handle import_handle(int fd) const {
    const detail::cuda_driver_api& api = driver();
    physical_handle handle = invalid_physical_handle;
    void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
    const CUresult status = api.mem_import_from_shareable_handle(
        &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             fmt::format("cuMemImportFromShareableHandle(&handle, fd={}, "
                                         "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
                                         fd),
                             index());
    }
    return handle;
  }

  /// cuMemRelease. As in CUDA, a handle that is still mapped may be released: its memory is freed
  /// when its last mapping is unmapped. Releasing an invalid or already released handle is
  /// undefined behaviour in the driver — never do it. Thread-safe. Throws cuda_error.
  void release_physical(physical_handle handle) {
    const detail::cuda_driver_api& api = driver();
    const CUresult status = api.mem_release(handle);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status, fmt::format("cuMemRelease(handle={:#x})", handle),
                             index());
    }
  }

  /// cuMemMap: maps bytes [offset, offset + size) of `handle` at [va, va + size), which must lie
  /// in one reservation and not be mapped yet. The driver currently requires offset == 0. The
  /// mapping is not accessible until set_access. Thread-safe. Throws cuda_error
  /// (CUDA_ERROR_INVALID_VALUE for unaligned or out-of-range arguments or an already mapped range;
  /// CUDA_ERROR_OUT_OF_MEMORY when the driver cannot allocate its page tables).
  void map(std::uintptr_t va, std::size_t size, std::size_t offset, physical_handle handle) {
    const detail::cuda_driver_api& api = driver();
    const CUresult status = api.mem_map(static_cast<CUdeviceptr>(va), size, offset, handle, 0);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             fmt::format("cuMemMap(va={:#x}, size={}, offset={}, handle={:#x}, "
                                         "flags=0)",
                                         va, size, offset, handle),
                             index());
    }
  }

  /// cuMemUnmap of [va, va + size), which must consist of whole mappings (one call may unmap
  /// several back-to-back mappings, never part of one). Frees the memory of released handles
  /// whose last mapping this was. GPU work using the range must have completed. Thread-safe.
  /// Throws cuda_error (CUDA_ERROR_INVALID_VALUE).
  void unmap(std::uintptr_t va, std::size_t size) {
    const detail::cuda_driver_api& api = driver();
    const CUresult status = api.mem_unmap(static_cast<CUdeviceptr>(va), size);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status, fmt::format("cuMemUnmap(va={:#x}, size={})", va, size),
                             index());
    }
  }

  /// cuMemSetAccess: read/write access for this device to [va, va + size), which must be fully
  /// mapped. Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE).
  void set_access(std::uintptr_t va, std::size_t size) { grant_access(va, size, index()); }

  /// cuMemSetAccess: read/write access for device `device` (this one or a peer: what PyTorch's
  /// addPeerAccess grants expandable segments) to [va, va + size), which must be fully mapped.
  /// Thread-safe. Throws cuda_error (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE).
  void grant_access(std::uintptr_t va, std::size_t size, int device) {
    const detail::cuda_driver_api& api = driver();
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult status = api.mem_set_access(static_cast<CUdeviceptr>(va), size, &desc, 1);
    if (status != CUDA_SUCCESS) {
      detail::throw_cu_error(api, status,
                             fmt::format("cuMemSetAccess(va={:#x}, size={}, {{device {}, "
                                         "read/write}}, 1)",
                                         va, size, device),
                             index());
    }
  }

 private:
  const detail::cuda_driver_api& driver() const { return detail::cuda_driver(index()); }

  static CUmemAllocationHandleType requested_types(shareable_handle h) noexcept {
    switch (h) {
      case shareable_handle::posix_fd:
        return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      case shareable_handle::fabric:
        return CU_MEM_HANDLE_TYPE_FABRIC;
      case shareable_handle::none:
      case shareable_handle::automatic:  // resolved before any creation
        break;
    }
    return CU_MEM_HANDLE_TYPE_NONE;
  }

  shareable_handle handles_;

  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED; false when the query fails.
  bool gpu_direct_rdma_supported(const detail::cuda_driver_api& api) const noexcept {
    CUdevice dev = 0;
    int value = 0;
    return api.device_get(&dev, index()) == CUDA_SUCCESS &&
           api.device_get_attribute(&value,
                                    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                    dev) == CUDA_SUCCESS &&
           value != 0;
  }

  // Pinned device memory on this device, no shareable handle type, no special flags (the
  // granularity query; create_physical adds the handle type).
  CUmemAllocationProp allocation_prop() const noexcept {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = index();
    return prop;
  }
};

static_assert(is_device_v<cuda_vmm_device>, "cuda_vmm_device must model the device concept");
static_assert(is_vmm_device_v<cuda_vmm_device>,
              "cuda_vmm_device must model the VMM extension of the device concept");

}  // namespace gpumem
