/* gpumem CUDA simulator — what a program can ask the simulator itself (C and C++).
 *
 * The simulator's libcuda.so.1 exports, besides the CUDA driver API, the functions below. A
 * program linked against the real CUDA libraries finds them at run time, and only when it runs on
 * the simulator:
 *
 *   gpumemSimGetCounters_t get =
 *       (gpumemSimGetCounters_t)dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME);
 *   gpumemSimCounters c;
 *   if (get != NULL && get(&c, sizeof c) == 0) printf("%llu cudaMalloc calls\n", c.calls.malloc);
 *
 * Thread safety: every function may be called from any thread at any time.
 */
#ifndef GPUMEM_CUDASIM_H
#define GPUMEM_CUDASIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Device calls by kind: one counter per field of gpumem::call_counters, same names and order.
 * Every call the simulated device accepts counts (successful, out of memory, or failed by fault
 * injection); calls rejected as misuse (an unknown pointer, a bad size) do not. */
typedef struct gpumemSimCallCounts {
  unsigned long long malloc;             /* cudaMalloc, cuMemAlloc */
  unsigned long long free;               /* cudaFree, cuMemFree */
  unsigned long long mem_get_info;       /* cudaMemGetInfo, cuMemGetInfo */
  unsigned long long event_create;       /* cudaEventCreate* */
  unsigned long long event_destroy;      /* cudaEventDestroy */
  unsigned long long event_record;       /* cudaEventRecord* */
  unsigned long long event_query;        /* cudaEventQuery */
  unsigned long long event_synchronize;  /* cudaEventSynchronize */
  unsigned long long device_synchronize; /* cudaDeviceSynchronize, cuCtxSynchronize */
  unsigned long long stream_create;      /* cudaStreamCreate* */
  unsigned long long stream_destroy;     /* cudaStreamDestroy */
  unsigned long long address_reserve;    /* cuMemAddressReserve */
  unsigned long long address_free;       /* cuMemAddressFree */
  unsigned long long mem_create;         /* cuMemCreate */
  unsigned long long mem_release;        /* cuMemRelease */
  unsigned long long mem_map;            /* cuMemMap */
  unsigned long long mem_unmap;          /* cuMemUnmap */
  unsigned long long set_access;         /* cuMemSetAccess */
} gpumemSimCallCounts;

/* Everything the simulator counts. Counts are since the simulator started or the last
 * gpumemSimResetCounters(); the state fields are current values. */
typedef struct gpumemSimCounters {
  gpumemSimCallCounts calls;
  /* Runtime calls outside the device model. */
  unsigned long long memcpy_calls;        /* cudaMemcpy, cudaMemcpyAsync (successful) */
  unsigned long long memcpy_bytes;        /* bytes they copied, or pretended to copy */
  unsigned long long memcpy_device_calls; /* those with a device side (nothing is copied) */
  unsigned long long memset_calls;        /* cudaMemset, cudaMemsetAsync (successful) */
  unsigned long long memset_bytes;
  unsigned long long host_alloc;         /* cudaHostAlloc, cudaMallocHost (successful) */
  unsigned long long host_free;          /* cudaFreeHost (successful) */
  unsigned long long host_register;      /* cudaHostRegister (successful) */
  unsigned long long host_unregister;    /* cudaHostUnregister (successful) */
  unsigned long long stream_synchronize; /* cudaStreamSynchronize */
  unsigned long long stream_query;       /* cudaStreamQuery */
  unsigned long long stream_wait_event;  /* cudaStreamWaitEvent */
  unsigned long long unimplemented;      /* calls of exported functions the simulator lacks */
  /* State. */
  unsigned long long total_memory;      /* GPUMEM_SIM_MEMORY: what cudaMemGetInfo reports */
  unsigned long long bytes_in_use;      /* device memory in use (segments + physical VMM) */
  unsigned long long peak_bytes_in_use; /* since start or the last reset */
  unsigned long long host_bytes;        /* pinned host memory: cudaHostAlloc'ed + registered */
  unsigned long long live_segments;     /* cudaMalloc / cuMemAlloc segments not freed */
  unsigned long long live_reservations; /* cuMemAddressReserve ranges not freed */
  unsigned long long live_physical;     /* cuMemCreate allocations whose memory is not freed */
  unsigned long long live_mappings;     /* cuMemMap mappings not unmapped */
  unsigned long long live_streams;      /* streams created and not destroyed */
  unsigned long long live_events;       /* events created and not destroyed */
  unsigned long long injected_faults;   /* calls failed by GPUMEM_SIM_FAIL_* */
  unsigned long long out_of_memory;     /* calls failed because the capacity was exhausted */
  /* Added after the fields above (a program built against the shorter struct passes its size and
   * gets the fields it knows). Counts since start or the last gpumemSimResetCounters(). */
  unsigned long long devices;              /* GPUMEM_SIM_DEVICES (1 in a device's own counters) */
  unsigned long long kernel_launches;      /* cudaLaunchKernel and friends, cuLaunchKernel(Ex) */
  unsigned long long work_launches;        /* gpumemSimLaunchWork */
  unsigned long long memcpy_peer_calls;    /* cudaMemcpyPeer, cudaMemcpyPeerAsync (successful) */
  unsigned long long captures;             /* cudaStreamBeginCapture (successful) */
  unsigned long long captures_invalidated; /* capture sequences a prohibited call invalidated */
  unsigned long long graph_launches;       /* cudaGraphLaunch (successful) */
  unsigned long long live_graphs;          /* cudaGraph_t not destroyed (being captured included) */
  unsigned long long live_graph_execs;     /* cudaGraphExec_t not destroyed */
  unsigned long long pending_works;        /* works with known ranges the host has not seen end */
  unsigned long long host_clock_ns;        /* the simulated host clock (README: "Time") */
  /* Violations (README: "What the simulator checks"): never reset by gpumemSimResetCounters,
   * only by gpumemSimResetViolations, so that a check for none cannot be fooled. */
  unsigned long long violations;          /* all of them: the sum of the four below */
  unsigned long long violations_unmapped; /* work touched bytes that are not allocated or mapped */
  unsigned long long violations_inaccessible; /* ... mapped, but not accessible from the device */
  unsigned long long violations_in_flight;    /* memory unmapped under work not seen complete */
  unsigned long long violations_race; /* unordered works on two streams touched the same bytes */
  unsigned long long faulted_devices; /* devices with a sticky cudaErrorIllegalAddress */
} gpumemSimCounters;

/* Copies min(size, sizeof(gpumemSimCounters)) bytes of the current counters to *out (so a program
 * built against an older, shorter struct keeps working). Returns 0, or -1 when out is NULL or the
 * simulator could not start (a bad GPUMEM_SIM_* setting, reported on stderr). */
int gpumemSimGetCounters(gpumemSimCounters* out, size_t size);

/* Zeroes every call count, the injected-fault and out-of-memory counts, and sets the peak to the
 * current bytes in use; violations are kept. Returns 0, or -1 when the simulator could not start.
 */
int gpumemSimResetCounters(void);

/* The counters of one device: its calls, memory, streams and events (`devices` is 1); the fields
 * that belong to no device (host memory, copies, launches, captures, graphs, violations, the
 * clock) are the process's. Returns 0, or -1 for an unknown device or when the simulator could
 * not start. */
int gpumemSimGetDeviceCounters(int device, gpumemSimCounters* out, size_t size);

/* Zeroes the violation counts, forgets the last violation and clears every device's sticky
 * cudaErrorIllegalAddress (for tests that produce violations on purpose). Returns 0, or -1 when
 * the simulator could not start. */
int gpumemSimResetViolations(void);

/* Copies the last violation's line (without "cudasim violation: " and the newline) into buffer,
 * cut to size - 1 characters and NUL-terminated, and returns its full length; 0 when there was
 * none since the start or gpumemSimResetViolations(). buffer may be NULL when size is 0. */
size_t gpumemSimGetLastViolation(char* buffer, size_t size);

/* Bytes that simulated work reads or writes (gpumemSimLaunchWork). */
typedef struct gpumemSimRange {
  const void* address;
  size_t bytes;
  int access; /* GPUMEM_SIM_READ, GPUMEM_SIM_WRITE or GPUMEM_SIM_READ_WRITE */
} gpumemSimRange;

#define GPUMEM_SIM_READ 1
#define GPUMEM_SIM_WRITE 2
#define GPUMEM_SIM_READ_WRITE 3

struct CUstream_st; /* cudaStream_t and CUstream are struct CUstream_st* */

/* Enqueues on `stream` (NULL: the legacy default stream of the current device) a kernel that
 * touches `ranges` for `seconds` of simulated time, as a kernel launch on the current device
 * would: in stream order, checked when enqueued (README: "What the simulator checks"), and
 * captured instead when the stream is capturing. Returns a cudaError_t value: cudaSuccess,
 * cudaErrorInvalidValue (ranges NULL with count > 0, a bad access, seconds negative or not
 * finite), cudaErrorInvalidResourceHandle (an unknown stream, or one of another device than the
 * current one), cudaErrorIllegalAddress (the device has faulted), a capture error; -1 when the
 * simulator could not start. */
int gpumemSimLaunchWork(struct CUstream_st* stream, const gpumemSimRange* ranges, size_t count,
                        double seconds);

typedef int (*gpumemSimGetCounters_t)(gpumemSimCounters* out, size_t size);
typedef int (*gpumemSimResetCounters_t)(void);
typedef int (*gpumemSimGetDeviceCounters_t)(int device, gpumemSimCounters* out, size_t size);
typedef int (*gpumemSimResetViolations_t)(void);
typedef size_t (*gpumemSimGetLastViolation_t)(char* buffer, size_t size);
typedef int (*gpumemSimLaunchWork_t)(struct CUstream_st* stream, const gpumemSimRange* ranges,
                                     size_t count, double seconds);

#define GPUMEM_SIM_GET_COUNTERS_NAME "gpumemSimGetCounters"
#define GPUMEM_SIM_RESET_COUNTERS_NAME "gpumemSimResetCounters"
#define GPUMEM_SIM_GET_DEVICE_COUNTERS_NAME "gpumemSimGetDeviceCounters"
#define GPUMEM_SIM_RESET_VIOLATIONS_NAME "gpumemSimResetViolations"
#define GPUMEM_SIM_GET_LAST_VIOLATION_NAME "gpumemSimGetLastViolation"
#define GPUMEM_SIM_LAUNCH_WORK_NAME "gpumemSimLaunchWork"

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_CUDASIM_H */
