// gpumem CUDA simulator — happens-before between streams and the host (included by simulator.hpp).
//
// Every stream numbers the work it runs (1, 2, ...). A vector clock maps streams to the last work
// of each that is known to come before some point: a stream's clock is what its next work will
// wait for (its own earlier work, the events it waited on, the legacy default stream's ordering),
// an event's clock is its stream's clock when it was recorded, and the host's clock is all the
// work the host has seen complete (synchronisations, successful queries). Work w1 on stream A
// happens before work w2 iff w2's clock holds an entry for A at or above w1's number.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpumem::cudasim {

/// A stream's process-wide id: never reused, also for streams of other devices.
using stream_id = std::uint64_t;

/// A vector clock: stream -> number of the last work known to come before. Sorted by stream.
class vclock {
 public:
  /// The entry for `s` (0: no work of `s` comes before). Never throws.
  std::uint64_t get(stream_id s) const noexcept {
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), s,
                                     [](const entry& e, stream_id id) { return e.first < id; });
    return it != entries_.end() && it->first == s ? it->second : 0;
  }

  /// Raises the entry for `s` to at least `n`.
  void raise(stream_id s, std::uint64_t n) {
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), s,
                                     [](const entry& e, stream_id id) { return e.first < id; });
    if (it != entries_.end() && it->first == s) {
      it->second = std::max(it->second, n);
    } else {
      entries_.insert(it, entry{s, n});
    }
  }

  /// Raises every entry to at least `other`'s (the join of the two clocks).
  void join(const vclock& other) {
    if (other.entries_.empty()) return;
    std::vector<entry> merged;
    merged.reserve(entries_.size() + other.entries_.size());
    auto a = entries_.begin();
    auto b = other.entries_.begin();
    while (a != entries_.end() || b != other.entries_.end()) {
      if (b == other.entries_.end() || (a != entries_.end() && a->first < b->first)) {
        merged.push_back(*a++);
      } else if (a == entries_.end() || b->first < a->first) {
        merged.push_back(*b++);
      } else {
        merged.push_back(entry{a->first, std::max(a->second, b->second)});
        ++a;
        ++b;
      }
    }
    entries_ = std::move(merged);
  }

 private:
  using entry = std::pair<stream_id, std::uint64_t>;
  std::vector<entry> entries_;
};

/// Bytes [begin, end) that one work reads or writes.
struct touched_range {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool write = false;
  /// The device whose access rights the bytes need: the device that runs a kernel; -1 for a copy
  /// or fill, which the driver performs on behalf of the memory's own device (no peer access
  /// needed, but the owner itself must have access).
  int accessor = -1;
};

/// True when [a, b) and [c, d) share a byte. Never throws.
inline bool overlaps(std::uintptr_t a, std::uintptr_t b, std::uintptr_t c,
                     std::uintptr_t d) noexcept {
  return a < d && c < b;
}

}  // namespace gpumem::cudasim
