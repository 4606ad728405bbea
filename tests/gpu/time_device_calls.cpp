// time_device_calls — how long the device calls an allocator makes take on this GPU.
//
// For each size from 2 MiB to 1 GiB (powers of two), the median over --reps repetitions of:
//   cudaMalloc, cudaFree                               (one segment)
//   cuMemCreate + cuMemMap + cuMemSetAccess            (one handle for the whole size)
//   cuMemUnmap + cuMemRelease
//   the same per granule ("pages"): one cuMemCreate + cuMemMap per granule, one cuMemSetAccess
//   over the range; one cuMemUnmap + cuMemRelease per granule — what PyTorch's expandable
//   segments and gpumem's stitching policy do
// The address range is reserved once per size, outside the timings. One untimed round per size
// warms the driver up. Prints a table (and, with --csv PATH, writes the same numbers as CSV).
//
// Standalone on purpose (no gpumem, no fmt): the CUDA runtime only; the driver's entry points come
// from cudaGetDriverEntryPointByVersion, so nothing links against libcuda.
//
// Build: g++ -std=c++17 -O2 -I$CUDA/include time_device_calls.cpp -L$CUDA/lib64 -lcudart
//        (or nvcc -std=c++17 -O2 time_device_calls.cpp)
// --check: print the device, driver and granularity lines and stop (the GPU check of run.sh).
// Exit status: 0 on success, 2 when there is no usable GPU, 1 when a call fails, 64 for bad usage.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct driver_api {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
};

driver_api api;
int device = 0;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "time_device_calls: %s\n", what.c_str());
  std::exit(1);
}

void check_rt(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    fail(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
         cudaGetErrorString(status) + ")");
  }
}

void check_cu(CUresult status, const char* call) {
  if (status != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (api.get_error_name == nullptr || api.get_error_name(status, &name) != CUDA_SUCCESS) {
      name = nullptr;
    }
    fail(std::string(call) + " failed: " +
         (name != nullptr ? name : ("CUresult " + std::to_string(static_cast<int>(status)))));
  }
}

template <class Fn>
void resolve(Fn& fn, const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  check_rt(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found),
           "cudaGetDriverEntryPointByVersion");
#else
  check_rt(cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found),
           "cudaGetDriverEntryPoint");
#endif
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    fail(std::string("the CUDA driver does not provide ") + symbol);
  }
  std::memcpy(&fn, &address, sizeof(fn));
}

double micros(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

CUmemAllocationProp pinned_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUmemAccessDesc read_write() {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

struct row {
  std::size_t size = 0;
  double malloc_us = 0, free_us = 0;
  double create_map_us = 0, unmap_release_us = 0;
  double pages_create_map_us = 0, pages_unmap_release_us = 0;
};

row measure(std::size_t size, std::size_t granule, int reps) {
  std::vector<double> malloc_t, free_t, cm_t, ur_t, pcm_t, pur_t;
  const CUmemAllocationProp prop = pinned_prop();
  const CUmemAccessDesc access = read_write();
  CUdeviceptr va = 0;
  check_cu(api.reserve(&va, size, 0, 0, 0), "cuMemAddressReserve");
  const std::size_t pages = size / granule;
  std::vector<CUmemGenericAllocationHandle> handles(pages);

  for (int r = -1; r < reps; ++r) {  // r == -1: warm-up, not recorded
    const bool keep = r >= 0;
    // cudaMalloc / cudaFree.
    void* p = nullptr;
    auto t0 = clock_type::now();
    check_rt(cudaMalloc(&p, size), "cudaMalloc");
    auto t1 = clock_type::now();
    check_rt(cudaFree(p), "cudaFree");
    auto t2 = clock_type::now();
    if (keep) {
      malloc_t.push_back(micros(t0, t1));
      free_t.push_back(micros(t1, t2));
    }

    // One handle for the whole size.
    CUmemGenericAllocationHandle h = 0;
    t0 = clock_type::now();
    check_cu(api.create(&h, size, &prop, 0), "cuMemCreate");
    check_cu(api.map(va, size, 0, h, 0), "cuMemMap");
    check_cu(api.set_access(va, size, &access, 1), "cuMemSetAccess");
    t1 = clock_type::now();
    check_cu(api.unmap(va, size), "cuMemUnmap");
    check_cu(api.release(h), "cuMemRelease");
    t2 = clock_type::now();
    if (keep) {
      cm_t.push_back(micros(t0, t1));
      ur_t.push_back(micros(t1, t2));
    }

    // One handle per granule.
    t0 = clock_type::now();
    for (std::size_t i = 0; i < pages; ++i) {
      check_cu(api.create(&handles[i], granule, &prop, 0), "cuMemCreate (page)");
      check_cu(api.map(va + i * granule, granule, 0, handles[i], 0), "cuMemMap (page)");
    }
    check_cu(api.set_access(va, size, &access, 1), "cuMemSetAccess (pages)");
    t1 = clock_type::now();
    for (std::size_t i = 0; i < pages; ++i) {
      check_cu(api.unmap(va + i * granule, granule), "cuMemUnmap (page)");
      check_cu(api.release(handles[i]), "cuMemRelease (page)");
    }
    t2 = clock_type::now();
    if (keep) {
      pcm_t.push_back(micros(t0, t1));
      pur_t.push_back(micros(t1, t2));
    }
  }
  check_cu(api.address_free(va, size), "cuMemAddressFree");

  row out;
  out.size = size;
  out.malloc_us = median(malloc_t);
  out.free_us = median(free_t);
  out.create_map_us = median(cm_t);
  out.unmap_release_us = median(ur_t);
  out.pages_create_map_us = median(pcm_t);
  out.pages_unmap_release_us = median(pur_t);
  return out;
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30)) return std::to_string(bytes >> 30) + " GiB";
  return std::to_string(bytes >> 20) + " MiB";
}

int usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s [--check] [--device N] [--reps N] [--min-mib N] [--max-mib N] [--csv PATH]\n",
      argv0);
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line, also into a pipe (run.sh tees)
  int reps = 9;
  std::size_t min_bytes = 2 * MiB;
  std::size_t max_bytes = 1024 * MiB;
  const char* csv_path = nullptr;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      check_only = true;
      continue;
    }
    if (i + 1 >= argc) return usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--device") {
      device = std::atoi(value);
    } else if (arg == "--reps") {
      reps = std::max(1, std::atoi(value));
    } else if (arg == "--min-mib") {
      min_bytes = static_cast<std::size_t>(std::max(1, std::atoi(value))) * MiB;
    } else if (arg == "--max-mib") {
      max_bytes = static_cast<std::size_t>(std::max(1, std::atoi(value))) * MiB;
    } else if (arg == "--csv") {
      csv_path = value;
    } else {
      return usage(argv[0]);
    }
  }

  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    std::fprintf(stderr,
                 "time_device_calls: no usable CUDA GPU: cudaGetDeviceCount -> %s (%s), %d "
                 "device(s)\n",
                 cudaGetErrorName(counted), cudaGetErrorString(counted), count);
    return 2;
  }
  if (device < 0 || device >= count) {
    std::fprintf(stderr, "time_device_calls: no CUDA device %d (%d present)\n", device, count);
    return 2;
  }
  check_rt(cudaSetDevice(device), "cudaSetDevice");
  check_rt(cudaFree(nullptr), "cudaFree(nullptr)");  // create the primary context up front

  cudaDeviceProp props{};
  check_rt(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  int driver_version = 0;
  int runtime_version = 0;
  check_rt(cudaDriverGetVersion(&driver_version), "cudaDriverGetVersion");
  check_rt(cudaRuntimeGetVersion(&runtime_version), "cudaRuntimeGetVersion");

  resolve(api.get_error_name, "cuGetErrorName");
  resolve(api.device_get, "cuDeviceGet");
  resolve(api.device_get_attribute, "cuDeviceGetAttribute");
  resolve(api.granularity, "cuMemGetAllocationGranularity");
  resolve(api.reserve, "cuMemAddressReserve");
  resolve(api.address_free, "cuMemAddressFree");
  resolve(api.create, "cuMemCreate");
  resolve(api.release, "cuMemRelease");
  resolve(api.map, "cuMemMap");
  resolve(api.unmap, "cuMemUnmap");
  resolve(api.set_access, "cuMemSetAccess");

  CUdevice cu_device = 0;
  check_cu(api.device_get(&cu_device, device), "cuDeviceGet");
  int vmm = 0;
  check_cu(api.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    cu_device),
           "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  if (vmm == 0) fail("the device does not support virtual memory management");
  const CUmemAllocationProp prop = pinned_prop();
  std::size_t granule = 0;
  check_cu(api.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           "cuMemGetAllocationGranularity");
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  check_rt(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");

  std::printf("device %d: %s, compute capability %d.%d, %.1f GiB total, %.1f GiB free\n", device,
              props.name, props.major, props.minor,
              static_cast<double>(total_bytes) / static_cast<double>(1u << 30),
              static_cast<double>(free_bytes) / static_cast<double>(1u << 30));
  std::printf("driver API %d, runtime %d, VMM granularity %zu KiB\n", driver_version,
              runtime_version, granule >> 10);
  if (check_only) return 0;
  std::printf("median of %d repetitions (after one warm-up), times in microseconds\n\n", reps);

  std::vector<row> rows;
  for (std::size_t size = min_bytes; size <= max_bytes; size *= 2) {
    if (size % granule != 0) continue;
    if (2 * size > free_bytes) break;
    rows.push_back(measure(size, granule, reps));
  }

  std::printf("%9s | %12s | %10s | %16s | %16s | %16s | %16s\n", "size", "cudaMalloc", "cudaFree",
              "create+map+acc", "unmap+release", "pages crt+map", "pages unm+rel");
  std::printf("%9s | %12s | %10s | %16s | %16s | %16s | %16s\n", "", "us", "us", "us (1 handle)",
              "us (1 handle)", "us (per granule)", "us (per granule)");
  std::printf(
      "----------+--------------+------------+------------------+------------------+-------"
      "-----------+-----------------\n");
  for (const row& r : rows) {
    std::printf("%9s | %12.1f | %10.1f | %16.1f | %16.1f | %16.1f | %16.1f\n",
                size_name(r.size).c_str(), r.malloc_us, r.free_us, r.create_map_us,
                r.unmap_release_us, r.pages_create_map_us, r.pages_unmap_release_us);
  }

  if (csv_path != nullptr) {
    std::FILE* f = std::fopen(csv_path, "w");
    if (f == nullptr) fail(std::string("cannot write ") + csv_path);
    std::fprintf(f,
                 "size_bytes,cudaMalloc_us,cudaFree_us,create_map_access_us,unmap_release_us,"
                 "pages_create_map_access_us,pages_unmap_release_us\n");
    for (const row& r : rows) {
      std::fprintf(f, "%zu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", r.size, r.malloc_us, r.free_us,
                   r.create_map_us, r.unmap_release_us, r.pages_create_map_us,
                   r.pages_unmap_release_us);
    }
    std::fclose(f);
  }
  return 0;
}
