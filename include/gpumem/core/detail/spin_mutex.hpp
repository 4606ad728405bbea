// gpumem — the allocator's lock: test-and-test-and-set with a short spin, then blocking.
//
// The critical sections of a cache hit last tens of nanoseconds, so an uncontended acquire must
// cost one atomic exchange (std::mutex costs two atomics and a function call per side). When the
// holder is inside a device call (cudaMalloc can take milliseconds, an out-of-memory retry waits
// for the GPU), waiters stop spinning after a few thousand pauses (tens of microseconds) and
// sleep on a condition variable until the holder unlocks, instead of burning a core each. A waiter
// backs off exponentially between looks at the lock: a thread that allocates again right after
// releasing it then usually gets it back, so the lock and the allocator's state stay in one
// core's cache for a run of operations instead of crossing between cores on every one (with two
// threads on one allocator, this about halves the time per operation, counted over both threads
// until both have finished).
//
// unlock() wakes sleepers only when some are registered: an uncontended unlock is one release
// store and one load. The sleeper registers, then checks the lock, under the condition variable's
// mutex; the unlocker stores, then reads the count (both sequentially consistent), so either the
// sleeper sees the lock free or the unlocker sees the sleeper and notifies it under that mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace gpumem::detail {

class spin_mutex {
 public:
  void lock() noexcept {
    int backoff = 1;
    int pauses = 0;
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (pauses < k_max_pauses) {
          for (int i = 0; i < backoff; ++i) cpu_relax();
          pauses += backoff;
          if (backoff < k_max_backoff) backoff *= 2;
        } else {
          sleep_while_locked();
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept {
    locked_.store(false, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) {
      std::lock_guard<std::mutex> guard(sleep_mutex_);
      wake_.notify_one();
    }
  }

 private:
  static constexpr int k_max_backoff = 64;   // pauses between two looks at the lock
  static constexpr int k_max_pauses = 2048;  // then sleep: the holder may be in a device call
  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  // Sleeps until the lock looks free (or a short timeout, a safety net: never needed for
  // correctness, see the top of the file).
  void sleep_while_locked() noexcept {
    try {
      std::unique_lock<std::mutex> guard(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (locked_.load(std::memory_order_seq_cst)) {
        wake_.wait_for(guard, std::chrono::milliseconds(10));
      }
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    } catch (...) {
      // std::mutex::lock may throw system_error: fall back to spinning.
    }
  }

  std::atomic<bool> locked_{false};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

}  // namespace gpumem::detail
