// gpumem CUDA simulator — the stubs of exported functions the simulator does not implement.
//
// The generated <lib>_stubs.cpp (cmake/generate_exports.cmake) holds one line per function the
// real library exports. Each defines a *weak* function that reports its name once on stderr and
// returns cudaErrorNotSupported / CUDA_ERROR_NOT_SUPPORTED (both 801); the simulator's own
// definitions in runtime.cpp / driver.cpp are strong and replace the stubs of what it implements.
// Every CUDA API function returns cudaError_t or CUresult (an int in a register) or void, so one
// stub shape serves all of them; the few with other results are implemented (runtime.cpp).
//
// This header must not include the CUDA headers: the stubs' parameter lists differ from theirs.
#pragma once

#include <atomic>

namespace gpumem::cudasim {

/// Reports `name` on stderr the first time (`reported`), counts the call, sets the runtime's last
/// error, and returns cudaErrorNotSupported. Defined in runtime.cpp. Never throws.
int runtime_unimplemented(const char* name, std::atomic<bool>& reported) noexcept;

/// Reports `name` on stderr the first time (`reported`), counts the call, and returns
/// CUDA_ERROR_NOT_SUPPORTED. Defined in driver.cpp. Never throws.
int driver_unimplemented(const char* name, std::atomic<bool>& reported) noexcept;

}  // namespace gpumem::cudasim

#define GPUMEM_SIM_STUB_(name, report)                                 \
  extern "C" __attribute__((weak, visibility("default"))) int name() { \
    static std::atomic<bool> reported{false};                          \
    return report(#name, reported);                                    \
  }

#define GPUMEM_SIM_RUNTIME_STUB(name) \
  GPUMEM_SIM_STUB_(name, ::gpumem::cudasim::runtime_unimplemented)
#define GPUMEM_SIM_DRIVER_STUB(name) GPUMEM_SIM_STUB_(name, ::gpumem::cudasim::driver_unimplemented)
