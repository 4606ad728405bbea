// gpumem CUDA simulator — libcuda.so.1: the CUDA driver API on the simulated device.
//
// This library owns the process-wide simulator (simulator.hpp), created on first use from the
// GPUMEM_SIM_* environment, and exports it to the simulated libcudart.so.13 through
// gpumemSimInternalInstance(). It implements the driver calls allocators use (device queries,
// the primary context, cuMemAlloc/cuMemFree, the virtual memory management API, error strings,
// cuGetProcAddress); every other function the real library exports is a stub (stubs.hpp) that
// returns CUDA_ERROR_NOT_SUPPORTED. No C++ exception leaves an exported function.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "simulator.hpp"
#include "stubs.hpp"

// The functions below are defined under their versioned names; cuda.h maps the plain names to
// the newest version, and the oldest versions are defined here too where their ABI is the same.
#undef cuDeviceTotalMem
#undef cuMemGetInfo
#undef cuMemAlloc
#undef cuMemFree
#undef cuDevicePrimaryCtxRelease
#undef cuGetProcAddress

extern "C" {
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
}

namespace gpumem::cudasim {
namespace {

// Never destroyed: programs call CUDA from their own static destructors, after ours would run.
simulator* instance = nullptr;
std::once_flag instance_once;
std::atomic<bool> initialized{false};  // cuInit was called
std::atomic<long> primary_retains{0};
thread_local CUcontext current_context = nullptr;

CUcontext primary_context() noexcept {
  return reinterpret_cast<CUcontext>(std::uintptr_t{0x5e2000000000});
}

simulator* get() noexcept {
  std::call_once(instance_once, [] {
    try {
      const settings s = read_settings();
      instance = new simulator(s);
      instance->log(fmt::format(
          "started: GPUMEM_SIM_MEMORY={} ({} bytes), GPUMEM_SIM_EVENT_DELAY={}s, "
          "GPUMEM_SIM_FAIL_NTH={}, GPUMEM_SIM_FAIL_ABOVE={}, GPUMEM_SIM_FAIL_PROBABILITY={}, "
          "GPUMEM_SIM_SEED={}",
          format_bytes(s.memory), s.memory, s.event_delay, s.faults.fail_nth_call,
          s.faults.fail_above_bytes, s.faults.fail_probability, s.faults.seed));
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "gpumem cudasim: cannot start: %s\n"
                   "gpumem cudasim: every CUDA call fails (cudaErrorInitializationError, "
                   "CUDA_ERROR_NOT_INITIALIZED)\n",
                   e.what());
    } catch (...) {
      std::fprintf(stderr, "gpumem cudasim: the simulator cannot start (unknown error)\n");
    }
  });
  return instance;
}

enum class needs { nothing, init, context };

/// One driver call: the simulator must have started and, per `need`, cuInit been called and a
/// context be current. `body(sim)` returns a status. Never throws.
template <class Args, class Body>
CUresult driver_call(const char* name, needs need, const Args& args, const Body& body) noexcept {
  simulator* sim = get();
  if (sim == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return static_cast<CUresult>(call(*sim, api::driver, name, args, [&]() -> int {
    if (need != needs::nothing && !initialized.load(std::memory_order_acquire)) {
      throw cuda_error(not_initialized, "cuInit has not been called");
    }
    if (need == needs::context && current_context == nullptr) {
      throw cuda_error(invalid_context, "no context is current on this thread");
    }
    return body(*sim);
  }));
}

void* as_pointer(CUdeviceptr p) noexcept {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}

int check_device(CUdevice dev) noexcept {
  return dev == 0 ? ok : invalid_device;
}

// An allocation property the simulated device supports: pinned memory on device 0.
int check_prop(const CUmemAllocationProp* prop) noexcept {
  if (prop == nullptr) return invalid_value;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return invalid_value;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return invalid_value;
  if (prop->location.id != 0) return invalid_device;
  const auto handles = static_cast<unsigned>(prop->requestedHandleTypes);
  const auto known = static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) |
                     static_cast<unsigned>(CU_MEM_HANDLE_TYPE_FABRIC);
  if ((handles & ~known) != 0) return not_supported;
  return ok;
}

std::string hex(CUdeviceptr p) {
  return fmt::format("{:#x}", static_cast<unsigned long long>(p));
}

// cuGetProcAddress: the driver functions the simulator implements, with the CUDA version that
// introduced each variant (cudaTypedefs.h's PFN_<name>_v<version>). Versions the simulator does
// not implement name their (exported) stubs, so that a newer ABI is never answered with an
// older function.
struct proc {
  const char* name;
  int version;
  const char* symbol;
};
constexpr proc procs[] = {
    {"cuInit", 2000, "cuInit"},
    {"cuDriverGetVersion", 2020, "cuDriverGetVersion"},
    {"cuDeviceGet", 2000, "cuDeviceGet"},
    {"cuDeviceGetCount", 2000, "cuDeviceGetCount"},
    {"cuDeviceGetName", 2000, "cuDeviceGetName"},
    {"cuDeviceTotalMem", 2000, "cuDeviceTotalMem"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute"},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain"},
    {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState"},
    {"cuCtxGetCurrent", 4000, "cuCtxGetCurrent"},
    {"cuCtxSetCurrent", 4000, "cuCtxSetCurrent"},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice"},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},
    {"cuMemGetInfo", 2000, "cuMemGetInfo"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
    {"cuMemAlloc", 2000, "cuMemAlloc"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemFree", 2000, "cuMemFree"},
    {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity"},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve"},
    {"cuMemAddressFree", 10020, "cuMemAddressFree"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease"},
    {"cuMemMap", 10020, "cuMemMap"},
    {"cuMemUnmap", 10020, "cuMemUnmap"},
    {"cuMemSetAccess", 10020, "cuMemSetAccess"},
    {"cuGetErrorString", 6000, "cuGetErrorString"},
    {"cuGetErrorName", 6000, "cuGetErrorName"},
    {"cuGetProcAddress", 11030, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
};

// This library, for looking up its own exported functions (implemented or stubs).
void* self() noexcept {
  static void* const handle = [] {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&cuInit), &info) == 0 || info.dli_fname == nullptr) {
      return static_cast<void*>(nullptr);
    }
    return ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  }();
  return handle;
}

void* exported(const std::string& symbol) noexcept {
  void* h = self();
  return h != nullptr ? ::dlsym(h, symbol.c_str()) : nullptr;
}

// The function cuGetProcAddress returns for `symbol` at `version`, or why there is none.
void* find_proc(const std::string& symbol, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult& why) {
  const proc* best = nullptr;
  bool known = false;
  for (const proc& p : procs) {
    if (symbol != p.name) continue;
    known = true;
    if (p.version <= version && (best == nullptr || p.version > best->version)) best = &p;
  }
  if (known) {
    if (best == nullptr) {
      why = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return nullptr;
    }
    why = CU_GET_PROC_ADDRESS_SUCCESS;
    return exported(best->symbol);
  }
  // Not implemented: the stub of the newest exported variant (every stub behaves the same).
  if (symbol.rfind("cu", 0) == 0) {
    std::string candidates[6];
    std::size_t n = 0;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0) {
      candidates[n++] = symbol + "_ptsz";
      candidates[n++] = symbol + "_ptds";
    }
    for (const char* suffix : {"_v4", "_v3", "_v2", ""}) candidates[n++] = symbol + suffix;
    for (std::size_t i = 0; i < n; ++i) {
      if (void* f = exported(candidates[i])) {
        why = CU_GET_PROC_ADDRESS_SUCCESS;
        return f;
      }
    }
  }
  why = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return nullptr;
}

}  // namespace

int driver_unimplemented(const char* name, std::atomic<bool>& reported) noexcept {
  if (!reported.exchange(true)) {
    std::fprintf(stderr,
                 "gpumem cudasim: %s is not implemented by the CUDA simulator; it returns "
                 "CUDA_ERROR_NOT_SUPPORTED (reported once)\n",
                 name);
  }
  if (simulator* sim = get()) {
    sim->count(extra::unimplemented);
    if (sim->logging()) {
      try {
        sim->log(fmt::format("{}(...) = CUDA_ERROR_NOT_SUPPORTED: not implemented", name));
      } catch (...) {
      }
    }
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace gpumem::cudasim

using namespace gpumem::cudasim;  // NOLINT: the exported functions below are its users

extern "C" {

gpumem::cudasim::simulator* gpumemSimInternalInstance(void) {
  return get();
}

int gpumemSimGetCounters(gpumemSimCounters* out, size_t size) {
  simulator* sim = get();
  if (out == nullptr || sim == nullptr) return -1;
  try {
    gpumemSimCounters c{};
    sim->read_counters(c);
    std::memcpy(out, &c, std::min(size, sizeof c));
    return 0;
  } catch (...) {
    return -1;
  }
}

int gpumemSimResetCounters(void) {
  simulator* sim = get();
  if (sim == nullptr) return -1;
  try {
    sim->reset_counters();
    return 0;
  } catch (...) {
    return -1;
  }
}

// ---------------------------------------------------------------------------------------------
// Initialisation, version, devices
// ---------------------------------------------------------------------------------------------

CUresult cuInit(unsigned int Flags) {
  return driver_call(
      "cuInit", needs::nothing, [&] { return fmt::format("{}", Flags); },
      [&](simulator&) -> int {
        if (Flags != 0) return invalid_value;
        initialized.store(true, std::memory_order_release);
        return ok;
      });
}

CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return driver_call(
      "cuDeviceGet", needs::init, [&] { return fmt::format("&device, {}", ordinal); },
      [&](simulator&) -> int {
        if (device == nullptr) return invalid_value;
        if (ordinal != 0) return invalid_device;
        *device = 0;
        return ok;
      });
}

CUresult cuDeviceGetCount(int* count) {
  return driver_call(
      "cuDeviceGetCount", needs::init, [] { return std::string("&count"); },
      [&](simulator&) -> int {
        if (count == nullptr) return invalid_value;
        *count = 1;
        return ok;
      });
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return driver_call(
      "cuDeviceGetName", needs::init, [&] { return fmt::format("name, {}, {}", len, dev); },
      [&](simulator& sim) -> int {
        if (name == nullptr || len <= 0) return invalid_value;
        if (check_device(dev) != ok) return invalid_device;
        const std::string text = sim.device_name();
        const std::size_t n = std::min(text.size(), static_cast<std::size_t>(len) - 1);
        std::memcpy(name, text.data(), n);
        name[n] = '\0';
        return ok;
      });
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return driver_call(
      "cuDeviceTotalMem_v2", needs::init, [&] { return fmt::format("&bytes, {}", dev); },
      [&](simulator& sim) -> int {
        if (bytes == nullptr) return invalid_value;
        if (check_device(dev) != ok) return invalid_device;
        *bytes = sim.device().total_memory();
        return ok;
      });
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return driver_call(
      "cuDeviceGetAttribute", needs::init,
      [&] { return fmt::format("&value, {}, {}", static_cast<int>(attrib), dev); },
      [&](simulator&) -> int {
        if (pi == nullptr) return invalid_value;
        if (check_device(dev) != ok) return invalid_device;
        return device_attribute(static_cast<int>(attrib), *pi) ? ok : invalid_value;
      });
}

// ---------------------------------------------------------------------------------------------
// Contexts: one primary context on device 0
// ---------------------------------------------------------------------------------------------

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return driver_call(
      "cuDevicePrimaryCtxRetain", needs::init, [&] { return fmt::format("&ctx, {}", dev); },
      [&](simulator&) -> int {
        if (pctx == nullptr) return invalid_value;
        if (check_device(dev) != ok) return invalid_device;
        primary_retains.fetch_add(1);
        *pctx = primary_context();
        return ok;
      });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return driver_call(
      "cuDevicePrimaryCtxRelease_v2", needs::init, [&] { return fmt::format("{}", dev); },
      [&](simulator&) -> int {
        if (check_device(dev) != ok) return invalid_device;
        long n = primary_retains.load();
        do {
          if (n <= 0) return invalid_context;
        } while (!primary_retains.compare_exchange_weak(n, n - 1));
        return ok;
      });
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return driver_call(
      "cuDevicePrimaryCtxGetState", needs::init,
      [&] { return fmt::format("{}, &flags, &active", dev); },
      [&](simulator&) -> int {
        if (flags == nullptr || active == nullptr) return invalid_value;
        if (check_device(dev) != ok) return invalid_device;
        *flags = 0;
        *active = primary_retains.load() > 0 ? 1 : 0;
        return ok;
      });
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  return driver_call(
      "cuCtxGetCurrent", needs::init, [] { return std::string("&ctx"); },
      [&](simulator&) -> int {
        if (pctx == nullptr) return invalid_value;
        *pctx = current_context;
        return ok;
      });
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  return driver_call(
      "cuCtxSetCurrent", needs::init, [&] { return fmt::format("{}", static_cast<void*>(ctx)); },
      [&](simulator&) -> int {
        if (ctx != nullptr && ctx != primary_context()) return invalid_context;
        current_context = ctx;
        return ok;
      });
}

CUresult cuCtxGetDevice(CUdevice* device) {
  return driver_call(
      "cuCtxGetDevice", needs::context, [] { return std::string("&device"); },
      [&](simulator&) -> int {
        if (device == nullptr) return invalid_value;
        *device = 0;
        return ok;
      });
}

CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (ctx == nullptr) return cuCtxGetDevice(device);
  return driver_call(
      "cuCtxGetDevice_v2", needs::init,
      [&] { return fmt::format("&device, {}", static_cast<void*>(ctx)); },
      [&](simulator&) -> int {
        if (device == nullptr) return invalid_value;
        if (ctx != primary_context()) return invalid_context;
        *device = 0;
        return ok;
      });
}

CUresult cuCtxSynchronize(void) {
  return driver_call(
      "cuCtxSynchronize", needs::context, [] { return std::string(); },
      [&](simulator& sim) -> int { return sim.synchronize_device(); });
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr) return cuCtxSynchronize();
  return driver_call(
      "cuCtxSynchronize_v2", needs::init,
      [&] { return fmt::format("{}", static_cast<void*>(ctx)); },
      [&](simulator& sim) -> int {
        if (ctx != primary_context()) return invalid_context;
        return sim.synchronize_device();
      });
}

// ---------------------------------------------------------------------------------------------
// Memory: segments
// ---------------------------------------------------------------------------------------------

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return driver_call(
      "cuMemGetInfo_v2", needs::context, [] { return std::string("&free, &total"); },
      [&](simulator& sim) -> int {
        if (free == nullptr || total == nullptr) return invalid_value;
        return sim.memory_info(*free, *total);
      });
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return driver_call(
      "cuMemAlloc_v2", needs::context, [&] { return fmt::format("&dptr, {}", bytesize); },
      [&](simulator& sim) -> int {
        if (dptr == nullptr || bytesize == 0) return invalid_value;
        void* p = nullptr;
        const int s = sim.allocate(p, bytesize);
        if (s == ok) *dptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
        return s;
      });
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return driver_call(
      "cuMemFree_v2", needs::context, [&] { return hex(dptr); },
      [&](simulator& sim) -> int { return sim.free(as_pointer(dptr)); });
}

// ---------------------------------------------------------------------------------------------
// Memory: virtual memory management
// ---------------------------------------------------------------------------------------------

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  return driver_call(
      "cuMemGetAllocationGranularity", needs::init,
      [&] { return fmt::format("&granularity, prop, {}", static_cast<int>(option)); },
      [&](simulator& sim) -> int {
        if (granularity == nullptr) return invalid_value;
        if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
            option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
          return invalid_value;
        }
        if (const int s = check_prop(prop); s != ok) return s;
        *granularity = sim.device().granularity();
        return ok;
      });
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  return driver_call(
      "cuMemAddressReserve", needs::init,
      [&] { return fmt::format("&ptr, {}, {}, {}, {}", size, alignment, hex(addr), flags); },
      [&](simulator& sim) -> int {
        if (ptr == nullptr || flags != 0) return invalid_value;
        // `addr` is a hint; the simulated device always chooses the address.
        *ptr = static_cast<CUdeviceptr>(sim.device().reserve_address(size, alignment));
        return ok;
      });
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return driver_call(
      "cuMemAddressFree", needs::init, [&] { return fmt::format("{}, {}", hex(ptr), size); },
      [&](simulator& sim) -> int {
        sim.device().free_address(static_cast<std::uintptr_t>(ptr), size);
        return ok;
      });
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  return driver_call(
      "cuMemCreate", needs::init, [&] { return fmt::format("&handle, {}, prop, {}", size, flags); },
      [&](simulator& sim) -> int {
        if (handle == nullptr || flags != 0) return invalid_value;
        if (const int s = check_prop(prop); s != ok) return s;
        const auto h = sim.device().create_physical(size);
        if (h == gpumem::simulated_device::invalid_physical_handle) return out_of_memory;
        *handle = static_cast<CUmemGenericAllocationHandle>(h);
        return ok;
      });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return driver_call(
      "cuMemRelease", needs::init, [&] { return fmt::format("{}", handle); },
      [&](simulator& sim) -> int {
        sim.device().release_physical(handle);
        return ok;
      });
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  return driver_call(
      "cuMemMap", needs::init,
      [&] { return fmt::format("{}, {}, {}, {}, {}", hex(ptr), size, offset, handle, flags); },
      [&](simulator& sim) -> int {
        if (flags != 0) return invalid_value;
        // cuda.h: the offset "currently must be zero" (simulated_device itself accepts others).
        if (offset != 0) {
          throw gpumem::cuda_error(invalid_value,
                                   fmt::format("cuMemMap: offset {} must be 0", offset));
        }
        sim.device().map(static_cast<std::uintptr_t>(ptr), size, offset, handle);
        return ok;
      });
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return driver_call(
      "cuMemUnmap", needs::init, [&] { return fmt::format("{}, {}", hex(ptr), size); },
      [&](simulator& sim) -> int {
        sim.device().unmap(static_cast<std::uintptr_t>(ptr), size);
        return ok;
      });
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return driver_call(
      "cuMemSetAccess", needs::init,
      [&] { return fmt::format("{}, {}, desc, {}", hex(ptr), size, count); },
      [&](simulator& sim) -> int {
        if (desc == nullptr || count == 0) return invalid_value;
        for (size_t i = 0; i < count; ++i) {
          if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return invalid_value;
          if (desc[i].location.id != 0) return invalid_device;
          if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) return not_supported;
          if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
              desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            return invalid_value;
          }
        }
        sim.device().set_access(static_cast<std::uintptr_t>(ptr), size);
        return ok;
      });
}

// ---------------------------------------------------------------------------------------------
// Errors and entry points
// ---------------------------------------------------------------------------------------------

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = driver_error_string(static_cast<int>(error));
  return *pStr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = driver_error_name(static_cast<int>(error));
  return *pStr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  // Needs neither cuInit nor a usable simulator, as in CUDA.
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t known =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  try {
    CUdriverProcAddressQueryResult why = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = find_proc(symbol, cudaVersion, flags, why);
    if (symbolStatus != nullptr) *symbolStatus = why;
    if (simulator* sim = get(); sim != nullptr && sim->logging()) {
      sim->log(fmt::format("cuGetProcAddress_v2({}, &pfn, {}, {}) = {}", symbol, cudaVersion, flags,
                           *pfn != nullptr ? "found" : "not found"));
    }
    return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  } catch (...) {
    *pfn = nullptr;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
