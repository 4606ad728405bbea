// gpumem — fault injection for the simulated devices: the rules (fault_injection), the injector
// that applies them (detail::fault_injector) and the fault and out-of-memory accounting with its
// public calls (detail::simulated_fault_state), shared by simulated_device
// (device/simulated_device.hpp) and simulated_host_device (host/simulated_host_device.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

namespace gpumem {

/// Faults the simulated device injects into its *fallible* calls — allocate, create_physical,
/// reserve_address and map; no other call ever fails by injection. An injected failure looks like
/// running out of memory: allocate returns nullptr, create_physical returns the invalid handle,
/// reserve_address and map throw cuda_error with simulated_device::error_out_of_memory and a
/// message that says the fault was injected. A call fails when any enabled rule says so.
struct fault_injection {
  /// Fail the N-th fallible call (1-based) counted since construction or the last set_faults();
  /// only that one call. 0 = off. Calls rejected as misuse are not counted.
  std::size_t fail_nth_call = 0;
  /// Fail every fallible call whose size argument is above this many bytes. 0 = off.
  std::size_t fail_above_bytes = 0;
  /// Fail each fallible call with this probability, drawn from a generator seeded with `seed`
  /// (one draw per fallible call, so a seed always fails the same calls of the same sequence).
  double fail_probability = 0.0;
  std::uint64_t seed = 0;

  /// True when any rule is on. Never throws.
  bool enabled() const noexcept {
    return fail_nth_call != 0 || fail_above_bytes != 0 || fail_probability > 0.0;
  }
};

namespace detail {

/// The fault-injection rules in action, shared by the simulated device and the simulated host
/// device: counts fallible calls and decides which fail. Not thread-safe: its owner's lock guards
/// it.
class fault_injector {
 public:
  /// Throws std::invalid_argument (naming `who`) for a probability outside [0, 1].
  fault_injector(const fault_injection& rules, const char* who) { set(rules, who); }

  /// Replaces the rules, restarts the count of fallible calls and reseeds the generator. Throws
  /// std::invalid_argument for a probability outside [0, 1] (rules unchanged).
  void set(const fault_injection& rules, const char* who) {
    if (!(rules.fail_probability >= 0.0 && rules.fail_probability <= 1.0)) {
      throw std::invalid_argument(
          fmt::format("{}: fail_probability {} is outside [0, 1]", who, rules.fail_probability));
    }
    rules_ = rules;
    fallible_calls_ = 0;
    rng_state_ = rules.seed;
  }

  /// Counts one fallible call of `bytes` and decides whether it fails.
  bool should_fail(std::size_t bytes) noexcept {
    ++fallible_calls_;
    bool fault = false;
    if (rules_.fail_probability > 0.0) fault = next_random() < rules_.fail_probability;
    if (rules_.fail_nth_call != 0 && fallible_calls_ == rules_.fail_nth_call) fault = true;
    if (rules_.fail_above_bytes != 0 && bytes > rules_.fail_above_bytes) fault = true;
    if (fault) ++injected_;
    return fault;
  }

  const fault_injection& rules() const noexcept { return rules_; }
  std::size_t fallible_calls() const noexcept { return fallible_calls_; }
  std::size_t injected() const noexcept { return injected_; }
  void reset_injected() noexcept { injected_ = 0; }

 private:
  // splitmix64: one draw per fallible call, the same sequence on every platform for a seed.
  double next_random() noexcept {
    std::uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  }

  fault_injection rules_;
  std::size_t fallible_calls_ = 0;
  std::size_t injected_ = 0;
  std::uint64_t rng_state_ = 0;
};

/// The fault injection and out-of-memory accounting of a simulated device, and the public calls
/// that read and set it; simulated_device and simulated_host_device derive from it. `mutex_`
/// guards this state and the whole of the deriving device's own.
class simulated_fault_state {
 public:
  /// The fault injection in force. Thread-safe; never throws.
  fault_injection faults() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return faults_.rules();
  }

  /// Replaces the fault injection, restarts the count of fallible calls (fail_nth_call counts
  /// from here) and reseeds the generator. Thread-safe. Throws std::invalid_argument for a
  /// probability outside [0, 1] (faults unchanged).
  void set_faults(const fault_injection& faults) {
    std::lock_guard<std::mutex> lock(mutex_);
    faults_.set(faults, who_);
  }

  /// Fallible calls (those the device's class comment names) accepted since construction or the
  /// last set_faults(). Thread-safe; never throws.
  std::size_t fallible_calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return faults_.fallible_calls();
  }

  /// Calls failed by fault injection since construction or reset_counters(). Thread-safe; never
  /// throws.
  std::size_t injected_faults() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return faults_.injected();
  }

  /// Calls that failed because the capacity (or the address space or system memory behind it)
  /// was exhausted, injected faults excluded, since construction or reset_counters().
  /// Thread-safe; never throws.
  std::size_t out_of_memory_failures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return out_of_memory_failures_;
  }

 protected:
  /// Throws std::invalid_argument (naming `who`, which must outlive this object) for a
  /// probability outside [0, 1].
  simulated_fault_state(const fault_injection& rules, const char* who)
      : faults_(rules, who), who_(who) {}
  ~simulated_fault_state() = default;
  simulated_fault_state(const simulated_fault_state&) = delete;
  simulated_fault_state& operator=(const simulated_fault_state&) = delete;

  /// Zeroes the injected-fault and out-of-memory counts. Call with mutex_ held.
  void reset_fault_counts_locked() noexcept {
    faults_.reset_injected();
    out_of_memory_failures_ = 0;
  }

  mutable std::mutex mutex_;
  fault_injector faults_;
  std::size_t out_of_memory_failures_ = 0;

 private:
  const char* who_;
};

}  // namespace detail

}  // namespace gpumem
