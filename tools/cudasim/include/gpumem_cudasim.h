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
} gpumemSimCounters;

/* Copies min(size, sizeof(gpumemSimCounters)) bytes of the current counters to *out (so a program
 * built against an older, shorter struct keeps working). Returns 0, or -1 when out is NULL or the
 * simulator could not start (a bad GPUMEM_SIM_* setting, reported on stderr). */
int gpumemSimGetCounters(gpumemSimCounters* out, size_t size);

/* Zeroes every call count, the injected-fault and out-of-memory counts, and sets the peak to the
 * current bytes in use. Returns 0, or -1 when the simulator could not start. */
int gpumemSimResetCounters(void);

typedef int (*gpumemSimGetCounters_t)(gpumemSimCounters* out, size_t size);
typedef int (*gpumemSimResetCounters_t)(void);

#define GPUMEM_SIM_GET_COUNTERS_NAME "gpumemSimGetCounters"
#define GPUMEM_SIM_RESET_COUNTERS_NAME "gpumemSimResetCounters"

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_CUDASIM_H */
