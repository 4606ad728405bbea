// gpumem CUDA simulator — libcudart.so.13: the CUDA runtime API on the simulated devices.
//
// The runtime shares the simulator of the simulated libcuda.so.1 (gpumemSimInternalInstance) and
// its per-thread state (gpumemSimInternalThread) and, like the real runtime, initialises the
// driver (cuInit) and makes the current device's primary context current on each thread that
// calls it while none is. It implements the runtime calls allocators and PyTorch use: device
// memory, devices and peer access, streams, events, pinned host memory, copies and fills, kernel
// launches, stream capture and graphs, errors, driver entry points. Every other function the real
// library exports is a stub (stubs.hpp) that returns cudaErrorNotSupported. The last error is per
// thread and sticky as in CUDA: a failed call sets it (cudaErrorNotReady, not an error, does not),
// a successful call leaves it, cudaGetLastError returns and clears it. No C++ exception leaves an
// exported function.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "simulator.hpp"
#include "stubs.hpp"

namespace gpumem::cudasim {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
std::once_flag driver_once;
std::array<std::atomic<unsigned>, max_devices> device_flags{};

// Makes device `d`'s primary context current on this thread (retained once by the runtime).
void bind_primary(simulator& sim, int d) {
  sim.retain_primary_for_runtime(d);
  gpumemSimInternalThread()->set_current(simulator::primary_context(d));
}

// The simulator, with the driver initialised and a context current on this thread (the primary
// context of the thread's device when none was); nullptr when the simulator cannot start.
simulator* runtime_instance() noexcept {
  simulator* sim = gpumemSimInternalInstance();
  if (sim == nullptr) return nullptr;
  std::call_once(driver_once, [] { (void)cuInit(0); });
  thread_state& t = *gpumemSimInternalThread();
  if (t.current() == nullptr) {
    try {
      bind_primary(*sim, t.runtime_device);
    } catch (...) {
      return nullptr;
    }
  }
  return sim;
}

// The runtime's current device: the current context's.
int cur(const simulator& sim) noexcept {
  thread_state& t = *gpumemSimInternalThread();
  const int d = sim.context_device(t.current());
  return d >= 0 ? d : t.runtime_device;
}

cudaError_t finish(int result) noexcept {
  const auto e = static_cast<cudaError_t>(result);
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

/// One runtime call: `body(sim)` returns a status. Never throws.
template <class Args, class Body>
cudaError_t runtime_call(const char* name, const Args& args, const Body& body) noexcept {
  simulator* sim = runtime_instance();
  if (sim == nullptr) return finish(cudaErrorInitializationError);
  return finish(call(*sim, api::runtime, name, args, [&]() -> int { return body(*sim); }));
}

int check_device(const simulator& sim, int device) noexcept {
  return sim.valid_device(device) ? ok : static_cast<int>(cudaErrorInvalidDevice);
}

const void* ptr(const void* p) noexcept {
  return p;
}

int check_kind(cudaMemcpyKind kind) noexcept {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault
             ? ok
             : static_cast<int>(cudaErrorInvalidMemcpyDirection);
}

// --- Implementations shared by the plain and per-thread-default-stream (_ptsz/_ptds) names ---

cudaError_t memcpy_impl(const char* name, void* dst, const void* src, size_t count,
                        cudaMemcpyKind kind) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}, {}, {}", ptr(dst), src, count, int{kind}); },
      [&](simulator& sim) -> int {
        if (const int s = check_kind(kind); s != ok) return s;
        return sim.copy(cur(sim), dst, src, count, false, nullptr, name);
      });
}

cudaError_t memcpy_async_impl(const char* name, void* dst, const void* src, size_t count,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  return runtime_call(
      name,
      [&] {
        return fmt::format("{}, {}, {}, {}, {}", ptr(dst), src, count, int{kind}, ptr(stream));
      },
      [&](simulator& sim) -> int {
        if (const int s = check_kind(kind); s != ok) return s;
        return sim.copy(cur(sim), dst, src, count, true, stream, name);
      });
}

cudaError_t memset_impl(const char* name, void* dst, int value, size_t count,
                        const cudaStream_t* stream) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}, {}", ptr(dst), value, count); },
      [&](simulator& sim) -> int {
        return sim.fill(cur(sim), dst, value, count, stream != nullptr,
                        stream != nullptr ? *stream : nullptr, name);
      });
}

cudaError_t stream_query_impl(const char* name, cudaStream_t stream) {
  return runtime_call(
      name, [&] { return fmt::format("{}", ptr(stream)); },
      [&](simulator& sim) -> int { return sim.query_stream(cur(sim), stream, name); });
}

cudaError_t stream_synchronize_impl(const char* name, cudaStream_t stream) {
  return runtime_call(
      name, [&] { return fmt::format("{}", ptr(stream)); },
      [&](simulator& sim) -> int { return sim.synchronize_stream(cur(sim), stream, name); });
}

cudaError_t stream_capturing_impl(const char* name, cudaStream_t stream,
                                  cudaStreamCaptureStatus* status_out) {
  return runtime_call(
      name, [&] { return fmt::format("{}, &status", ptr(stream)); },
      [&](simulator& sim) -> int {
        if (status_out == nullptr) return invalid_value;
        return sim.capture_info(cur(sim), stream, *status_out, nullptr, nullptr, nullptr, nullptr);
      });
}

cudaError_t capture_info_impl(const char* name, cudaStream_t stream,
                              cudaStreamCaptureStatus* status_out, unsigned long long* id_out,
                              cudaGraph_t* graph_out, const cudaGraphNode_t** dependencies_out,
                              const cudaGraphEdgeData** edge_data_out,
                              size_t* num_dependencies_out) {
  return runtime_call(
      name, [&] { return fmt::format("{}, &status, ...", ptr(stream)); },
      [&](simulator& sim) -> int {
        if (status_out == nullptr) return invalid_value;
        if (edge_data_out != nullptr && dependencies_out == nullptr) return invalid_value;
        if (edge_data_out != nullptr) *edge_data_out = nullptr;  // no edge data: default edges
        return sim.capture_info(cur(sim), stream, *status_out, id_out, graph_out, dependencies_out,
                                num_dependencies_out);
      });
}

cudaError_t stream_wait_event_impl(const char* name, cudaStream_t stream, cudaEvent_t event,
                                   unsigned flags) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}, {}", ptr(stream), ptr(event), flags); },
      [&](simulator& sim) -> int {
        if ((flags & ~static_cast<unsigned>(cudaEventWaitExternal)) != 0) return invalid_value;
        return sim.stream_wait_event(cur(sim), stream, event, flags);
      });
}

cudaError_t stream_info_impl(const char* name, cudaStream_t stream, unsigned* flags, int* priority,
                             unsigned long long* id, int* device) {
  return runtime_call(
      name, [&] { return fmt::format("{}", ptr(stream)); },
      [&](simulator& sim) -> int {
        if (flags == nullptr && priority == nullptr && id == nullptr && device == nullptr) {
          return invalid_value;
        }
        unsigned f = 0;
        int p = 0;
        std::uint64_t i = 0;
        int d = 0;
        if (const int s = sim.stream_info(cur(sim), stream, f, p, i, d); s != ok) return s;
        if (flags != nullptr) *flags = f;
        if (priority != nullptr) *priority = p;
        if (id != nullptr) *id = i;
        if (device != nullptr) *device = d;
        return ok;
      });
}

cudaError_t event_record_impl(const char* name, cudaEvent_t event, cudaStream_t stream,
                              unsigned flags) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}, {}", ptr(event), ptr(stream), flags); },
      [&](simulator& sim) -> int {
        if ((flags & ~static_cast<unsigned>(cudaEventRecordExternal)) != 0) return invalid_value;
        return sim.record_event(cur(sim), event, stream, flags);
      });
}

cudaError_t entry_point_impl(const char* name, const char* symbol, void** func, unsigned version,
                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return runtime_call(
      name,
      [&] { return fmt::format("{}, &func, {}, {}", symbol ? symbol : "null", version, flags); },
      [&](simulator&) -> int {
        if (symbol == nullptr || func == nullptr) return invalid_value;
        CUdriverProcAddressQueryResult why = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        const CUresult r = cuGetProcAddress(symbol, func, static_cast<int>(version), flags, &why);
        if (r == CUDA_ERROR_INVALID_VALUE) return invalid_value;
        // As in CUDA: a symbol that is not found is not an error; *func is null.
        if (r != CUDA_SUCCESS) *func = nullptr;
        if (status != nullptr) {
          *status = why == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess
                    : why == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        ? cudaDriverEntryPointVersionNotSufficent
                        : cudaDriverEntryPointSymbolNotFound;
        }
        return ok;
      });
}

cudaError_t launch_impl(const char* name, const void* func, cudaStream_t stream) {
  return runtime_call(
      name, [&] { return fmt::format("{}, ..., {}", func, ptr(stream)); },
      [&](simulator& sim) -> int {
        if (func == nullptr) return invalid_device_function;
        return sim.launch_kernel(cur(sim), stream, name);
      });
}

cudaError_t begin_capture_impl(const char* name, cudaStream_t stream, cudaStreamCaptureMode mode) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}", ptr(stream), static_cast<int>(mode)); },
      [&](simulator& sim) -> int { return sim.begin_capture(cur(sim), stream, mode); });
}

cudaError_t end_capture_impl(const char* name, cudaStream_t stream, cudaGraph_t* graph) {
  return runtime_call(
      name, [&] { return fmt::format("{}, &graph", ptr(stream)); },
      [&](simulator& sim) -> int { return sim.end_capture(cur(sim), stream, graph); });
}

cudaError_t instantiate_impl(const char* name, cudaGraphExec_t* exec, cudaGraph_t graph,
                             unsigned long long flags) {
  return runtime_call(
      name, [&] { return fmt::format("&exec, {}, {}", ptr(graph), flags); },
      [&](simulator& sim) -> int {
        if (exec == nullptr) return invalid_value;
        return sim.instantiate(*exec, graph, flags);
      });
}

cudaError_t graph_launch_impl(const char* name, cudaGraphExec_t exec, cudaStream_t stream) {
  return runtime_call(
      name, [&] { return fmt::format("{}, {}", ptr(exec), ptr(stream)); },
      [&](simulator& sim) -> int { return sim.launch_graph(cur(sim), exec, stream); });
}

// Kernel launch configurations pushed by nvcc's host stubs.
struct launch_config {
  dim3 grid;
  dim3 block;
  size_t shared = 0;
  void* stream = nullptr;
};
thread_local launch_config pushed_config;

}  // namespace

int runtime_unimplemented(const char* name, std::atomic<bool>& reported) noexcept {
  report_unimplemented(gpumemSimInternalInstance(), name, "cudaErrorNotSupported", reported);
  return finish(cudaErrorNotSupported);
}

}  // namespace gpumem::cudasim

using namespace gpumem::cudasim;  // NOLINT: the exported functions below are its users

// The per-thread-default-stream variants the real library exports (cuda_runtime_api.h declares
// them only when CUDA_API_PER_THREAD_DEFAULT_STREAM is defined). On the simulator every default
// stream is the same stream.
extern "C" {
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream);
cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                          unsigned long long* id, cudaGraph_t* graph,
                                          const cudaGraphNode_t** deps,
                                          const cudaGraphEdgeData** edges, size_t* num_deps);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t stream, unsigned int* flags);
cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t stream, int* priority);
cudaError_t cudaStreamGetId_ptsz(cudaStream_t stream, unsigned long long* id);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t stream, int* device);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                          unsigned int flags);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                  size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                     void** args);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim,
                                             void** args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                    size_t sharedMem, cudaStream_t stream);

// What nvcc-compiled programs call at load time to register their device code. The simulator
// accepts the registration (so such programs start); their kernel launches are work that touches
// nothing the simulator knows of (README.md, "Kernels").
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** fatCubinHandle);
void __cudaUnregisterFatBinary(void** fatCubinHandle);
void __cudaRegisterFunction(void** fatCubinHandle, const char* hostFun, char* deviceFun,
                            const char* deviceName, int thread_limit, uint3* tid, uint3* bid,
                            dim3* bDim, dim3* gDim, int* wSize);
void __cudaRegisterVar(void** fatCubinHandle, char* hostVar, char* deviceAddress,
                       const char* deviceName, int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void** fatCubinHandle, void** hostVarPtrAddress, char* deviceAddress,
                              const char* deviceName, int ext, size_t size, int constant,
                              int global);
void __cudaRegisterHostVar(void** fatCubinHandle, const char* deviceName, char* hostVar,
                           size_t size);
char __cudaInitModule(void** fatCubinHandle);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                       void* stream);
}

extern "C" {

// ---------------------------------------------------------------------------------------------
// Device memory
// ---------------------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  return runtime_call(
      "cudaMalloc", [&] { return fmt::format("&ptr, {}", size); },
      [&](simulator& sim) -> int {
        if (devPtr == nullptr) return invalid_value;
        return sim.allocate(cur(sim), *devPtr, size, "cudaMalloc");
      });
}

cudaError_t cudaFree(void* devPtr) {
  return runtime_call(
      "cudaFree", [&] { return fmt::format("{}", devPtr); },
      [&](simulator& sim) -> int { return sim.free(cur(sim), devPtr, "cudaFree"); });
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return runtime_call(
      "cudaMemGetInfo", [] { return std::string("&free, &total"); },
      [&](simulator& sim) -> int {
        if (free == nullptr || total == nullptr) return invalid_value;
        return sim.memory_info(cur(sim), *free, *total);
      });
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count != nullptr) *count = 0;
  return runtime_call(
      "cudaGetDeviceCount", [] { return std::string("&count"); },
      [&](simulator& sim) -> int {
        if (count == nullptr) return invalid_value;
        *count = sim.device_count();
        return ok;
      });
}

cudaError_t cudaGetDevice(int* device) {
  return runtime_call(
      "cudaGetDevice", [] { return std::string("&device"); },
      [&](simulator& sim) -> int {
        if (device == nullptr) return invalid_value;
        *device = cur(sim);
        return ok;
      });
}

cudaError_t cudaSetDevice(int device) {
  return runtime_call(
      "cudaSetDevice", [&] { return fmt::format("{}", device); },
      [&](simulator& sim) -> int {
        if (const int s = check_device(sim, device); s != ok) return s;
        gpumemSimInternalThread()->runtime_device = device;
        bind_primary(sim, device);
        return ok;
      });
}

cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
  return runtime_call(
      "cudaInitDevice", [&] { return fmt::format("{}, {}, {}", device, deviceFlags, flags); },
      [&](simulator& sim) -> int { return check_device(sim, device); });
}

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  return runtime_call(
      "cudaSetDeviceFlags", [&] { return fmt::format("{}", flags); },
      [&](simulator& sim) -> int {
        if ((flags & ~static_cast<unsigned>(cudaDeviceMask)) != 0) return invalid_value;
        device_flags[static_cast<std::size_t>(cur(sim))].store(flags);
        return ok;
      });
}

cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  return runtime_call(
      "cudaGetDeviceFlags", [] { return std::string("&flags"); },
      [&](simulator& sim) -> int {
        if (flags == nullptr) return invalid_value;
        *flags = device_flags[static_cast<std::size_t>(cur(sim))].load();
        return ok;
      });
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  return runtime_call(
      "cudaDeviceGetAttribute",
      [&] { return fmt::format("&value, {}, {}", static_cast<int>(attr), device); },
      [&](simulator& sim) -> int {
        if (value == nullptr) return invalid_value;
        if (const int s = check_device(sim, device); s != ok) return s;
        return device_attribute(static_cast<int>(attr), *value, device, sim.config())
                   ? ok
                   : invalid_value;
      });
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return runtime_call(
      "cudaGetDeviceProperties", [&] { return fmt::format("&prop, {}", device); },
      [&](simulator& sim) -> int {
        if (prop == nullptr) return invalid_value;
        if (const int s = check_device(sim, device); s != ok) return s;
        cudaDeviceProp p;
        std::memset(&p, 0, sizeof p);
        const std::string name = sim.device_name();
        std::memcpy(p.name, name.data(), std::min(name.size(), sizeof p.name - 1));
        constexpr char uuid[] = "gpumem-simulator";  // 16 characters, the last one per device
        static_assert(sizeof uuid - 1 == sizeof p.uuid.bytes);
        std::memcpy(p.uuid.bytes, uuid, sizeof p.uuid.bytes);
        p.uuid.bytes[sizeof p.uuid.bytes - 1] = static_cast<char>('0' + device % 64);
        p.totalGlobalMem = sim.device(device).total_memory();
        const auto attr = [device, &sim](cudaDeviceAttr a) {
          int v = 0;
          (void)device_attribute(static_cast<int>(a), v, device, sim.config());
          return v;
        };
        p.sharedMemPerBlock = static_cast<size_t>(attr(cudaDevAttrMaxSharedMemoryPerBlock));
        p.regsPerBlock = attr(cudaDevAttrMaxRegistersPerBlock);
        p.warpSize = attr(cudaDevAttrWarpSize);
        p.memPitch = static_cast<size_t>(attr(cudaDevAttrMaxPitch));
        p.maxThreadsPerBlock = attr(cudaDevAttrMaxThreadsPerBlock);
        p.maxThreadsDim[0] = attr(cudaDevAttrMaxBlockDimX);
        p.maxThreadsDim[1] = attr(cudaDevAttrMaxBlockDimY);
        p.maxThreadsDim[2] = attr(cudaDevAttrMaxBlockDimZ);
        p.maxGridSize[0] = attr(cudaDevAttrMaxGridDimX);
        p.maxGridSize[1] = attr(cudaDevAttrMaxGridDimY);
        p.maxGridSize[2] = attr(cudaDevAttrMaxGridDimZ);
        p.totalConstMem = static_cast<size_t>(attr(cudaDevAttrTotalConstantMemory));
        p.major = attr(cudaDevAttrComputeCapabilityMajor);
        p.minor = attr(cudaDevAttrComputeCapabilityMinor);
        p.textureAlignment = static_cast<size_t>(attr(cudaDevAttrTextureAlignment));
        p.texturePitchAlignment = static_cast<size_t>(attr(cudaDevAttrTexturePitchAlignment));
        p.multiProcessorCount = attr(cudaDevAttrMultiProcessorCount);
        p.integrated = attr(cudaDevAttrIntegrated);
        p.canMapHostMemory = attr(cudaDevAttrCanMapHostMemory);
        p.surfaceAlignment = static_cast<size_t>(attr(cudaDevAttrSurfaceAlignment));
        p.concurrentKernels = attr(cudaDevAttrConcurrentKernels);
        p.ECCEnabled = attr(cudaDevAttrEccEnabled);
        p.pciBusID = attr(cudaDevAttrPciBusId);
        p.pciDeviceID = attr(cudaDevAttrPciDeviceId);
        p.pciDomainID = attr(cudaDevAttrPciDomainId);
        p.asyncEngineCount = attr(cudaDevAttrAsyncEngineCount);
        p.unifiedAddressing = attr(cudaDevAttrUnifiedAddressing);
        p.memoryBusWidth = attr(cudaDevAttrGlobalMemoryBusWidth);
        p.l2CacheSize = attr(cudaDevAttrL2CacheSize);
        p.persistingL2CacheMaxSize = attr(cudaDevAttrMaxPersistingL2CacheSize);
        p.maxThreadsPerMultiProcessor = attr(cudaDevAttrMaxThreadsPerMultiProcessor);
        p.streamPrioritiesSupported = attr(cudaDevAttrStreamPrioritiesSupported);
        p.globalL1CacheSupported = attr(cudaDevAttrGlobalL1CacheSupported);
        p.localL1CacheSupported = attr(cudaDevAttrLocalL1CacheSupported);
        p.sharedMemPerMultiprocessor =
            static_cast<size_t>(attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
        p.regsPerMultiprocessor = attr(cudaDevAttrMaxRegistersPerMultiprocessor);
        p.managedMemory = attr(cudaDevAttrManagedMemory);
        p.concurrentManagedAccess = attr(cudaDevAttrConcurrentManagedAccess);
        p.computePreemptionSupported = attr(cudaDevAttrComputePreemptionSupported);
        p.canUseHostPointerForRegisteredMem = attr(cudaDevAttrCanUseHostPointerForRegisteredMem);
        p.cooperativeLaunch = attr(cudaDevAttrCooperativeLaunch);
        p.sharedMemPerBlockOptin =
            static_cast<size_t>(attr(cudaDevAttrMaxSharedMemoryPerBlockOptin));
        p.maxBlocksPerMultiProcessor = attr(cudaDevAttrMaxBlocksPerMultiprocessor);
        p.reservedSharedMemPerBlock =
            static_cast<size_t>(attr(cudaDevAttrReservedSharedMemoryPerBlock));
        p.hostRegisterSupported = attr(cudaDevAttrHostRegisterSupported);
        p.hostRegisterReadOnlySupported = attr(cudaDevAttrHostRegisterReadOnlySupported);
        p.memoryPoolsSupported = attr(cudaDevAttrMemoryPoolsSupported);
        p.clusterLaunch = attr(cudaDevAttrClusterLaunch);
        p.unifiedFunctionPointers = attr(static_cast<cudaDeviceAttr>(129));  // unnamed here
        p.deviceNumaId = attr(cudaDevAttrNumaId);
        p.hostNumaId = attr(cudaDevAttrHostNumaId);
        *prop = p;
        return ok;
      });
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  return runtime_call(
      "cudaDeviceCanAccessPeer", [&] { return fmt::format("&can, {}, {}", device, peerDevice); },
      [&](simulator& sim) -> int {
        if (canAccessPeer == nullptr) return invalid_value;
        if (check_device(sim, device) != ok || check_device(sim, peerDevice) != ok) {
          return invalid_device;
        }
        *canAccessPeer = device != peerDevice ? 1 : 0;
        return ok;
      });
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  return runtime_call(
      "cudaDeviceEnablePeerAccess", [&] { return fmt::format("{}, {}", peerDevice, flags); },
      [&](simulator& sim) -> int { return sim.enable_peer_access(cur(sim), peerDevice, flags); });
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
  return runtime_call(
      "cudaDeviceDisablePeerAccess", [&] { return fmt::format("{}", peerDevice); },
      [&](simulator& sim) -> int { return sim.disable_peer_access(cur(sim), peerDevice); });
}

cudaError_t cudaDeviceSynchronize(void) {
  return runtime_call(
      "cudaDeviceSynchronize", [] { return std::string(); },
      [&](simulator& sim) -> int {
        return sim.synchronize_device(cur(sim), "cudaDeviceSynchronize");
      });
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return finish(cudaErrorInvalidValue);
  *driverVersion = CUDA_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return finish(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  return runtime_call(
      "cudaStreamCreateWithPriority",
      [&] { return fmt::format("&stream, {}, {}", flags, priority); },
      [&](simulator& sim) -> int {
        if (pStream == nullptr) return invalid_value;
        return sim.create_stream(cur(sim), *pStream, flags, priority);
      });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return runtime_call(
      "cudaStreamDestroy", [&] { return fmt::format("{}", ptr(stream)); },
      [&](simulator& sim) -> int { return sim.destroy_stream(stream); });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return stream_synchronize_impl("cudaStreamSynchronize", stream);
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  return stream_synchronize_impl("cudaStreamSynchronize_ptsz", stream);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return stream_query_impl("cudaStreamQuery", stream);
}
cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream) {
  return stream_query_impl("cudaStreamQuery_ptsz", stream);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  return stream_capturing_impl("cudaStreamIsCapturing", stream, pCaptureStatus);
}
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return stream_capturing_impl("cudaStreamIsCapturing_ptsz", stream, status);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out,
                                     const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
  return capture_info_impl("cudaStreamGetCaptureInfo", stream, captureStatus_out, id_out, graph_out,
                           dependencies_out, edgeData_out, numDependencies_out);
}
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                          unsigned long long* id, cudaGraph_t* graph,
                                          const cudaGraphNode_t** deps,
                                          const cudaGraphEdgeData** edges, size_t* num_deps) {
  return capture_info_impl("cudaStreamGetCaptureInfo_ptsz", stream, status, id, graph, deps, edges,
                           num_deps);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return runtime_call(
      "cudaThreadExchangeStreamCaptureMode", [] { return std::string("&mode"); },
      [&](simulator&) -> int {
        if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal ||
            *mode > cudaStreamCaptureModeRelaxed) {
          return invalid_value;
        }
        std::swap(*mode, gpumemSimInternalThread()->capture_mode);
        return ok;
      });
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return runtime_call(
      "cudaDeviceGetStreamPriorityRange", [] { return std::string("&least, &greatest"); },
      [&](simulator&) -> int {
        if (leastPriority != nullptr) *leastPriority = simulator::least_priority;
        if (greatestPriority != nullptr) *greatestPriority = simulator::greatest_priority;
        return ok;
      });
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  return stream_info_impl("cudaStreamGetFlags", hStream, flags, nullptr, nullptr, nullptr);
}
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t stream, unsigned int* flags) {
  return stream_info_impl("cudaStreamGetFlags_ptsz", stream, flags, nullptr, nullptr, nullptr);
}
cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int* priority) {
  return stream_info_impl("cudaStreamGetPriority", hStream, nullptr, priority, nullptr, nullptr);
}
cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t stream, int* priority) {
  return stream_info_impl("cudaStreamGetPriority_ptsz", stream, nullptr, priority, nullptr,
                          nullptr);
}
cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long* streamId) {
  return stream_info_impl("cudaStreamGetId", hStream, nullptr, nullptr, streamId, nullptr);
}
cudaError_t cudaStreamGetId_ptsz(cudaStream_t stream, unsigned long long* id) {
  return stream_info_impl("cudaStreamGetId_ptsz", stream, nullptr, nullptr, id, nullptr);
}
cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  return stream_info_impl("cudaStreamGetDevice", hStream, nullptr, nullptr, nullptr, device);
}
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t stream, int* device) {
  return stream_info_impl("cudaStreamGetDevice_ptsz", stream, nullptr, nullptr, nullptr, device);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return stream_wait_event_impl("cudaStreamWaitEvent", stream, event, flags);
}
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return stream_wait_event_impl("cudaStreamWaitEvent_ptsz", stream, event, flags);
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return runtime_call(
      "cudaEventCreateWithFlags", [&] { return fmt::format("&event, {}", flags); },
      [&](simulator& sim) -> int {
        if (event == nullptr) return invalid_value;
        return sim.create_event(cur(sim), *event, flags);
      });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return runtime_call(
      "cudaEventDestroy", [&] { return fmt::format("{}", ptr(event)); },
      [&](simulator& sim) -> int { return sim.destroy_event(event); });
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return event_record_impl("cudaEventRecord", event, stream, 0);
}
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  return event_record_impl("cudaEventRecord_ptsz", event, stream, 0);
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  return event_record_impl("cudaEventRecordWithFlags", event, stream, flags);
}
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                          unsigned int flags) {
  return event_record_impl("cudaEventRecordWithFlags_ptsz", event, stream, flags);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return runtime_call(
      "cudaEventQuery", [&] { return fmt::format("{}", ptr(event)); },
      [&](simulator& sim) -> int { return sim.query_event(event); });
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return runtime_call(
      "cudaEventSynchronize", [&] { return fmt::format("{}", ptr(event)); },
      [&](simulator& sim) -> int { return sim.synchronize_event(event); });
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return runtime_call(
      "cudaEventElapsedTime", [&] { return fmt::format("&ms, {}, {}", ptr(start), ptr(end)); },
      [&](simulator& sim) -> int {
        if (ms == nullptr) return invalid_value;
        return sim.elapsed_time(*ms, start, end);
      });
}

// ---------------------------------------------------------------------------------------------
// Host memory
// ---------------------------------------------------------------------------------------------

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  return runtime_call(
      "cudaHostAlloc", [&] { return fmt::format("&ptr, {}, {}", size, flags); },
      [&](simulator& sim) -> int {
        constexpr unsigned known =
            cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
        if (pHost == nullptr || (flags & ~known) != 0) return invalid_value;
        return sim.host_alloc(*pHost, size, flags);
      });
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  return runtime_call(
      "cudaFreeHost", [&] { return fmt::format("{}", ptr); },
      [&](simulator& sim) -> int { return sim.host_free(ptr); });
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  return runtime_call(
      "cudaHostRegister", [&] { return fmt::format("{}, {}, {}", ptr, size, flags); },
      [&](simulator& sim) -> int {
        constexpr unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                                   cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
        if ((flags & ~known) != 0) return invalid_value;
        return sim.host_register(ptr, size, flags);
      });
}

cudaError_t cudaHostUnregister(void* ptr) {
  return runtime_call(
      "cudaHostUnregister", [&] { return fmt::format("{}", ptr); },
      [&](simulator& sim) -> int { return sim.host_unregister(ptr); });
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  return runtime_call(
      "cudaHostGetDevicePointer", [&] { return fmt::format("&dev, {}, {}", pHost, flags); },
      [&](simulator& sim) -> int {
        if (pDevice == nullptr || flags != 0) return invalid_value;
        void* base = nullptr;
        size_t size = 0;
        unsigned f = 0;
        if (!sim.find_host(pHost, base, size, f)) return invalid_value;
        *pDevice = pHost;  // unified addressing: the device sees pinned memory at its address
        return ok;
      });
}

cudaError_t cudaHostGetFlags(unsigned int* pFlags, void* pHost) {
  return runtime_call(
      "cudaHostGetFlags", [&] { return fmt::format("&flags, {}", pHost); },
      [&](simulator& sim) -> int {
        if (pFlags == nullptr) return invalid_value;
        void* base = nullptr;
        size_t size = 0;
        unsigned f = 0;
        if (!sim.find_host(pHost, base, size, f)) return invalid_value;
        *pFlags = f;
        return ok;
      });
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  return runtime_call(
      "cudaPointerGetAttributes", [&] { return fmt::format("&attributes, {}", ptr); },
      [&](simulator& sim) -> int {
        if (attributes == nullptr) return invalid_value;
        cudaPointerAttributes a;
        std::memset(&a, 0, sizeof a);
        void* base = nullptr;
        size_t size = 0;
        unsigned f = 0;
        if (const int owner = sim.owner(ptr); owner >= 0) {
          a.type = cudaMemoryTypeDevice;
          a.device = owner;
          a.devicePointer = const_cast<void*>(ptr);
        } else if (sim.find_host(ptr, base, size, f)) {
          a.type = cudaMemoryTypeHost;
          a.device = cur(sim);
          a.devicePointer = const_cast<void*>(ptr);
          a.hostPointer = const_cast<void*>(ptr);
        } else {
          a.type = cudaMemoryTypeUnregistered;
          a.device = -2;
        }
        *attributes = a;
        return ok;
      });
}

// ---------------------------------------------------------------------------------------------
// Copies and fills
// ---------------------------------------------------------------------------------------------

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return memcpy_impl("cudaMemcpy", dst, src, count, kind);
}
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return memcpy_impl("cudaMemcpy_ptds", dst, src, count, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return memcpy_async_impl("cudaMemcpyAsync", dst, src, count, kind, stream);
}
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream) {
  return memcpy_async_impl("cudaMemcpyAsync_ptsz", dst, src, count, kind, stream);
}
cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memset_impl("cudaMemset", devPtr, value, count, nullptr);
}
cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
  return memset_impl("cudaMemset_ptds", devPtr, value, count, nullptr);
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memset_impl("cudaMemsetAsync", devPtr, value, count, &stream);
}
cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memset_impl("cudaMemsetAsync_ptsz", devPtr, value, count, &stream);
}

// ---------------------------------------------------------------------------------------------
// Peer copies
// ---------------------------------------------------------------------------------------------

cudaError_t cudaMemcpyPeer(void* dst, int dstDevice, const void* src, int srcDevice, size_t count) {
  return runtime_call(
      "cudaMemcpyPeer",
      [&] { return fmt::format("{}, {}, {}, {}, {}", dst, dstDevice, src, srcDevice, count); },
      [&](simulator& sim) -> int {
        return sim.copy_peer(cur(sim), dst, dstDevice, src, srcDevice, count, false, nullptr,
                             "cudaMemcpyPeer");
      });
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                size_t count, cudaStream_t stream) {
  return runtime_call(
      "cudaMemcpyPeerAsync",
      [&] {
        return fmt::format("{}, {}, {}, {}, {}, {}", dst, dstDevice, src, srcDevice, count,
                           ptr(stream));
      },
      [&](simulator& sim) -> int {
        return sim.copy_peer(cur(sim), dst, dstDevice, src, srcDevice, count, true, stream,
                             "cudaMemcpyPeerAsync");
      });
}

// ---------------------------------------------------------------------------------------------
// Kernel launches: work of GPUMEM_SIM_KERNEL_TIME whose memory effects are unknown
// ---------------------------------------------------------------------------------------------

cudaError_t cudaLaunchKernel(const void* func, dim3, dim3, void**, size_t, cudaStream_t stream) {
  return launch_impl("cudaLaunchKernel", func, stream);
}
cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3, dim3, void**, size_t,
                                  cudaStream_t stream) {
  return launch_impl("cudaLaunchKernel_ptsz", func, stream);
}
cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3, dim3, void**, size_t,
                                        cudaStream_t stream) {
  return launch_impl("cudaLaunchCooperativeKernel", func, stream);
}
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* func, dim3, dim3, void**, size_t,
                                             cudaStream_t stream) {
  return launch_impl("cudaLaunchCooperativeKernel_ptsz", func, stream);
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void**) {
  if (config == nullptr) return finish(cudaErrorInvalidValue);
  return launch_impl("cudaLaunchKernelExC", func, config->stream);
}
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void**) {
  if (config == nullptr) return finish(cudaErrorInvalidValue);
  return launch_impl("cudaLaunchKernelExC_ptsz", func, config->stream);
}

// What launch configuration code asks about a kernel (CUB's, for one). The simulated kernels are
// all alike: 32 registers a thread, no static shared memory, up to 1024 threads a block.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr) return finish(cudaErrorInvalidValue);
  if (func == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  cudaFuncAttributes a;
  std::memset(&a, 0, sizeof a);
  a.maxThreadsPerBlock = 1024;
  a.numRegs = 32;
  a.ptxVersion = 90;
  a.binaryVersion = 90;
  a.maxDynamicSharedSizeBytes = 48 * 1024;
  a.preferredShmemCarveout = -1;
  *attr = a;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  if (attr < cudaFuncAttributeMaxDynamicSharedMemorySize || attr >= cudaFuncAttributeMax ||
      value < 0) {
    return finish(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// 2048 threads and 32 blocks per multiprocessor, as on the GPUs simulated.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void* func,
                                                                   int blockSize, size_t,
                                                                   unsigned int flags) {
  if (numBlocks == nullptr || blockSize <= 0 || blockSize > 1024 || flags > 1) {
    return finish(cudaErrorInvalidValue);
  }
  if (func == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  *numBlocks = std::min(32, 2048 / blockSize);
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, const void* func,
                                                          int blockSize, size_t dynamicSMemSize) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                dynamicSMemSize, 0);
}

// nvcc's host stubs (CUDA 13) look the kernel up once, then launch it through these.
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* func) {
  if (kernel == nullptr || func == nullptr) return finish(cudaErrorInvalidValue);
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(func));
  return cudaSuccess;
}
cudaError_t cudaGetKernel(cudaKernel_t* kernel, const void* func) {
  return __cudaGetKernel(kernel, func);
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3, dim3, void**, size_t,
                               cudaStream_t stream) {
  return launch_impl("__cudaLaunchKernel", kernel, stream);
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3, dim3, void**, size_t,
                                    cudaStream_t stream) {
  return launch_impl("__cudaLaunchKernel_ptsz", kernel, stream);
}

// ---------------------------------------------------------------------------------------------
// Stream capture
// ---------------------------------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return begin_capture_impl("cudaStreamBeginCapture", stream, mode);
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return begin_capture_impl("cudaStreamBeginCapture_ptsz", stream, mode);
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  return end_capture_impl("cudaStreamEndCapture", stream, pGraph);
}
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) {
  return end_capture_impl("cudaStreamEndCapture_ptsz", stream, pGraph);
}

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

cudaError_t cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
  return runtime_call(
      "cudaGraphCreate", [&] { return fmt::format("&graph, {}", flags); },
      [&](simulator& sim) -> int {
        if (pGraph == nullptr) return invalid_value;
        return sim.create_graph(*pGraph, flags);
      });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return runtime_call(
      "cudaGraphDestroy", [&] { return fmt::format("{}", ptr(graph)); },
      [&](simulator& sim) -> int { return sim.destroy_graph(graph); });
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
  return runtime_call(
      "cudaGraphGetNodes", [&] { return fmt::format("{}, nodes, &count", ptr(graph)); },
      [&](simulator& sim) -> int {
        if (numNodes == nullptr) return invalid_value;
        return sim.graph_nodes(graph, nodes, *numNodes);
      });
}

cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t* pDependencies,
                                         cudaGraphEdgeData* edgeData, size_t* pNumDependencies) {
  return runtime_call(
      "cudaGraphNodeGetDependencies", [&] { return fmt::format("{}, deps, edges, &n", ptr(node)); },
      [&](simulator& sim) -> int {
        if (pNumDependencies == nullptr) return invalid_value;
        if (edgeData != nullptr && pDependencies == nullptr) return invalid_value;
        const int s = sim.node_dependencies(node, pDependencies, *pNumDependencies);
        if (s == ok && edgeData != nullptr) {
          for (size_t i = 0; i < *pNumDependencies; ++i) edgeData[i] = cudaGraphEdgeData{};
        }
        return s;
      });
}

cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char* path, unsigned int flags) {
  return runtime_call(
      "cudaGraphDebugDotPrint",
      [&] { return fmt::format("{}, {}, {}", ptr(graph), path ? path : "null", flags); },
      [&](simulator& sim) -> int { return sim.dot_print(graph, path); });
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  return instantiate_impl("cudaGraphInstantiate", pGraphExec, graph, flags);
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                          unsigned long long flags) {
  return instantiate_impl("cudaGraphInstantiateWithFlags", pGraphExec, graph, flags);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  return runtime_call(
      "cudaGraphExecDestroy", [&] { return fmt::format("{}", ptr(graphExec)); },
      [&](simulator& sim) -> int { return sim.destroy_exec(graphExec); });
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  return graph_launch_impl("cudaGraphLaunch", graphExec, stream);
}
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
  return graph_launch_impl("cudaGraphLaunch_ptsz", graphExec, stream);
}

// No graph allocates memory on the simulator (no memory nodes): every figure is 0.
cudaError_t cudaDeviceGetGraphMemAttribute(int device, cudaGraphMemAttributeType attr,
                                           void* value) {
  return runtime_call(
      "cudaDeviceGetGraphMemAttribute",
      [&] { return fmt::format("{}, {}, &value", device, static_cast<int>(attr)); },
      [&](simulator& sim) -> int {
        if (value == nullptr) return invalid_value;
        if (const int s = check_device(sim, device); s != ok) return s;
        if (attr != cudaGraphMemAttrUsedMemCurrent && attr != cudaGraphMemAttrUsedMemHigh &&
            attr != cudaGraphMemAttrReservedMemCurrent && attr != cudaGraphMemAttrReservedMemHigh) {
          return invalid_value;
        }
        *static_cast<std::uint64_t*>(value) = 0;
        return ok;
      });
}

cudaError_t cudaDeviceGraphMemTrim(int device) {
  return runtime_call(
      "cudaDeviceGraphMemTrim", [&] { return fmt::format("{}", device); },
      [&](simulator& sim) -> int { return check_device(sim, device); });
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  const error_text* e = runtime_error_text(static_cast<int>(error));
  return e != nullptr ? e->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const error_text* e = runtime_error_text(static_cast<int>(error));
  return e != nullptr ? e->text : "unrecognized error code";
}

// ---------------------------------------------------------------------------------------------
// Driver entry points
// ---------------------------------------------------------------------------------------------

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* driverStatus) {
  return entry_point_impl("cudaGetDriverEntryPoint", symbol, funcPtr, CUDART_VERSION, flags,
                          driverStatus);
}
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus) {
  return entry_point_impl("cudaGetDriverEntryPoint_ptsz", symbol, funcPtr, CUDART_VERSION, flags,
                          driverStatus);
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  return entry_point_impl("cudaGetDriverEntryPointByVersion", symbol, funcPtr, cudaVersion, flags,
                          driverStatus);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus) {
  return entry_point_impl("cudaGetDriverEntryPointByVersion_ptsz", symbol, funcPtr, cudaVersion,
                          flags, driverStatus);
}

// ---------------------------------------------------------------------------------------------
// Functions with results other than cudaError_t (the stubs could not stand in for them)
// ---------------------------------------------------------------------------------------------

cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, cudaChannelFormatKind f) {
  cudaChannelFormatDesc d;
  d.x = x;
  d.y = y;
  d.z = z;
  d.w = w;
  d.f = f;
  return d;
}

void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;  // an opaque, non-null handle for the registration calls
  return &handle;
}

void __cudaRegisterFatBinaryEnd(void**) {}

void __cudaUnregisterFatBinary(void**) {}

void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {}

void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}

void __cudaRegisterManagedVar(void**, void**, char*, const char*, int, size_t, int, int) {}

void __cudaRegisterHostVar(void**, const char*, char*, size_t) {}

char __cudaInitModule(void**) {
  return 0;
}

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st* stream) {
  pushed_config = launch_config{gridDim, blockDim, sharedMem, stream};
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                       void* stream) {
  if (gridDim != nullptr) *gridDim = pushed_config.grid;
  if (blockDim != nullptr) *blockDim = pushed_config.block;
  if (sharedMem != nullptr) *sharedMem = pushed_config.shared;
  if (stream != nullptr) *static_cast<void**>(stream) = pushed_config.stream;
  return cudaSuccess;
}

}  // extern "C"
