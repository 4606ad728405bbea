// gpumem — the device concept: where raw GPU memory comes from.
//
// A *device* hands out *segments* (one cudaMalloc each), gives events and streams, and reports its
// memory. caching_allocator<Device> and pinned_pool<HostDevice> are written against this concept
// only, so the same allocator code runs on a real GPU (cuda_device) and on the simulated device
// (simulated_device) that tests and the replay tool use. No virtual functions: the device is a
// template parameter so the hot path has no indirect call. docs/architecture.md ("How to add a
// device") says what a new device needs.
//
// clang-format off
// The concept (checked by is_device_v<D>):
//
//   struct Device {
//     using stream_type = ...;  // trivially copyable, ==, std::hash-able (cudaStream_t)
//     using event_type = ...;   // trivially copyable (cudaEvent_t)
//     static constexpr bool supports_vmm = ...;  // true: also models the VMM extension below
//
//     int index() const noexcept;                      // the device ordinal
//     std::size_t total_memory() const;                // bytes of device memory
//     void memory_info(std::size_t& free_bytes, std::size_t& total_bytes);  // cudaMemGetInfo
//     void* allocate(std::size_t bytes);               // one segment (cudaMalloc); nullptr when the
//                                                      // device is out of memory; other failures
//                                                      // throw cuda_error
//     void deallocate(void* ptr, std::size_t bytes);   // cudaFree; `bytes` is what allocate was
//                                                      // given. Implies a device synchronisation.
//     stream_type default_stream() const noexcept;
//     event_type create_event();                       // cudaEventCreateWithFlags(DisableTiming)
//     void destroy_event(event_type);
//     void record_event(event_type, stream_type);
//     bool query_event(event_type);                    // true when the recorded work has completed
//                                                      // (an event never recorded is complete)
//     void synchronize_event(event_type);              // waits for the recorded work
//     void synchronize();                              // cudaDeviceSynchronize
//   };
//
// Common rules: every member may be called from any thread (the CUDA runtime is thread-safe and the
// simulated device takes a mutex); failures other than out-of-memory throw gpumem::cuda_error
// carrying the CUDA status; deallocate/destroy_event/... are not noexcept because CUDA reports
// errors from them too, so callers that must not throw (destructors) catch.
//
// The VMM extension (devices with supports_vmm == true; checked by is_vmm_device_v<D>) mirrors the
// CUDA driver's virtual-memory API, all sizes and addresses multiples of granularity():
//
//   using physical_handle = ...;            // CUmemGenericAllocationHandle; value-initialised = invalid
//   std::size_t granularity() const;        // cuMemGetAllocationGranularity
//   std::uintptr_t reserve_address(std::size_t size, std::size_t alignment = 0);  // cuMemAddressReserve
//   void free_address(std::uintptr_t va, std::size_t size);                       // cuMemAddressFree
//   physical_handle create_physical(std::size_t size);  // cuMemCreate; invalid handle on OOM
//   void release_physical(physical_handle);             // cuMemRelease
//   void map(std::uintptr_t va, std::size_t size, std::size_t offset, physical_handle);  // cuMemMap
//   void unmap(std::uintptr_t va, std::size_t size);    // cuMemUnmap
//   void set_access(std::uintptr_t va, std::size_t size);  // cuMemSetAccess (read/write)
//   void stream_wait_event(stream_type, event_type);    // cudaStreamWaitEvent: the stream's later
//                                                       // work waits for the event (no host wait)
// clang-format on
//
// Also here: call_kind / call_counters / cost_model, the vocabulary for counting device calls and
// pricing them, shared by the simulated device, the CUDA simulator and the replay tool.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpumem/detail/size_units.hpp"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// Device calls: kinds, counters, costs
// ---------------------------------------------------------------------------------------------

/// One kind of device call, runtime or driver. The order is the order of call_counters' fields.
enum class call_kind : std::uint8_t {
  malloc,              ///< cudaMalloc
  free,                ///< cudaFree
  mem_get_info,        ///< cudaMemGetInfo
  event_create,        ///< cudaEventCreateWithFlags
  event_destroy,       ///< cudaEventDestroy
  event_record,        ///< cudaEventRecord
  event_query,         ///< cudaEventQuery
  event_synchronize,   ///< cudaEventSynchronize
  device_synchronize,  ///< cudaDeviceSynchronize
  stream_create,       ///< cudaStreamCreateWithFlags
  stream_destroy,      ///< cudaStreamDestroy
  address_reserve,     ///< cuMemAddressReserve
  address_free,        ///< cuMemAddressFree
  mem_create,          ///< cuMemCreate
  mem_release,         ///< cuMemRelease
  mem_map,             ///< cuMemMap
  mem_unmap,           ///< cuMemUnmap
  set_access,          ///< cuMemSetAccess
  stream_wait_event,   ///< cudaStreamWaitEvent
};

/// Number of call_kind values.
inline constexpr std::size_t call_kind_count = 19;

/// Every call_kind in declaration order, for loops over kinds.
inline constexpr std::array<call_kind, call_kind_count> all_call_kinds = {
    call_kind::malloc,
    call_kind::free,
    call_kind::mem_get_info,
    call_kind::event_create,
    call_kind::event_destroy,
    call_kind::event_record,
    call_kind::event_query,
    call_kind::event_synchronize,
    call_kind::device_synchronize,
    call_kind::stream_create,
    call_kind::stream_destroy,
    call_kind::address_reserve,
    call_kind::address_free,
    call_kind::mem_create,
    call_kind::mem_release,
    call_kind::mem_map,
    call_kind::mem_unmap,
    call_kind::set_access,
    call_kind::stream_wait_event};

/// The field name of a call kind ("malloc", "event_query", ...). Thread-safe; never throws.
constexpr std::string_view call_kind_name(call_kind kind) noexcept {
  constexpr std::string_view names[call_kind_count] = {"malloc",
                                                       "free",
                                                       "mem_get_info",
                                                       "event_create",
                                                       "event_destroy",
                                                       "event_record",
                                                       "event_query",
                                                       "event_synchronize",
                                                       "device_synchronize",
                                                       "stream_create",
                                                       "stream_destroy",
                                                       "address_reserve",
                                                       "address_free",
                                                       "mem_create",
                                                       "mem_release",
                                                       "mem_map",
                                                       "mem_unmap",
                                                       "set_access",
                                                       "stream_wait_event"};
  return names[static_cast<std::size_t>(kind)];
}

/// The CUDA function a call kind stands for ("cudaMalloc", "cuMemMap", ...). Thread-safe; never
/// throws.
constexpr std::string_view cuda_call_name(call_kind kind) noexcept {
  constexpr std::string_view names[call_kind_count] = {"cudaMalloc",
                                                       "cudaFree",
                                                       "cudaMemGetInfo",
                                                       "cudaEventCreateWithFlags",
                                                       "cudaEventDestroy",
                                                       "cudaEventRecord",
                                                       "cudaEventQuery",
                                                       "cudaEventSynchronize",
                                                       "cudaDeviceSynchronize",
                                                       "cudaStreamCreateWithFlags",
                                                       "cudaStreamDestroy",
                                                       "cuMemAddressReserve",
                                                       "cuMemAddressFree",
                                                       "cuMemCreate",
                                                       "cuMemRelease",
                                                       "cuMemMap",
                                                       "cuMemUnmap",
                                                       "cuMemSetAccess",
                                                       "cudaStreamWaitEvent"};
  return names[static_cast<std::size_t>(kind)];
}

/// How many times each device call was made. A plain value type: not synchronised itself (devices
/// hand out copies taken under their lock).
struct call_counters {
  std::size_t malloc = 0;
  std::size_t free = 0;
  std::size_t mem_get_info = 0;
  std::size_t event_create = 0;
  std::size_t event_destroy = 0;
  std::size_t event_record = 0;
  std::size_t event_query = 0;
  std::size_t event_synchronize = 0;
  std::size_t device_synchronize = 0;
  std::size_t stream_create = 0;
  std::size_t stream_destroy = 0;
  std::size_t address_reserve = 0;
  std::size_t address_free = 0;
  std::size_t mem_create = 0;
  std::size_t mem_release = 0;
  std::size_t mem_map = 0;
  std::size_t mem_unmap = 0;
  std::size_t set_access = 0;
  std::size_t stream_wait_event = 0;

  /// The counter of one kind. Never throws.
  std::size_t& operator[](call_kind kind) noexcept;
  std::size_t operator[](call_kind kind) const noexcept;
  /// Sum over all kinds. Never throws.
  std::size_t total() const noexcept;
  /// The calls that move or wait for device memory: cudaMalloc/cudaFree, the virtual-memory calls
  /// and the synchronisations (not event creation, recording or queries). Never throws.
  std::size_t memory_calls() const noexcept {
    return malloc + free + address_reserve + address_free + mem_create + mem_release + mem_map +
           mem_unmap + set_access + event_synchronize + device_synchronize;
  }
  /// The calls that make the host wait for the device: event and device synchronisations and
  /// cudaFree (which synchronises the device implicitly). Never throws.
  std::size_t host_synchronizations() const noexcept {
    return free + event_synchronize + device_synchronize;
  }

  friend bool operator==(const call_counters& a, const call_counters& b) noexcept {
    for (call_kind k : all_call_kinds) {
      if (a[k] != b[k]) return false;
    }
    return true;
  }
  friend bool operator!=(const call_counters& a, const call_counters& b) noexcept {
    return !(a == b);
  }
  /// Per-kind difference (calls made between two snapshots `b` then `a`). Never throws.
  friend call_counters operator-(const call_counters& a, const call_counters& b) noexcept {
    call_counters d;
    for (call_kind k : all_call_kinds) d[k] = a[k] - b[k];
    return d;
  }
};

namespace detail {
inline constexpr std::array<std::size_t call_counters::*, call_kind_count> counter_fields = {
    &call_counters::malloc,
    &call_counters::free,
    &call_counters::mem_get_info,
    &call_counters::event_create,
    &call_counters::event_destroy,
    &call_counters::event_record,
    &call_counters::event_query,
    &call_counters::event_synchronize,
    &call_counters::device_synchronize,
    &call_counters::stream_create,
    &call_counters::stream_destroy,
    &call_counters::address_reserve,
    &call_counters::address_free,
    &call_counters::mem_create,
    &call_counters::mem_release,
    &call_counters::mem_map,
    &call_counters::mem_unmap,
    &call_counters::set_access,
    &call_counters::stream_wait_event};
}  // namespace detail

inline std::size_t& call_counters::operator[](call_kind kind) noexcept {
  return this->*detail::counter_fields[static_cast<std::size_t>(kind)];
}
inline std::size_t call_counters::operator[](call_kind kind) const noexcept {
  return this->*detail::counter_fields[static_cast<std::size_t>(kind)];
}
inline std::size_t call_counters::total() const noexcept {
  std::size_t sum = 0;
  for (call_kind k : all_call_kinds) sum += (*this)[k];
  return sum;
}

/// Simulated time charged per device call: a fixed number of seconds per call of each kind plus,
/// for the calls whose cost grows with the size, seconds per byte. All zero (off) by default.
/// A plain value type (not synchronised itself).
struct cost_model {
  // Seconds per call.
  double malloc = 0;
  double free = 0;  ///< includes the device synchronisation cudaFree implies (idle device)
  double mem_get_info = 0;
  double event_create = 0;
  double event_destroy = 0;
  double event_record = 0;
  double event_query = 0;
  double event_synchronize = 0;
  double device_synchronize = 0;
  double stream_create = 0;
  double stream_destroy = 0;
  double address_reserve = 0;
  double address_free = 0;
  double mem_create = 0;
  double mem_release = 0;
  double mem_map = 0;
  double mem_unmap = 0;
  double set_access = 0;
  double stream_wait_event = 0;
  // Seconds per byte, added to the per-call figure of a successful call.
  double malloc_per_byte = 0;
  double free_per_byte = 0;
  double mem_create_per_byte = 0;
  double mem_map_per_byte = 0;
  double mem_unmap_per_byte = 0;
  double set_access_per_byte = 0;

  /// Rough, order-of-magnitude figures for a current datacenter GPU with an idle device, gathered
  /// from public measurements and folklore rather than measured on one machine: good for "how many
  /// milliseconds would this allocator spend in the driver", not for absolute predictions.
  /// cudaMalloc ~100 us + ~0.5 ms/GiB, cudaFree ~200 us (its implied synchronisation included) +
  /// ~0.25 ms/GiB, cudaMemGetInfo ~10 us, events and streams a few us, cuMemCreate ~20 us +
  /// ~0.25 ms/GiB, cuMemMap ~5 us, cuMemUnmap ~20 us (TLB invalidation), cuMemSetAccess ~20 us
  /// (it is known to be slow), cudaStreamWaitEvent ~2 us. Thread-safe; never throws.
  static cost_model typical() noexcept {
    cost_model c;
    constexpr double per_gib = 1.0 / static_cast<double>(std::size_t{1} << 30);
    c.malloc = 1e-4;
    c.malloc_per_byte = 5e-4 * per_gib;
    c.free = 2e-4;
    c.free_per_byte = 2.5e-4 * per_gib;
    c.mem_get_info = 1e-5;
    c.event_create = 2e-6;
    c.event_destroy = 2e-6;
    c.event_record = 2e-6;
    c.event_query = 1e-6;
    c.event_synchronize = 5e-6;
    c.device_synchronize = 1e-5;
    c.stream_create = 5e-6;
    c.stream_destroy = 5e-6;
    c.address_reserve = 1e-5;
    c.address_free = 1e-5;
    c.mem_create = 2e-5;
    c.mem_create_per_byte = 2.5e-4 * per_gib;
    c.mem_release = 1e-5;
    c.mem_map = 5e-6;
    c.mem_unmap = 2e-5;
    c.set_access = 2e-5;
    c.stream_wait_event = 2e-6;
    return c;
  }

  /// Seconds one call of `kind` costs, including `bytes` × the per-byte figure where that kind
  /// has one (pass 0 for a failed call). Thread-safe; never throws.
  double seconds(call_kind kind, std::size_t bytes = 0) const noexcept;

  /// True when any figure is non-zero. Thread-safe; never throws.
  bool enabled() const noexcept {
    for (call_kind k : all_call_kinds) {
      if (seconds(k, 1) != 0) return true;
    }
    return false;
  }
};

namespace detail {
inline constexpr std::array<double cost_model::*, call_kind_count> cost_fields = {
    &cost_model::malloc,
    &cost_model::free,
    &cost_model::mem_get_info,
    &cost_model::event_create,
    &cost_model::event_destroy,
    &cost_model::event_record,
    &cost_model::event_query,
    &cost_model::event_synchronize,
    &cost_model::device_synchronize,
    &cost_model::stream_create,
    &cost_model::stream_destroy,
    &cost_model::address_reserve,
    &cost_model::address_free,
    &cost_model::mem_create,
    &cost_model::mem_release,
    &cost_model::mem_map,
    &cost_model::mem_unmap,
    &cost_model::set_access,
    &cost_model::stream_wait_event};
}  // namespace detail

inline double cost_model::seconds(call_kind kind, std::size_t bytes) const noexcept {
  double per_byte = 0;
  switch (kind) {
    case call_kind::malloc:
      per_byte = malloc_per_byte;
      break;
    case call_kind::free:
      per_byte = free_per_byte;
      break;
    case call_kind::mem_create:
      per_byte = mem_create_per_byte;
      break;
    case call_kind::mem_map:
      per_byte = mem_map_per_byte;
      break;
    case call_kind::mem_unmap:
      per_byte = mem_unmap_per_byte;
      break;
    case call_kind::set_access:
      per_byte = set_access_per_byte;
      break;
    default:
      break;
  }
  return this->*detail::cost_fields[static_cast<std::size_t>(kind)] +
         per_byte * static_cast<double>(bytes);
}

// ---------------------------------------------------------------------------------------------
// Concept checks
// ---------------------------------------------------------------------------------------------

namespace detail {

template <class T, class = void>
struct is_hashable : std::false_type {};
template <class T>
struct is_hashable<T, std::void_t<decltype(std::hash<T>{}(std::declval<const T&>()))>>
    : std::is_convertible<decltype(std::hash<T>{}(std::declval<const T&>())), std::size_t> {};

template <class T, class = void>
struct is_equality_comparable : std::false_type {};
template <class T>
struct is_equality_comparable<
    T, std::void_t<decltype(std::declval<const T&>() == std::declval<const T&>())>>
    : std::is_convertible<decltype(std::declval<const T&>() == std::declval<const T&>()), bool> {};

template <class D, class = void>
struct device_members : std::false_type {};

// Each member is checked with the argument types the allocator passes and the result it uses.
template <class D>
struct device_members<
    D, std::void_t<
           typename D::stream_type, typename D::event_type, decltype(D::supports_vmm),
           decltype(std::declval<const D&>().index()),
           decltype(std::declval<const D&>().total_memory()),
           decltype(std::declval<D&>().memory_info(std::declval<std::size_t&>(),
                                                   std::declval<std::size_t&>())),
           decltype(std::declval<D&>().allocate(std::size_t{})),
           decltype(std::declval<D&>().deallocate(std::declval<void*>(), std::size_t{})),
           decltype(std::declval<const D&>().default_stream()),
           decltype(std::declval<D&>().create_event()),
           decltype(std::declval<D&>().destroy_event(std::declval<typename D::event_type>())),
           decltype(std::declval<D&>().record_event(std::declval<typename D::event_type>(),
                                                    std::declval<typename D::stream_type>())),
           decltype(std::declval<D&>().query_event(std::declval<typename D::event_type>())),
           decltype(std::declval<D&>().synchronize_event(std::declval<typename D::event_type>())),
           decltype(std::declval<D&>().synchronize())>> {
  using S = typename D::stream_type;
  using E = typename D::event_type;
  static constexpr bool value =
      std::is_trivially_copyable_v<S> && is_equality_comparable<S>::value &&
      is_hashable<S>::value && std::is_trivially_copyable_v<E> &&
      std::is_convertible_v<decltype(D::supports_vmm), bool> &&
      std::is_same_v<decltype(std::declval<const D&>().index()), int> &&
      std::is_same_v<decltype(std::declval<const D&>().total_memory()), std::size_t> &&
      std::is_same_v<decltype(std::declval<D&>().allocate(std::size_t{})), void*> &&
      std::is_same_v<decltype(std::declval<const D&>().default_stream()), S> &&
      std::is_same_v<decltype(std::declval<D&>().create_event()), E> &&
      std::is_same_v<decltype(std::declval<D&>().query_event(std::declval<E>())), bool>&& noexcept(
          std::declval<const D&>().index())&& noexcept(std::declval<const D&>().default_stream());
};

template <class D, class = void>
struct vmm_members : std::false_type {};

template <class D>
struct vmm_members<
    D,
    std::void_t<
        typename D::physical_handle, decltype(std::declval<const D&>().granularity()),
        decltype(std::declval<D&>().reserve_address(std::size_t{}, std::size_t{})),
        decltype(std::declval<D&>().free_address(std::uintptr_t{}, std::size_t{})),
        decltype(std::declval<D&>().create_physical(std::size_t{})),
        decltype(std::declval<D&>().release_physical(std::declval<typename D::physical_handle>())),
        decltype(std::declval<D&>().map(std::uintptr_t{}, std::size_t{}, std::size_t{},
                                        std::declval<typename D::physical_handle>())),
        decltype(std::declval<D&>().unmap(std::uintptr_t{}, std::size_t{})),
        decltype(std::declval<D&>().set_access(std::uintptr_t{}, std::size_t{})),
        decltype(std::declval<D&>().stream_wait_event(std::declval<typename D::stream_type>(),
                                                      std::declval<typename D::event_type>()))>> {
  using H = typename D::physical_handle;
  static constexpr bool value =
      std::is_trivially_copyable_v<H> &&
      std::is_same_v<decltype(std::declval<const D&>().granularity()), std::size_t> &&
      std::is_same_v<decltype(std::declval<D&>().reserve_address(std::size_t{}, std::size_t{})),
                     std::uintptr_t> &&
      std::is_same_v<decltype(std::declval<D&>().create_physical(std::size_t{})), H>;
};

}  // namespace detail

/// True when D models the device concept above (member types, members callable with the
/// documented arguments, result types, index() and default_stream() noexcept, stream_type
/// trivially copyable / == / hashable, event_type trivially copyable).
template <class D>
inline constexpr bool is_device_v = detail::device_members<D>::value;

namespace detail {
template <class D, bool = is_device_v<D>>
struct vmm_device : std::false_type {};
template <class D>
struct vmm_device<D, true>
    : std::bool_constant<static_cast<bool>(D::supports_vmm) && vmm_members<D>::value> {};
}  // namespace detail

/// True when D models the device concept and the VMM extension, and says so (supports_vmm).
template <class D>
inline constexpr bool is_vmm_device_v = detail::vmm_device<D>::value;

namespace detail {

// Optional members of a device with several GPUs in the process (cuda_device, cuda_vmm_device):
//   int stream_device(stream_type) const;           // the device a stream belongs to
//   event_type create_event_for(stream_type);        // an event that can be recorded on it
// and of a VMM device whose memory other GPUs may access:
//   void grant_access(std::uintptr_t va, std::size_t size, int peer);  // cuMemSetAccess for peer
// Devices without them have one GPU: events are created on it, access is granted to it alone.
template <class D, class = void>
struct has_stream_device : std::false_type {};
template <class D>
struct has_stream_device<D, std::void_t<decltype(std::declval<const D&>().stream_device(
                                            std::declval<typename D::stream_type>())),
                                        decltype(std::declval<D&>().create_event_for(
                                            std::declval<typename D::stream_type>()))>>
    : std::true_type {};
template <class D>
inline constexpr bool has_stream_device_v = has_stream_device<D>::value;

template <class D, class = void>
struct has_grant_access : std::false_type {};
template <class D>
struct has_grant_access<D, std::void_t<decltype(std::declval<D&>().grant_access(
                               std::uintptr_t{}, std::size_t{}, int{}))>> : std::true_type {};
template <class D>
inline constexpr bool has_grant_access_v = has_grant_access<D>::value;

// Optional member of a VMM device whose physical memory other processes can open
// (cuda_vmm_device): int export_handle(physical_handle) const;  // a POSIX file descriptor
template <class D, class = void>
struct has_export_handle : std::false_type {};
template <class D>
struct has_export_handle<D, std::void_t<decltype(std::declval<const D&>().export_handle(
                                std::declval<typename D::physical_handle>()))>> : std::true_type {};
template <class D>
inline constexpr bool has_export_handle_v = has_export_handle<D>::value;

// Optional member of such a device whose memory may carry fabric handles instead (cuda_vmm_device):
// fabric_handle export_fabric_handle(physical_handle) const, used when
// shareable_handle_type() == D::shareable_handle::fabric.
template <class D, class = void>
struct has_export_fabric_handle : std::false_type {};
template <class D>
struct has_export_fabric_handle<
    D, std::void_t<decltype(std::declval<const D&>().export_fabric_handle(
                       std::declval<typename D::physical_handle>())),
                   decltype(std::declval<const D&>().shareable_handle_type() ==
                            D::shareable_handle::fabric)>> : std::true_type {};
template <class D>
inline constexpr bool has_export_fabric_handle_v = has_export_fabric_handle<D>::value;

// Optional members of a device that exposes the graph a stream is being captured into
// (cuda_device), for reusing a block freed with record_stream uses during a capture once the
// graph orders its uses before new work (graph_capture_record_stream_reuse):
//   using graph_node_type = ...;
//   bool capture_terminals(stream_type, std::vector<graph_node_type>& out);  // false: not
//   capturing void graph_node_dependencies(graph_node_type, std::vector<graph_node_type>& out);
template <class D, class = void>
struct has_capture_graph : std::false_type {};
template <class D>
struct has_capture_graph<
    D, std::void_t<typename D::graph_node_type,
                   decltype(std::declval<D&>().capture_terminals(
                       std::declval<typename D::stream_type>(),
                       std::declval<std::vector<typename D::graph_node_type>&>())),
                   decltype(std::declval<D&>().graph_node_dependencies(
                       std::declval<typename D::graph_node_type>(),
                       std::declval<std::vector<typename D::graph_node_type>&>()))>>
    : std::true_type {};
template <class D>
inline constexpr bool has_capture_graph_v = has_capture_graph<D>::value;
// D::graph_node_type where the device has one, else an unused stand-in.
template <class D, class = void>
struct capture_graph_node {
  using type = const void*;
};
template <class D>
struct capture_graph_node<D, std::void_t<typename D::graph_node_type>> {
  using type = typename D::graph_node_type;
};

}  // namespace detail

}  // namespace gpumem
