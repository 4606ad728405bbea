// gpumem CUDA simulator — libcuda.so.1: the CUDA driver API on the simulated devices.
//
// This library owns the process-wide simulator (simulator.hpp), created on first use from the
// GPUMEM_SIM_* environment, and the per-thread state both libraries use (the context stack, the
// capture interaction mode), and exports them to the simulated libcudart.so.13 through
// gpumemSimInternalInstance() and gpumemSimInternalThread(). It implements the driver calls
// allocators use (device queries, primary contexts, cuMemAlloc/cuMemFree, the virtual memory
// management API, peer access, kernel launches, error strings, cuGetProcAddress) and the
// simulator's own functions (gpumem_cudasim.h); every other function the real library exports is
// a stub (stubs.hpp) that returns CUDA_ERROR_NOT_SUPPORTED. No C++ exception leaves an exported
// function.
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
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuStreamGetCaptureInfo

extern "C" {
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void** kernelParams, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                               void** extra);
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                cuuint64_t* id_out);
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out,
                                        const CUgraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
}

namespace gpumem::cudasim {
namespace {

// Never destroyed: programs call CUDA from their own static destructors, after ours would run.
simulator* instance = nullptr;
std::once_flag instance_once;
std::atomic<bool> initialized{false};  // cuInit was called
thread_local thread_state this_thread;

simulator* get() noexcept {
  std::call_once(instance_once, [] {
    try {
      const settings s = read_settings();
      instance = new simulator(s);
      instance->log(fmt::format(
          "started: GPUMEM_SIM_DEVICES={}, GPUMEM_SIM_MEMORY={} ({} bytes), "
          "GPUMEM_SIM_EVENT_DELAY={}s, GPUMEM_SIM_BANDWIDTH={}, GPUMEM_SIM_KERNEL_TIME={}s, "
          "GPUMEM_SIM_STRICT={}, GPUMEM_SIM_FAIL_NTH={}, GPUMEM_SIM_FAIL_ABOVE={}, "
          "GPUMEM_SIM_FAIL_PROBABILITY={}, GPUMEM_SIM_SEED={}",
          s.devices, format_bytes(s.memory), s.memory, s.event_delay, s.bandwidth, s.kernel_time,
          s.strict == strictness::abort ? "abort" : "off", s.faults.fail_nth_call,
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
    if (need == needs::context && this_thread.current() == nullptr) {
      throw cuda_error(invalid_context, "no context is current on this thread");
    }
    return body(*sim);
  }));
}

void* as_pointer(CUdeviceptr p) noexcept {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}

int check_device(const simulator& sim, CUdevice dev) noexcept {
  return sim.valid_device(dev) ? ok : invalid_device;
}

// The device of the current context (a context is current: needs::context).
int context_device(const simulator& sim) {
  const int d = sim.context_device(this_thread.current());
  if (d < 0) throw cuda_error(invalid_context, "the current context is not a simulated one");
  return d;
}

// The device of the current context, or the runtime's device when none is current.
int current_device(const simulator& sim) noexcept {
  const int d = sim.context_device(this_thread.current());
  return d >= 0 ? d : this_thread.runtime_device;
}

// An allocation property the simulated devices support: pinned memory on one of them.
int check_prop(const simulator& sim, const CUmemAllocationProp* prop) noexcept {
  if (prop == nullptr) return invalid_value;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return invalid_value;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return invalid_value;
  if (!sim.valid_device(prop->location.id)) return invalid_device;
  const auto handles = static_cast<unsigned>(prop->requestedHandleTypes);
  const auto known = static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) |
                     static_cast<unsigned>(CU_MEM_HANDLE_TYPE_FABRIC);
  if ((handles & ~known) != 0) return not_supported;
  return ok;
}

template <class T>
const void* ptr(T* handle) noexcept {
  return static_cast<const void*>(handle);
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
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
    {"cuCtxEnablePeerAccess", 4000, "cuCtxEnablePeerAccess"},
    {"cuCtxDisablePeerAccess", 4000, "cuCtxDisablePeerAccess"},
    {"cuDeviceCanAccessPeer", 4000, "cuDeviceCanAccessPeer"},
    {"cuLaunchKernel", 4000, "cuLaunchKernel"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx"},
    {"cuThreadExchangeStreamCaptureMode", 10010, "cuThreadExchangeStreamCaptureMode"},
    {"cuCtxPushCurrent", 2000, "cuCtxPushCurrent"},  // the older ABIs: the stubs
    {"cuCtxPopCurrent", 2000, "cuCtxPopCurrent"},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize"},
    {"cuStreamQuery", 2000, "cuStreamQuery"},
    {"cuStreamWaitEvent", 3020, "cuStreamWaitEvent"},
    {"cuEventRecord", 2000, "cuEventRecord"},
    {"cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags"},
    {"cuEventQuery", 2000, "cuEventQuery"},
    {"cuEventSynchronize", 2000, "cuEventSynchronize"},
    {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture"},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing"},
    {"cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo"},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2"},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3"},
    {"cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags"},
    {"cuGraphLaunch", 10000, "cuGraphLaunch"},
    {"cuGraphExecDestroy", 10000, "cuGraphExecDestroy"},
    {"cuGraphDestroy", 10000, "cuGraphDestroy"},
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
    {"cuMemGetAllocationPropertiesFromHandle", 10020, "cuMemGetAllocationPropertiesFromHandle"},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve"},
    {"cuMemAddressFree", 10020, "cuMemAddressFree"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease"},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle"},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle"},
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

// The body of the gpumemSim* calls that return 0 or -1: -1 when there is no simulator, when `f`
// returns false (a rejected argument) or throws; else 0.
template <class F>
int with_simulator(const F& f) noexcept {
  simulator* sim = get();
  if (sim == nullptr) return -1;
  try {
    return f(*sim) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

// Copies the counters of `device` (-1: every device) to `out`, at most `size` bytes of them.
void copy_counters(simulator& sim, int device, gpumemSimCounters* out, std::size_t size) {
  gpumemSimCounters c{};
  sim.read_counters(c, device);
  std::memcpy(out, &c, std::min(size, sizeof c));
}

}  // namespace

int driver_unimplemented(const char* name, std::atomic<bool>& reported) noexcept {
  report_unimplemented(get(), name, "CUDA_ERROR_NOT_SUPPORTED", reported);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace gpumem::cudasim

using namespace gpumem::cudasim;  // NOLINT: the exported functions below are its users

extern "C" {

gpumem::cudasim::simulator* gpumemSimInternalInstance(void) {
  return get();
}

gpumem::cudasim::thread_state* gpumemSimInternalThread(void) {
  return &this_thread;
}

int gpumemSimGetCounters(gpumemSimCounters* out, size_t size) {
  return with_simulator([&](simulator& sim) {
    if (out == nullptr) return false;
    copy_counters(sim, -1, out, size);
    return true;
  });
}

int gpumemSimResetCounters(void) {
  return with_simulator([](simulator& sim) {
    sim.reset_counters();
    return true;
  });
}

int gpumemSimGetDeviceCounters(int device, gpumemSimCounters* out, size_t size) {
  return with_simulator([&](simulator& sim) {
    if (out == nullptr || !sim.valid_device(device)) return false;
    copy_counters(sim, device, out, size);
    return true;
  });
}

int gpumemSimResetViolations(void) {
  return with_simulator([](simulator& sim) {
    sim.reset_violations();
    return true;
  });
}

size_t gpumemSimGetLastViolation(char* buffer, size_t size) {
  simulator* sim = get();
  if (sim == nullptr) return 0;
  try {
    const std::string text = sim->last_violation();
    if (buffer != nullptr && size > 0) {
      const std::size_t n = std::min(text.size(), size - 1);
      std::memcpy(buffer, text.data(), n);
      buffer[n] = '\0';
    }
    return text.size();
  } catch (...) {
    return 0;
  }
}

int gpumemSimLaunchWork(CUstream stream, const gpumemSimRange* ranges, size_t count,
                        double seconds) {
  simulator* sim = get();
  if (sim == nullptr) return -1;
  return call(
      *sim, api::runtime, "gpumemSimLaunchWork",
      [&] { return fmt::format("{}, ranges, {}, {}", static_cast<void*>(stream), count, seconds); },
      [&]() -> int {
        return sim->launch_work(current_device(*sim), reinterpret_cast<cudaStream_t>(stream),
                                ranges, count, seconds);
      });
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
      [&](simulator& sim) -> int {
        if (device == nullptr) return invalid_value;
        if (!sim.valid_device(ordinal)) return invalid_device;
        *device = ordinal;
        return ok;
      });
}

CUresult cuDeviceGetCount(int* count) {
  return driver_call(
      "cuDeviceGetCount", needs::init, [] { return std::string("&count"); },
      [&](simulator& sim) -> int {
        if (count == nullptr) return invalid_value;
        *count = sim.device_count();
        return ok;
      });
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return driver_call(
      "cuDeviceGetName", needs::init, [&] { return fmt::format("name, {}, {}", len, dev); },
      [&](simulator& sim) -> int {
        if (name == nullptr || len <= 0) return invalid_value;
        if (check_device(sim, dev) != ok) return invalid_device;
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
        if (check_device(sim, dev) != ok) return invalid_device;
        *bytes = sim.device(dev).total_memory();
        return ok;
      });
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return driver_call(
      "cuDeviceGetAttribute", needs::init,
      [&] { return fmt::format("&value, {}, {}", static_cast<int>(attrib), dev); },
      [&](simulator& sim) -> int {
        if (pi == nullptr) return invalid_value;
        if (check_device(sim, dev) != ok) return invalid_device;
        return device_attribute(static_cast<int>(attrib), *pi, dev, sim.config()) ? ok
                                                                                  : invalid_value;
      });
}

// ---------------------------------------------------------------------------------------------
// Contexts: one primary context per device
// ---------------------------------------------------------------------------------------------

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return driver_call(
      "cuDevicePrimaryCtxRetain", needs::init, [&] { return fmt::format("&ctx, {}", dev); },
      [&](simulator& sim) -> int {
        if (pctx == nullptr) return invalid_value;
        if (check_device(sim, dev) != ok) return invalid_device;
        sim.retain_primary(dev);
        *pctx = simulator::primary_context(dev);
        return ok;
      });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return driver_call(
      "cuDevicePrimaryCtxRelease_v2", needs::init, [&] { return fmt::format("{}", dev); },
      [&](simulator& sim) -> int {
        if (check_device(sim, dev) != ok) return invalid_device;
        return sim.release_primary(dev) ? ok : invalid_context;
      });
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return driver_call(
      "cuDevicePrimaryCtxGetState", needs::init,
      [&] { return fmt::format("{}, &flags, &active", dev); },
      [&](simulator& sim) -> int {
        if (flags == nullptr || active == nullptr) return invalid_value;
        if (check_device(sim, dev) != ok) return invalid_device;
        *flags = 0;
        *active = sim.primary_active(dev) ? 1 : 0;
        return ok;
      });
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  return driver_call(
      "cuCtxGetCurrent", needs::init, [] { return std::string("&ctx"); },
      [&](simulator&) -> int {
        if (pctx == nullptr) return invalid_value;
        *pctx = this_thread.current();
        return ok;
      });
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  return driver_call(
      "cuCtxSetCurrent", needs::init, [&] { return fmt::format("{}", static_cast<void*>(ctx)); },
      [&](simulator& sim) -> int {
        if (ctx != nullptr && sim.context_device(ctx) < 0) return invalid_context;
        this_thread.set_current(ctx);
        return ok;
      });
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return driver_call(
      "cuCtxPushCurrent_v2", needs::init,
      [&] { return fmt::format("{}", static_cast<void*>(ctx)); },
      [&](simulator& sim) -> int {
        if (ctx == nullptr || sim.context_device(ctx) < 0) return invalid_context;
        this_thread.contexts.push_back(ctx);
        return ok;
      });
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  return driver_call(
      "cuCtxPopCurrent_v2", needs::init, [] { return std::string("&ctx"); },
      [&](simulator&) -> int {
        if (this_thread.contexts.empty()) return invalid_context;
        if (pctx != nullptr) *pctx = this_thread.contexts.back();
        this_thread.contexts.pop_back();
        return ok;
      });
}

CUresult cuCtxGetDevice(CUdevice* device) {
  return driver_call(
      "cuCtxGetDevice", needs::context, [] { return std::string("&device"); },
      [&](simulator& sim) -> int {
        if (device == nullptr) return invalid_value;
        *device = context_device(sim);
        return ok;
      });
}

CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (ctx == nullptr) return cuCtxGetDevice(device);
  return driver_call(
      "cuCtxGetDevice_v2", needs::init,
      [&] { return fmt::format("&device, {}", static_cast<void*>(ctx)); },
      [&](simulator& sim) -> int {
        if (device == nullptr) return invalid_value;
        const int d = sim.context_device(ctx);
        if (d < 0) return invalid_context;
        *device = d;
        return ok;
      });
}

CUresult cuCtxSynchronize(void) {
  return driver_call(
      "cuCtxSynchronize", needs::context, [] { return std::string(); },
      [&](simulator& sim) -> int {
        return sim.synchronize_device(context_device(sim), "cuCtxSynchronize");
      });
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr) return cuCtxSynchronize();
  return driver_call(
      "cuCtxSynchronize_v2", needs::init,
      [&] { return fmt::format("{}", static_cast<void*>(ctx)); },
      [&](simulator& sim) -> int {
        const int d = sim.context_device(ctx);
        if (d < 0) return invalid_context;
        return sim.synchronize_device(d, "cuCtxSynchronize_v2");
      });
}

// ---------------------------------------------------------------------------------------------
// Peer access
// ---------------------------------------------------------------------------------------------

CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  return driver_call(
      "cuDeviceCanAccessPeer", needs::init,
      [&] { return fmt::format("&can, {}, {}", dev, peerDev); },
      [&](simulator& sim) -> int {
        if (canAccessPeer == nullptr) return invalid_value;
        if (check_device(sim, dev) != ok || check_device(sim, peerDev) != ok) {
          return invalid_device;
        }
        *canAccessPeer = dev != peerDev ? 1 : 0;
        return ok;
      });
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  return driver_call(
      "cuCtxEnablePeerAccess", needs::context,
      [&] { return fmt::format("{}, {}", static_cast<void*>(peerContext), Flags); },
      [&](simulator& sim) -> int {
        const int peer = sim.context_device(peerContext);
        if (peer < 0) return invalid_context;
        return sim.enable_peer_access(context_device(sim), peer, Flags);
      });
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  return driver_call(
      "cuCtxDisablePeerAccess", needs::context,
      [&] { return fmt::format("{}", static_cast<void*>(peerContext)); },
      [&](simulator& sim) -> int {
        const int peer = sim.context_device(peerContext);
        if (peer < 0) return invalid_context;
        return sim.disable_peer_access(context_device(sim), peer);
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
        return sim.memory_info(context_device(sim), *free, *total);
      });
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return driver_call(
      "cuMemAlloc_v2", needs::context, [&] { return fmt::format("&dptr, {}", bytesize); },
      [&](simulator& sim) -> int {
        if (dptr == nullptr || bytesize == 0) return invalid_value;
        void* p = nullptr;
        const int s = sim.allocate(context_device(sim), p, bytesize, "cuMemAlloc");
        if (s == ok) *dptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
        return s;
      });
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return driver_call(
      "cuMemFree_v2", needs::context, [&] { return hex(dptr); },
      [&](simulator& sim) -> int {
        return sim.free(context_device(sim), as_pointer(dptr), "cuMemFree");
      });
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
        if (const int s = check_prop(sim, prop); s != ok) return s;
        *granularity = sim.device(prop->location.id).granularity();
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
        // `addr` is a hint; the simulated device always chooses the address, in the range of
        // the current context's device (device 0 without one).
        const int d = sim.context_device(this_thread.current());
        *ptr = static_cast<CUdeviceptr>(sim.reserve_address(d >= 0 ? d : 0, size, alignment));
        return ok;
      });
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return driver_call(
      "cuMemAddressFree", needs::init, [&] { return fmt::format("{}, {}", hex(ptr), size); },
      [&](simulator& sim) -> int {
        return sim.free_address(static_cast<std::uintptr_t>(ptr), size);
      });
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  return driver_call(
      "cuMemCreate", needs::init, [&] { return fmt::format("&handle, {}, prop, {}", size, flags); },
      [&](simulator& sim) -> int {
        if (handle == nullptr || flags != 0) return invalid_value;
        if (const int s = check_prop(sim, prop); s != ok) return s;
        // Fabric handles as GPUMEM_SIM_FABRIC says: refused without an IMEX channel (the
        // default, an H100/H200 server) or on a GPU without them, which PyTorch and gpumem fall
        // back from to POSIX file descriptors.
        const auto types = static_cast<unsigned>(prop->requestedHandleTypes);
        if ((types & static_cast<unsigned>(CU_MEM_HANDLE_TYPE_FABRIC)) != 0) {
          switch (sim.config().fabric) {
            case fabric_support::unsupported:
              return not_supported;
            case fabric_support::no_imex:
              return not_permitted;
            case fabric_support::imex:
              break;
          }
        }
        // GPUDirect RDMA on VMM memory only where the GPU reports it (the simulated one does).
        const bool rdma = prop->allocFlags.gpuDirectRDMACapable != 0;
        int rdma_supported = 0;
        device_attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                         rdma_supported, prop->location.id);
        if (rdma && rdma_supported == 0) return not_supported;
        std::uint64_t h = 0;
        const int s = sim.create_physical(prop->location.id, size, types, rdma, h);
        if (s == ok) *handle = static_cast<CUmemGenericAllocationHandle>(h);
        return s;
      });
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  return driver_call(
      "cuMemGetAllocationPropertiesFromHandle", needs::init,
      [&] { return fmt::format("prop, {:#x}", handle); },
      [&](simulator& sim) -> int {
        if (prop == nullptr) return invalid_value;
        int device = 0;
        unsigned types = 0;
        bool rdma = false;
        const int s = sim.allocation_properties(handle, device, types, rdma);
        if (s != ok) return s;
        *prop = CUmemAllocationProp{};
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = device;
        prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
        prop->allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
        return ok;
      });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return driver_call(
      "cuMemRelease", needs::init, [&] { return fmt::format("{:#x}", handle); },
      [&](simulator& sim) -> int { return sim.release_physical(handle); });
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags) {
  return driver_call(
      "cuMemExportToShareableHandle", needs::init,
      [&] {
        return fmt::format("{}, {:#x}, {}, {}", ptr(shareable), handle, static_cast<int>(type),
                           flags);
      },
      [&](simulator& sim) -> int {
        if (shareable == nullptr || flags != 0) return invalid_value;
        if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
          CUmemFabricHandle fabric{};
          const int s = sim.export_fabric_handle(handle, fabric.data);
          if (s == ok) std::memcpy(shareable, &fabric, sizeof fabric);
          return s;
        }
        int fd = -1;
        const int s = sim.export_handle(handle, static_cast<unsigned>(type), fd);
        if (s == ok) *static_cast<int*>(shareable) = fd;
        return s;
      });
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  return driver_call(
      "cuMemImportFromShareableHandle", needs::init,
      [&] { return fmt::format("&handle, {}, {}", ptr(os_handle), static_cast<int>(type)); },
      [&](simulator& sim) -> int {
        if (handle == nullptr) return invalid_value;
        if (type == CU_MEM_HANDLE_TYPE_FABRIC) {  // os_handle points at a CUmemFabricHandle
          if (os_handle == nullptr) return invalid_value;
          CUmemFabricHandle fabric{};
          std::memcpy(&fabric, os_handle, sizeof fabric);
          std::uint64_t h = 0;
          const int s = sim.import_fabric_handle(fabric.data, h);
          if (s == ok) *handle = static_cast<CUmemGenericAllocationHandle>(h);
          return s;
        }
        // A POSIX file descriptor travels in the pointer's bits (cuda.h).
        const int fd = static_cast<int>(reinterpret_cast<std::uintptr_t>(os_handle));
        std::uint64_t h = 0;
        const int s = sim.import_handle(fd, static_cast<unsigned>(type), h);
        if (s == ok) *handle = static_cast<CUmemGenericAllocationHandle>(h);
        return s;
      });
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  return driver_call(
      "cuMemMap", needs::init,
      [&] { return fmt::format("{}, {}, {}, {:#x}, {}", hex(ptr), size, offset, handle, flags); },
      [&](simulator& sim) -> int {
        if (flags != 0) return invalid_value;
        // cuda.h: the offset "currently must be zero" (simulated_device itself accepts others).
        if (offset != 0) {
          throw gpumem::cuda_error(invalid_value,
                                   fmt::format("cuMemMap: offset {} must be 0", offset));
        }
        return sim.map(static_cast<std::uintptr_t>(ptr), size, offset, handle);
      });
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return driver_call(
      "cuMemUnmap", needs::init, [&] { return fmt::format("{}, {}", hex(ptr), size); },
      [&](simulator& sim) -> int { return sim.unmap(static_cast<std::uintptr_t>(ptr), size); });
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return driver_call(
      "cuMemSetAccess", needs::init,
      [&] { return fmt::format("{}, {}, desc, {}", hex(ptr), size, count); },
      [&](simulator& sim) -> int {
        return sim.set_access(static_cast<std::uintptr_t>(ptr), size, desc, count);
      });
}

// ---------------------------------------------------------------------------------------------
// Kernels and capture
// ---------------------------------------------------------------------------------------------

CUresult cuLaunchKernel(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream hStream, void**,
                        void**) {
  return driver_call(
      "cuLaunchKernel", needs::context,
      [&] {
        return fmt::format("{}, ..., {}", static_cast<void*>(f), static_cast<void*>(hStream));
      },
      [&](simulator& sim) -> int {
        if (f == nullptr) return invalid_handle;
        return sim.launch_kernel(context_device(sim), hStream, "cuLaunchKernel");
      });
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                             CUstream hStream, void** params, void** extra) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, hStream, params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  return driver_call(
      "cuLaunchKernelEx", needs::context,
      [&] { return fmt::format("config, {}", static_cast<void*>(f)); },
      [&](simulator& sim) -> int {
        if (config == nullptr) return invalid_value;
        if (f == nullptr) return invalid_handle;
        return sim.launch_kernel(context_device(sim), config->hStream, "cuLaunchKernelEx");
      });
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra) {
  return cuLaunchKernelEx(config, f, params, extra);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return driver_call(
      "cuThreadExchangeStreamCaptureMode", needs::nothing, [] { return std::string("&mode"); },
      [&](simulator&) -> int {
        if (mode == nullptr || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
            *mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
          return invalid_value;
        }
        const auto previous = static_cast<CUstreamCaptureMode>(this_thread.capture_mode);
        this_thread.capture_mode = static_cast<cudaStreamCaptureMode>(*mode);
        *mode = previous;
        return ok;
      });
}

// ---------------------------------------------------------------------------------------------
// Streams, events, capture and graphs: the runtime's, under the driver's names (a CUstream is a
// cudaStream_t, a CUgraph a cudaGraph_t, ...); the null stream is the current context's legacy
// stream, and the per-thread default stream is the legacy stream too.
// ---------------------------------------------------------------------------------------------

CUresult cuStreamSynchronize(CUstream hStream) {
  return driver_call(
      "cuStreamSynchronize", needs::context, [&] { return fmt::format("{}", ptr(hStream)); },
      [&](simulator& sim) -> int {
        return sim.synchronize_stream(context_device(sim), hStream, "cuStreamSynchronize");
      });
}
CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return cuStreamSynchronize(hStream);
}

CUresult cuStreamQuery(CUstream hStream) {
  return driver_call(
      "cuStreamQuery", needs::context, [&] { return fmt::format("{}", ptr(hStream)); },
      [&](simulator& sim) -> int {
        return sim.query_stream(context_device(sim), hStream, "cuStreamQuery");
      });
}
CUresult cuStreamQuery_ptsz(CUstream hStream) {
  return cuStreamQuery(hStream);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return driver_call(
      "cuStreamWaitEvent", needs::context,
      [&] { return fmt::format("{}, {}, {}", ptr(hStream), ptr(hEvent), Flags); },
      [&](simulator& sim) -> int {
        if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return invalid_value;
        return sim.stream_wait_event(context_device(sim), hStream, hEvent, Flags);
      });
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return cuStreamWaitEvent(hStream, hEvent, Flags);
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return driver_call(
      "cuEventRecordWithFlags", needs::context,
      [&] { return fmt::format("{}, {}, {}", ptr(hEvent), ptr(hStream), flags); },
      [&](simulator& sim) -> int {
        if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return invalid_value;
        return sim.record_event(context_device(sim), hEvent, hStream, flags);
      });
}
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return cuEventRecordWithFlags(hEvent, hStream, flags);
}
CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return cuEventRecordWithFlags(hEvent, hStream, 0);
}
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return cuEventRecordWithFlags(hEvent, hStream, 0);
}

CUresult cuEventQuery(CUevent hEvent) {
  return driver_call(
      "cuEventQuery", needs::context, [&] { return fmt::format("{}", ptr(hEvent)); },
      [&](simulator& sim) -> int { return sim.query_event(hEvent); });
}

CUresult cuEventSynchronize(CUevent hEvent) {
  return driver_call(
      "cuEventSynchronize", needs::context, [&] { return fmt::format("{}", ptr(hEvent)); },
      [&](simulator& sim) -> int { return sim.synchronize_event(hEvent); });
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return driver_call(
      "cuStreamBeginCapture_v2", needs::context,
      [&] { return fmt::format("{}, {}", ptr(hStream), static_cast<int>(mode)); },
      [&](simulator& sim) -> int {
        return sim.begin_capture(context_device(sim), hStream,
                                 static_cast<cudaStreamCaptureMode>(mode));
      });
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return cuStreamBeginCapture_v2(hStream, mode);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return driver_call(
      "cuStreamEndCapture", needs::context, [&] { return fmt::format("{}, &graph", ptr(hStream)); },
      [&](simulator& sim) -> int {
        return sim.end_capture(context_device(sim), hStream, phGraph);
      });
}
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return cuStreamEndCapture(hStream, phGraph);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   const CUgraphEdgeData** edgeData_out,
                                   size_t* numDependencies_out) {
  return driver_call(
      "cuStreamGetCaptureInfo_v3", needs::context,
      [&] { return fmt::format("{}, &status, ...", ptr(hStream)); },
      [&](simulator& sim) -> int {
        if (captureStatus_out == nullptr) return invalid_value;
        if (edgeData_out != nullptr && dependencies_out == nullptr) return invalid_value;
        if (edgeData_out != nullptr) *edgeData_out = nullptr;  // no edge data: default edges
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        unsigned long long id = 0;
        const int r =
            sim.capture_info(context_device(sim), hStream, st, id_out != nullptr ? &id : nullptr,
                             graph_out, dependencies_out, numDependencies_out);
        *captureStatus_out = static_cast<CUstreamCaptureStatus>(st);
        if (id_out != nullptr) *id_out = id;
        return r;
      });
}
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out,
                                        const CUgraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                                   edgeData_out, numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                                   nullptr, numDependencies_out);
}
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                cuuint64_t* id_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr,
                                   nullptr);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus, nullptr, nullptr, nullptr, nullptr,
                                   nullptr);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return cuStreamIsCapturing(hStream, captureStatus);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
  return driver_call(
      "cuGraphInstantiateWithFlags", needs::context,
      [&] { return fmt::format("&exec, {}, {}", ptr(hGraph), flags); },
      [&](simulator& sim) -> int {
        if (phGraphExec == nullptr) return invalid_value;
        return sim.instantiate(*phGraphExec, hGraph, flags);
      });
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return driver_call(
      "cuGraphLaunch", needs::context,
      [&] { return fmt::format("{}, {}", ptr(hGraphExec), ptr(hStream)); },
      [&](simulator& sim) -> int {
        return sim.launch_graph(context_device(sim), hGraphExec, hStream);
      });
}
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return cuGraphLaunch(hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return driver_call(
      "cuGraphExecDestroy", needs::init, [&] { return fmt::format("{}", ptr(hGraphExec)); },
      [&](simulator& sim) -> int { return sim.destroy_exec(hGraphExec); });
}

CUresult cuGraphDestroy(CUgraph hGraph) {
  return driver_call(
      "cuGraphDestroy", needs::init, [&] { return fmt::format("{}", ptr(hGraph)); },
      [&](simulator& sim) -> int { return sim.destroy_graph(hGraph); });
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
