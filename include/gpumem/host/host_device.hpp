// gpumem — the host-device concept: where page-locked (pinned) host memory comes from, and the
// events that tell when an asynchronous copy out of it has finished.
//
// pinned_pool<HostDevice> (host/pinned_pool.hpp) is written against this concept only, so the
// same pool runs on the CUDA runtime (cuda_host_device) and on simulated_host_device, which tests
// use on machines without a GPU. No virtual functions: the host device is a template parameter.
//
// The concept (checked by is_host_device_v<H>):
//
//   struct HostDevice {
//     using stream_type = ...;   // trivially copyable, ==, std::hash-able (cudaStream_t)
//     using event_type = ...;    // trivially copyable (cudaEvent_t)
//
//     void* host_alloc(std::size_t bytes);             // cudaHostAlloc(cudaHostAllocDefault):
//                                                      // nullptr when out of (pinned) memory;
//                                                      // other failures throw cuda_error
//     void host_free(void* ptr, std::size_t bytes);    // cudaFreeHost; `bytes` as allocated
//     bool host_register(void* ptr, std::size_t bytes);  // cudaHostRegister(cudaHostRegister-
//                                                      // Default) of ordinary memory: false when
//                                                      // out of memory; other failures throw
//     void host_unregister(void* ptr, std::size_t bytes);  // cudaHostUnregister; as registered
//     stream_type default_stream() const noexcept;
//     event_type create_event();                       // cudaEventCreateWithFlags(DisableTiming)
//     void destroy_event(event_type);
//     void record_event(event_type, stream_type);
//     bool query_event(event_type);                    // true once the recorded work completed
//     void synchronize_event(event_type);              // waits for the recorded work
//   };
//
// Common rules, as for the device concept (device/device.hpp): every member may be called from
// any thread; failures other than out-of-memory throw gpumem::cuda_error carrying the CUDA status;
// release calls are not noexcept, so callers that must not throw (destructors) catch.
//
// Two models, each in its own header (as device/ has them):
//  * host/simulated_host_device.hpp — simulated_host_device: real host memory with a simulated
//    pinning limit, for tests;
//  * host/cuda_host_device.hpp — cuda_host_device: the CUDA runtime; link gpumem::cuda.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "gpumem/device/device.hpp"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// Concept check
// ---------------------------------------------------------------------------------------------

namespace detail {

template <class H, class = void>
struct host_device_members : std::false_type {};

// Each member is checked with the argument types the pool passes and the result it uses.
template <class H>
struct host_device_members<
    H,
    std::void_t<typename H::stream_type, typename H::event_type,
                decltype(std::declval<H&>().host_alloc(std::size_t{})),
                decltype(std::declval<H&>().host_free(std::declval<void*>(), std::size_t{})),
                decltype(std::declval<H&>().host_register(std::declval<void*>(), std::size_t{})),
                decltype(std::declval<H&>().host_unregister(std::declval<void*>(), std::size_t{})),
                decltype(std::declval<const H&>().default_stream()),
                decltype(std::declval<H&>().create_event()),
                decltype(std::declval<H&>().destroy_event(std::declval<typename H::event_type>())),
                decltype(std::declval<H&>().record_event(std::declval<typename H::event_type>(),
                                                         std::declval<typename H::stream_type>())),
                decltype(std::declval<H&>().query_event(std::declval<typename H::event_type>())),
                decltype(std::declval<H&>().synchronize_event(
                    std::declval<typename H::event_type>()))>> {
  using S = typename H::stream_type;
  using E = typename H::event_type;
  static constexpr bool value =
      std::is_trivially_copyable_v<S> && is_equality_comparable<S>::value &&
      is_hashable<S>::value && std::is_trivially_copyable_v<E> &&
      std::is_same_v<decltype(std::declval<H&>().host_alloc(std::size_t{})), void*> &&
      std::is_same_v<
          decltype(std::declval<H&>().host_register(std::declval<void*>(), std::size_t{})), bool> &&
      std::is_same_v<decltype(std::declval<const H&>().default_stream()), S> &&
      std::is_same_v<decltype(std::declval<H&>().create_event()), E> &&
      std::is_same_v<decltype(std::declval<H&>().query_event(std::declval<E>())), bool>&& noexcept(
          std::declval<const H&>().default_stream());
};

}  // namespace detail

/// True when H models the host-device concept above (member types, members callable with the
/// documented arguments, result types, default_stream() noexcept, stream_type trivially copyable
/// / == / hashable, event_type trivially copyable).
template <class H>
inline constexpr bool is_host_device_v = detail::host_device_members<H>::value;

// ---------------------------------------------------------------------------------------------
// Call counters
// ---------------------------------------------------------------------------------------------

/// How many times each pinned-memory call was made. A plain value type (not synchronised itself;
/// devices hand out copies taken under their lock).
struct host_call_counters {
  std::size_t host_alloc = 0;       ///< cudaHostAlloc
  std::size_t host_free = 0;        ///< cudaFreeHost
  std::size_t host_register = 0;    ///< cudaHostRegister
  std::size_t host_unregister = 0;  ///< cudaHostUnregister

  /// Sum over all kinds. Never throws.
  std::size_t total() const noexcept {
    return host_alloc + host_free + host_register + host_unregister;
  }
  friend bool operator==(const host_call_counters& a, const host_call_counters& b) noexcept {
    return a.host_alloc == b.host_alloc && a.host_free == b.host_free &&
           a.host_register == b.host_register && a.host_unregister == b.host_unregister;
  }
  friend bool operator!=(const host_call_counters& a, const host_call_counters& b) noexcept {
    return !(a == b);
  }
};

}  // namespace gpumem
