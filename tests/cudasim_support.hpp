// What the tests of the CUDA simulator's rules share (test_cudasim_rules.cpp,
// test_cudasim_capture.cpp, test_cudasim_multidevice.cpp): the simulator's own functions, looked
// up at run time (the tests link against the toolkit's libraries and run on the simulator's),
// and a switch on GPUMEM_CUDASIM_TEST, which ctest sets per process with the GPUMEM_SIM_* settings
// a group of tests is written for.
#pragma once

#include <gtest/gtest.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "gpumem_cudasim.h"

namespace cudasim_test {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

inline std::string mode() {
  const char* m = std::getenv("GPUMEM_CUDASIM_TEST");
  return m != nullptr ? m : "";
}

#define GPUMEM_REQUIRE_SIM_MODE(m)                                                          \
  do {                                                                                      \
    if (::cudasim_test::mode() != (m)) {                                                    \
      GTEST_SKIP() << "runs on the CUDA simulator with GPUMEM_CUDASIM_TEST=" << (m)         \
                   << " (ctest -L cudasim sets it, with LD_LIBRARY_PATH and GPUMEM_SIM_*)"; \
    }                                                                                       \
  } while (false)

template <class F>
F sim_function(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
}

/// The process's counters (device -1) or one device's.
inline gpumemSimCounters counters(int device = -1) {
  gpumemSimCounters c{};
  if (device < 0) {
    const auto get = sim_function<gpumemSimGetCounters_t>(GPUMEM_SIM_GET_COUNTERS_NAME);
    EXPECT_NE(get, nullptr) << "not running on the CUDA simulator";
    if (get != nullptr) {
      EXPECT_EQ(get(&c, sizeof c), 0);
    }
  } else {
    const auto get =
        sim_function<gpumemSimGetDeviceCounters_t>(GPUMEM_SIM_GET_DEVICE_COUNTERS_NAME);
    EXPECT_NE(get, nullptr) << "not running on the CUDA simulator";
    if (get != nullptr) {
      EXPECT_EQ(get(device, &c, sizeof c), 0);
    }
  }
  return c;
}

inline unsigned long long violations() {
  return counters().violations;
}

/// Zeroes the violations and clears the devices' sticky faults.
inline void reset_violations() {
  const auto reset = sim_function<gpumemSimResetViolations_t>(GPUMEM_SIM_RESET_VIOLATIONS_NAME);
  ASSERT_NE(reset, nullptr);
  ASSERT_EQ(reset(), 0);
}

inline std::string last_violation() {
  const auto get = sim_function<gpumemSimGetLastViolation_t>(GPUMEM_SIM_GET_LAST_VIOLATION_NAME);
  EXPECT_NE(get, nullptr);
  if (get == nullptr) return {};
  std::string text(get(nullptr, 0), '\0');
  std::vector<char> buffer(text.size() + 1);
  get(buffer.data(), buffer.size());
  return std::string(buffer.data());
}

inline gpumemSimRange writes(const void* p, std::size_t bytes) {
  return gpumemSimRange{p, bytes, GPUMEM_SIM_WRITE};
}
inline gpumemSimRange reads(const void* p, std::size_t bytes) {
  return gpumemSimRange{p, bytes, GPUMEM_SIM_READ};
}

/// gpumemSimLaunchWork: a kernel on `stream` that touches `ranges` for `seconds`.
inline int launch_work(cudaStream_t stream, std::initializer_list<gpumemSimRange> ranges,
                       double seconds = 0) {
  const auto launch = sim_function<gpumemSimLaunchWork_t>(GPUMEM_SIM_LAUNCH_WORK_NAME);
  EXPECT_NE(launch, nullptr);
  if (launch == nullptr) return -1;
  const std::vector<gpumemSimRange> list(ranges);
  return launch(stream, list.data(), list.size(), seconds);
}

inline void* as_pointer(CUdeviceptr p) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}

/// VMM memory: `size` bytes reserved (in the current context's device's range), created on
/// `device` and mapped; access is granted to the devices in `access`.
struct vmm_memory {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::size_t size = 0;
  bool mapped = false;

  vmm_memory(int device, std::size_t bytes, std::initializer_list<int> access) : size(bytes) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    EXPECT_EQ(cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuMemCreate(&handle, size, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuMemMap(va, size, 0, handle, 0), CUDA_SUCCESS);
    mapped = true;
    for (int d : access) grant(d);
  }
  vmm_memory(const vmm_memory&) = delete;
  vmm_memory& operator=(const vmm_memory&) = delete;
  ~vmm_memory() {
    if (mapped) {
      EXPECT_EQ(cuMemUnmap(va, size), CUDA_SUCCESS);
    }
    EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAddressFree(va, size), CUDA_SUCCESS);
  }

  CUresult grant(int device, CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = flags;
    return cuMemSetAccess(va, size, &desc, 1);
  }
  CUresult unmap() {
    mapped = false;
    return cuMemUnmap(va, size);
  }
  void* ptr() const { return as_pointer(va); }
};

}  // namespace cudasim_test
