// gpumem — keeps the memory an allocator reserves registered with a communication library (NCCL's
// ncclCommRegister / ncclCommDeregister: zero-copy collectives on registered buffers), following
// the allocator's events: a segment obtained (segment_alloc) or pages mapped (segment_map) are
// registered; a segment returned (segment_free) or pages unmapped (segment_unmap) are deregistered
// first — for an unmap inside a registered range, the parts of that range still mapped are
// registered again. At every moment the registered ranges are exactly the reserved memory.
//
//   gpumem::nccl::segment_registry registry(gpumem::nccl::nccl_registrar(comm));
//   allocator.set_event_observer([&](const auto& e) { registry.on_event(e.action, e.address,
//   e.size); });
//
// Independent of NCCL itself (a registrar is two functions), so it is tested with a fake one.
// Thread safety: on_event is called with the allocator's lock held, which serialises it; ranges()
// may be called concurrently. Errors: what the registrar throws propagates to the allocator call
// that caused the event (memory stays consistent: the allocator finished its own bookkeeping for a
// segment_alloc/map before the event; for a free/unmap the deregistration happens before).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gpumem/core/caching_allocator.hpp"

namespace gpumem::nccl {

/// How to register and deregister a range with a communication library.
struct registrar {
  /// Registers [ptr, ptr + size); returns the library's handle for deregistering it.
  std::function<void*(void* ptr, std::size_t size)> register_range;
  /// Deregisters a handle register_range returned.
  std::function<void(void* handle)> deregister;
};

/// Keeps an allocator's reserved memory registered; see the top of this file.
class segment_registry {
 public:
  /// Throws std::invalid_argument when either function of `r` is empty.
  explicit segment_registry(registrar r) : registrar_(std::move(r)) {
    if (!registrar_.register_range || !registrar_.deregister) {
      throw std::invalid_argument("gpumem::nccl::segment_registry: empty registrar function");
    }
  }

  segment_registry(const segment_registry&) = delete;
  segment_registry& operator=(const segment_registry&) = delete;

  /// Deregisters everything still registered (errors ignored).
  ~segment_registry() {
    for (auto& [address, r] : ranges_) {
      try {
        registrar_.deregister(r.handle);
      } catch (...) {
      }
    }
  }

  /// Follows one allocator event (caching_allocator::set_event_observer); other actions are
  /// ignored.
  void on_event(allocator_action action, std::uintptr_t address, std::size_t size) {
    switch (action) {
      case allocator_action::segment_alloc:
      case allocator_action::segment_map:
        add(address, size);
        break;
      case allocator_action::segment_free:
      case allocator_action::segment_unmap:
        remove(address, size);
        break;
      default:
        break;
    }
  }

  /// The registered ranges, (address, size) in address order.
  std::vector<std::pair<std::uintptr_t, std::size_t>> ranges() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    for (const auto& [address, r] : ranges_) out.emplace_back(address, r.size);
    return out;
  }

  /// Registrations and deregistrations made so far.
  std::size_t registrations() const noexcept { return registrations_; }
  std::size_t deregistrations() const noexcept { return deregistrations_; }

 private:
  struct registered_range {
    std::size_t size = 0;
    void* handle = nullptr;
  };

  void add(std::uintptr_t address, std::size_t size) {
    if (size == 0) return;
    void* handle = registrar_.register_range(reinterpret_cast<void*>(address), size);
    ++registrations_;
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_[address] = registered_range{size, handle};
  }

  // Deregisters every range overlapping [address, address + size) and registers again what of
  // them lies outside it.
  void remove(std::uintptr_t address, std::size_t size) {
    const std::uintptr_t end = address + size;
    std::vector<std::pair<std::uintptr_t, registered_range>> hit;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = ranges_.upper_bound(address);
      if (it != ranges_.begin()) --it;
      while (it != ranges_.end() && it->first < end) {
        if (it->first + it->second.size > address) {
          hit.emplace_back(*it);
          it = ranges_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& [start, r] : hit) {
      registrar_.deregister(r.handle);
      ++deregistrations_;
      if (start < address) add(start, address - start);
      if (start + r.size > end) add(end, start + r.size - end);
    }
  }

  registrar registrar_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, registered_range> ranges_;
  std::size_t registrations_ = 0;
  std::size_t deregistrations_ = 0;
};

}  // namespace gpumem::nccl
