// gpumem — the allocator's lock: test-and-test-and-set with a short spin, then yielding.
//
// The critical sections of a cache hit last tens of nanoseconds, so an uncontended acquire must
// cost one atomic exchange (std::mutex costs two atomics and a function call per side). When the
// holder is inside a device call (cudaMalloc can take milliseconds), waiters stop spinning after a
// few hundred iterations and yield the CPU instead.
#pragma once

#include <atomic>
#include <thread>

namespace gpumem::detail {

class spin_mutex {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 256) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  std::atomic<bool> locked_{false};
};

}  // namespace gpumem::detail
