// gpumem CUDA simulator — result codes and their names (included by simulator.hpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "gpumem/device/simulated_device.hpp"

namespace gpumem::cudasim {

// ---------------------------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------------------------

/// The results the simulator returns. Each has the same value as cudaError_t and CUresult.
enum status : int {
  ok = 0,
  invalid_value = 1,         ///< cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE
  out_of_memory = 2,         ///< cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY
  not_initialized = 3,       ///< cudaErrorInitializationError, CUDA_ERROR_NOT_INITIALIZED
  invalid_device = 101,      ///< cudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE
  invalid_context = 201,     ///< cudaErrorDeviceUninitialized, CUDA_ERROR_INVALID_CONTEXT
  invalid_handle = 400,      ///< cudaErrorInvalidResourceHandle, CUDA_ERROR_INVALID_HANDLE
  not_found = 500,           ///< cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND
  not_ready = 600,           ///< cudaErrorNotReady, CUDA_ERROR_NOT_READY
  already_registered = 712,  ///< cudaErrorHostMemoryAlreadyRegistered, CUDA_ERROR_HOST_MEMORY_...
  not_registered = 713,      ///< cudaErrorHostMemoryNotRegistered, CUDA_ERROR_HOST_MEMORY_...
  not_permitted = 800,       ///< cudaErrorNotPermitted, CUDA_ERROR_NOT_PERMITTED
  not_supported = 801,       ///< cudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED
  unknown = 999,             ///< cudaErrorUnknown, CUDA_ERROR_UNKNOWN
  peer_access_unsupported = 217,      ///< cudaErrorPeerAccessUnsupported, CUDA_ERROR_PEER_...
  illegal_state = 401,                ///< cudaErrorIllegalState, CUDA_ERROR_ILLEGAL_STATE
  illegal_address = 700,              ///< cudaErrorIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS
  peer_access_already_enabled = 704,  ///< cudaErrorPeerAccessAlreadyEnabled, CUDA_ERROR_PEER_...
  peer_access_not_enabled = 705,      ///< cudaErrorPeerAccessNotEnabled, CUDA_ERROR_PEER_...
  capture_unsupported = 900,          ///< cudaErrorStreamCaptureUnsupported, CUDA_ERROR_STREAM_...
  capture_invalidated = 901,          ///< cudaErrorStreamCaptureInvalidated
  capture_unmatched = 903,            ///< cudaErrorStreamCaptureUnmatched
  capture_unjoined = 904,             ///< cudaErrorStreamCaptureUnjoined
  capture_isolation = 905,            ///< cudaErrorStreamCaptureIsolation
  capture_implicit = 906,             ///< cudaErrorStreamCaptureImplicit
  captured_event = 907,               ///< cudaErrorCapturedEvent, CUDA_ERROR_CAPTURED_EVENT
  capture_wrong_thread = 908,         ///< cudaErrorStreamCaptureWrongThread
  invalid_device_function = 98,       ///< cudaErrorInvalidDeviceFunction (runtime only)
};

constexpr bool same_value(status s, cudaError_t runtime, CUresult driver) noexcept {
  return static_cast<int>(s) == static_cast<int>(runtime) &&
         static_cast<int>(s) == static_cast<int>(driver);
}
static_assert(same_value(invalid_value, cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE));
static_assert(same_value(out_of_memory, cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY));
static_assert(same_value(not_initialized, cudaErrorInitializationError,
                         CUDA_ERROR_NOT_INITIALIZED));
static_assert(same_value(invalid_device, cudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE));
static_assert(same_value(invalid_context, cudaErrorDeviceUninitialized,
                         CUDA_ERROR_INVALID_CONTEXT));
static_assert(same_value(invalid_handle, cudaErrorInvalidResourceHandle,
                         CUDA_ERROR_INVALID_HANDLE));
static_assert(same_value(not_found, cudaErrorSymbolNotFound, CUDA_ERROR_NOT_FOUND));
static_assert(same_value(not_ready, cudaErrorNotReady, CUDA_ERROR_NOT_READY));
static_assert(same_value(already_registered, cudaErrorHostMemoryAlreadyRegistered,
                         CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED));
static_assert(same_value(not_registered, cudaErrorHostMemoryNotRegistered,
                         CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED));
static_assert(same_value(not_permitted, cudaErrorNotPermitted, CUDA_ERROR_NOT_PERMITTED));
static_assert(same_value(not_supported, cudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED));
static_assert(same_value(unknown, cudaErrorUnknown, CUDA_ERROR_UNKNOWN));
static_assert(same_value(peer_access_unsupported, cudaErrorPeerAccessUnsupported,
                         CUDA_ERROR_PEER_ACCESS_UNSUPPORTED));
static_assert(same_value(illegal_state, cudaErrorIllegalState, CUDA_ERROR_ILLEGAL_STATE));
static_assert(same_value(illegal_address, cudaErrorIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS));
static_assert(same_value(peer_access_already_enabled, cudaErrorPeerAccessAlreadyEnabled,
                         CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED));
static_assert(same_value(peer_access_not_enabled, cudaErrorPeerAccessNotEnabled,
                         CUDA_ERROR_PEER_ACCESS_NOT_ENABLED));
static_assert(same_value(capture_unsupported, cudaErrorStreamCaptureUnsupported,
                         CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
static_assert(same_value(capture_invalidated, cudaErrorStreamCaptureInvalidated,
                         CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
static_assert(same_value(capture_unmatched, cudaErrorStreamCaptureUnmatched,
                         CUDA_ERROR_STREAM_CAPTURE_UNMATCHED));
static_assert(same_value(capture_unjoined, cudaErrorStreamCaptureUnjoined,
                         CUDA_ERROR_STREAM_CAPTURE_UNJOINED));
static_assert(same_value(capture_isolation, cudaErrorStreamCaptureIsolation,
                         CUDA_ERROR_STREAM_CAPTURE_ISOLATION));
static_assert(same_value(capture_implicit, cudaErrorStreamCaptureImplicit,
                         CUDA_ERROR_STREAM_CAPTURE_IMPLICIT));
static_assert(same_value(captured_event, cudaErrorCapturedEvent, CUDA_ERROR_CAPTURED_EVENT));
static_assert(same_value(capture_wrong_thread, cudaErrorStreamCaptureWrongThread,
                         CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD));
static_assert(static_cast<int>(invalid_device_function) ==
              static_cast<int>(cudaErrorInvalidDeviceFunction));
static_assert(simulated_device::error_invalid_value == static_cast<int>(invalid_value) &&
              simulated_device::error_out_of_memory == static_cast<int>(out_of_memory) &&
              simulated_device::error_invalid_handle == static_cast<int>(invalid_handle));

// ---------------------------------------------------------------------------------------------
// Error names and descriptions
// ---------------------------------------------------------------------------------------------

struct error_text {
  int code;
  const char* name;
  const char* text;
};

/// cudaGetErrorName / cudaGetErrorString of `code`; nullptr when it is not a cudaError_t value.
/// Thread-safe; never throws.
inline const error_text* runtime_error_text(int code) noexcept {
#define GPUMEM_SIM_RUNTIME_ERROR(name, text) {static_cast<int>(name), #name, text},
  static constexpr error_text table[] = {
#include "error_tables.inc"
  };
#undef GPUMEM_SIM_RUNTIME_ERROR
  for (const error_text& e : table) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

/// The CUresult name of `code`; nullptr when it is not a CUresult value. Thread-safe; never
/// throws.
inline const char* driver_error_name(int code) noexcept {
  struct entry {
    int code;
    const char* name;
  };
#define GPUMEM_SIM_DRIVER_ERROR(name) {static_cast<int>(name), #name},
  static constexpr entry table[] = {
#include "error_tables.inc"
  };
#undef GPUMEM_SIM_DRIVER_ERROR
  for (const entry& e : table) {
    if (e.code == code) return e.name;
  }
  return nullptr;
}

/// cuGetErrorString of `code`: the runtime's description of the same value (the driver's texts
/// are the same), or nullptr when `code` is not a CUresult value. Thread-safe; never throws.
inline const char* driver_error_string(int code) noexcept {
  if (driver_error_name(code) == nullptr) return nullptr;
  if (code == CUDA_ERROR_CONTEXT_ALREADY_CURRENT) return "context already current";
  if (code == CUDA_ERROR_KEY_ROTATION) return "error during the key rotation sequence";
  const error_text* e = runtime_error_text(code);
  return e != nullptr ? e->text : "unknown error";
}

}  // namespace gpumem::cudasim
