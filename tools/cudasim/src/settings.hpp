// gpumem CUDA simulator — the GPUMEM_SIM_* settings and the simulated GPU's properties (included
// by simulator.hpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpumem/detail/size_units.hpp"
#include "gpumem/device/fault_injection.hpp"
#include "gpumem/device/simulated_device.hpp"

namespace gpumem::cudasim {

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

/// What a violation of the GPU's rules does besides being reported and counted.
enum class strictness : std::uint8_t {
  report,  ///< nothing more (the default)
  abort,   ///< the process aborts after reporting it (GPUMEM_SIM_STRICT=abort)
};

/// What the simulated GPUs and system offer for fabric handles (CU_MEM_HANDLE_TYPE_FABRIC).
enum class fabric_support : std::uint8_t {
  /// The GPU has them (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 1, as on Hopper and
  /// newer) but the process has no IMEX channel (/dev/nvidia-caps-imex-channels), which a node
  /// without an IMEX service lacks: cuMemCreate asking for them is CUDA_ERROR_NOT_PERMITTED. The
  /// default: an H100 or H200 server.
  no_imex,
  /// IMEX channel present: memory is created with fabric handles, exported as 64 opaque bytes and
  /// imported from them (GPUMEM_SIM_FABRIC=imex).
  imex,
  /// The GPU has none (the attribute is 0; cuMemCreate asking is CUDA_ERROR_NOT_SUPPORTED), as on
  /// GPUs before Hopper (GPUMEM_SIM_FABRIC=unsupported).
  unsupported,
};

/// The most simulated devices (a device's peers are a 64-bit mask).
inline constexpr int max_devices = 64;

/// What the environment says, read once when the simulator starts.
struct settings {
  std::size_t memory = std::size_t{80} << 30;  ///< GPUMEM_SIM_MEMORY, per device
  int devices = 1;                             ///< GPUMEM_SIM_DEVICES
  std::size_t address_space = 0;  ///< GPUMEM_SIM_ADDRESS_SPACE per device; 0 = the default
  double event_delay = 0;         ///< GPUMEM_SIM_EVENT_DELAY, seconds
  double bandwidth = 1e12;    ///< GPUMEM_SIM_BANDWIDTH, bytes/s of copies and fills; 0 = instant
  double kernel_time = 5e-6;  ///< GPUMEM_SIM_KERNEL_TIME, seconds per kernel launch
  strictness strict = strictness::report;  ///< GPUMEM_SIM_STRICT
  fault_injection faults{};  ///< GPUMEM_SIM_FAIL_NTH / _ABOVE / _PROBABILITY, _SEED (per device)
  std::string log;           ///< GPUMEM_SIM_LOG: "", "stderr" or a path
  fabric_support fabric = fabric_support::no_imex;  ///< GPUMEM_SIM_FABRIC
};

namespace detail {

/// The value of variable `name`, or nullptr when it is unset or empty.
inline const char* env(const char* name) noexcept {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

[[noreturn]] inline void bad_setting(const char* name, const char* value, std::string_view why) {
  throw std::invalid_argument(fmt::format("{}=\"{}\": {}", name, value, why));
}

inline double parse_number(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(value, &end);
  while (end != nullptr && *end == ' ') ++end;
  if (end == value || end == nullptr || *end != '\0' || errno == ERANGE || !std::isfinite(d)) {
    bad_setting(name, value, "not a finite number");
  }
  return d;
}

inline std::uint64_t parse_count(const char* name, const char* value) {
  const char* p = value;
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') bad_setting(name, value, "not a non-negative whole number");
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(p, &end, 10);
  while (*end == ' ') ++end;
  if (*end != '\0' || errno == ERANGE) bad_setting(name, value, "not a non-negative whole number");
  return n;
}

inline std::size_t parse_bytes(const char* name, const char* value) {
  try {
    return parse_size(value);
  } catch (const std::invalid_argument& e) {
    bad_setting(name, value, e.what());
  }
}

}  // namespace detail

/// Reads the GPUMEM_SIM_* variables. Throws std::invalid_argument naming the variable, its value
/// and the problem.
inline settings read_settings() {
  settings s;
  if (const char* v = detail::env("GPUMEM_SIM_MEMORY")) {
    s.memory = detail::parse_bytes("GPUMEM_SIM_MEMORY", v);
    if (s.memory == 0) detail::bad_setting("GPUMEM_SIM_MEMORY", v, "the device needs some memory");
  }
  if (const char* v = detail::env("GPUMEM_SIM_DEVICES")) {
    const std::uint64_t n = detail::parse_count("GPUMEM_SIM_DEVICES", v);
    if (n < 1 || n > static_cast<std::uint64_t>(max_devices)) {
      detail::bad_setting("GPUMEM_SIM_DEVICES", v,
                          fmt::format("from 1 to {} devices", max_devices).c_str());
    }
    s.devices = static_cast<int>(n);
  }
  if (const char* v = detail::env("GPUMEM_SIM_ADDRESS_SPACE")) {
    s.address_space = detail::parse_bytes("GPUMEM_SIM_ADDRESS_SPACE", v);
    if (s.address_space < s.memory) {
      detail::bad_setting("GPUMEM_SIM_ADDRESS_SPACE", v,
                          "smaller than the device memory (GPUMEM_SIM_MEMORY)");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_BANDWIDTH")) {
    s.bandwidth = detail::parse_number("GPUMEM_SIM_BANDWIDTH", v);
    if (s.bandwidth < 0) detail::bad_setting("GPUMEM_SIM_BANDWIDTH", v, "bytes/s must be >= 0");
  }
  if (const char* v = detail::env("GPUMEM_SIM_KERNEL_TIME")) {
    s.kernel_time = detail::parse_number("GPUMEM_SIM_KERNEL_TIME", v);
    if (s.kernel_time < 0) {
      detail::bad_setting("GPUMEM_SIM_KERNEL_TIME", v, "seconds must be >= 0");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_STRICT")) {
    const std::string_view text(v);
    if (text == "abort") {
      s.strict = strictness::abort;
    } else if (text != "off" && text != "0") {
      detail::bad_setting("GPUMEM_SIM_STRICT", v, "off or abort");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_EVENT_DELAY")) {
    s.event_delay = detail::parse_number("GPUMEM_SIM_EVENT_DELAY", v);
    if (s.event_delay < 0) {
      detail::bad_setting("GPUMEM_SIM_EVENT_DELAY", v, "seconds must be >= 0");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_NTH")) {
    s.faults.fail_nth_call =
        static_cast<std::size_t>(detail::parse_count("GPUMEM_SIM_FAIL_NTH", v));
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_ABOVE")) {
    s.faults.fail_above_bytes = detail::parse_bytes("GPUMEM_SIM_FAIL_ABOVE", v);
  }
  if (const char* v = detail::env("GPUMEM_SIM_FAIL_PROBABILITY")) {
    s.faults.fail_probability = detail::parse_number("GPUMEM_SIM_FAIL_PROBABILITY", v);
    if (!(s.faults.fail_probability >= 0.0 && s.faults.fail_probability <= 1.0)) {
      detail::bad_setting("GPUMEM_SIM_FAIL_PROBABILITY", v, "a probability is between 0 and 1");
    }
  }
  if (const char* v = detail::env("GPUMEM_SIM_SEED")) {
    s.faults.seed = detail::parse_count("GPUMEM_SIM_SEED", v);
  }
  if (const char* v = detail::env("GPUMEM_SIM_LOG")) s.log = v;
  if (const char* v = detail::env("GPUMEM_SIM_FABRIC")) {
    const std::string_view text(v);
    if (text == "imex") {
      s.fabric = fabric_support::imex;
    } else if (text == "unsupported") {
      s.fabric = fabric_support::unsupported;
    } else if (text != "no_imex") {
      detail::bad_setting("GPUMEM_SIM_FABRIC", v, "no_imex, imex or unsupported");
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// The simulated GPU's properties
// ---------------------------------------------------------------------------------------------

/// One attribute of the simulated GPU (cudaDeviceAttr and CUdevice_attribute share values).
struct attribute_value {
  int attr;
  int value;
};

/// The simulated GPU: an H200-class device (compute capability 9.0) with virtual memory
/// management, without memory pools or IPC. Attributes not listed are 0.
inline constexpr attribute_value device_attributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},  // kHz
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x5e},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},  // kHz
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    // VMM memory exported as POSIX file descriptors and imported again in the same process
    // (cuMemExportToShareableHandle / cuMemImportFromShareableHandle); fabric handles as
    // GPUMEM_SIM_FABRIC says (device_attribute with the settings).
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 1},
    // GPUDirect RDMA on VMM memory (allocFlags.gpuDirectRDMACapable), as NCCL's network
    // transports want for registered buffers.
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 0},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 4},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 1},
    {CU_DEVICE_ATTRIBUTE_NUMA_ID, -1},
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1},
};

/// Device `device`'s value of attribute `attr` (0 for one the simulator does not have); the
/// devices differ only in their PCI bus id. Returns false for a value outside the enumeration.
/// Thread-safe; never throws.
inline bool device_attribute(int attr, int& value, int device = 0) noexcept {
  static_assert(static_cast<int>(cudaDevAttrMax) == static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX));
  if (attr <= 0 || attr >= CU_DEVICE_ATTRIBUTE_MAX) return false;
  value = 0;
  for (const attribute_value& a : device_attributes) {
    if (a.attr == attr) value = a.value;
  }
  if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) value += device;
  return true;
}

/// device_attribute as `s` configures the devices: CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
/// is 0 under GPUMEM_SIM_FABRIC=unsupported. Thread-safe; never throws.
inline bool device_attribute(int attr, int& value, int device, const settings& s) noexcept {
  if (!device_attribute(attr, value, device)) return false;
  if (attr == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) {
    value = s.fabric == fabric_support::unsupported ? 0 : 1;
  }
  return true;
}

}  // namespace gpumem::cudasim
