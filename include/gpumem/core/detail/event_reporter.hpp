// gpumem — the caching allocator's event plumbing: the observer (set_event_observer), the
// exception an observer throws, kept until the allocator is consistent again, and under
// set_reserved_events the reserved view, computed by diffing what reserved memory counts at the
// end of each operation. caching_allocator says what happened; this component tells the observer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "gpumem/core/allocator_events.hpp"

namespace gpumem::detail {

/// What changed between two reserved_ranges() lists, as segment events given to
/// emit(action, address, size, stream): the memory given back first, then the memory obtained. A
/// classic segment (is_expandable false) comes or goes whole (segment_alloc / segment_free); the
/// parts of VMM ranges are compared as address intervals (segment_map / segment_unmap of what
/// differs).
template <class Stream, class Emit>
void diff_reserved_ranges(const std::vector<reserved_range<Stream>>& before,
                          const std::vector<reserved_range<Stream>>& after, Emit&& emit) {
  using range = reserved_range<Stream>;
  auto by_address = [](const range* a, const range* b) { return a->address < b->address; };
  std::vector<const range*> a;
  std::vector<const range*> b;
  for (const range& r : before) a.push_back(&r);
  for (const range& r : after) b.push_back(&r);
  std::sort(a.begin(), a.end(), by_address);
  std::sort(b.begin(), b.end(), by_address);
  // The parts of each range of `from` that no range of `other` covers (VMM), or the ranges that
  // `other` does not have exactly (classic).
  auto missing = [&emit](const std::vector<const range*>& from,
                         const std::vector<const range*>& other, allocator_action whole,
                         allocator_action part) {
    std::size_t j = 0;
    for (const range* r : from) {
      while (j < other.size() && other[j]->address + other[j]->size <= r->address) ++j;
      if (!r->is_expandable) {
        bool same = false;
        for (std::size_t k = j; k < other.size() && other[k]->address <= r->address; ++k) {
          if (other[k]->address == r->address && other[k]->size == r->size &&
              !other[k]->is_expandable) {
            same = true;
          }
        }
        if (!same) emit(whole, r->address, r->size, r->stream);
        continue;
      }
      std::uintptr_t at = r->address;
      const std::uintptr_t end = r->address + r->size;
      for (std::size_t k = j; k < other.size() && other[k]->address < end && at < end; ++k) {
        const range* o = other[k];
        if (o->address + o->size <= at) continue;
        if (o->address > at) emit(part, at, o->address - at, r->stream);
        at = std::max(at, o->address + o->size);
      }
      if (at < end) emit(part, at, end - at, r->stream);
    }
  };
  missing(a, b, allocator_action::segment_free, allocator_action::segment_unmap);
  missing(b, a, allocator_action::segment_alloc, allocator_action::segment_map);
}

template <class Stream>
class event_reporter {
 public:
  using observer = std::function<void(const allocator_event<Stream>&)>;

  /// Whether anyone listens: every call below is for when this is true (the hot path tests it
  /// and skips building an event).
  bool listening() const noexcept { return static_cast<bool>(observer_); }

  void set_observer(observer o) { observer_ = std::move(o); }

  /// Starts (or stops) the reserved view from the memory counted now, `counted` (no event for it).
  void set_reserved_events(bool on, std::vector<reserved_range<Stream>> counted) {
    reserved_events_ = on;
    reported_.clear();
    if (on) reported_ = std::move(counted);
  }

  /// Tells the observer; an exception it throws is kept (the first one) for rethrow. A segment
  /// event of view `both` is a device call only while the reserved view is reported apart.
  void notify(allocator_action action, std::uintptr_t address, std::size_t size, Stream stream,
              segment_view view = segment_view::both) const {
    if (view == segment_view::both && reserved_events_ && is_segment_action(action)) {
      view = segment_view::device;  // the reserved view comes from report_reserved_changes
    }
    try {
      observer_(allocator_event<Stream>{action, address, size, stream, view});
    } catch (...) {
      if (!error_) error_ = std::current_exception();
    }
  }

  /// Under the reserved view: what reserved memory counts now (`counted()`, the allocator's
  /// reserved_ranges) and did not at the last report, and the reverse, as segment events of view
  /// `reserved`. At the end of every operation that may have changed it. O(segments + pages).
  template <class Counted>
  void report_reserved_changes(Counted&& counted) {
    if (!reserved_events_ || !observer_) return;
    std::vector<reserved_range<Stream>> now = counted();
    diff_reserved_ranges(
        reported_, now,
        [this](allocator_action a, std::uintptr_t address, std::size_t size, Stream stream) {
          notify(a, address, size, stream, segment_view::reserved);
        });
    reported_ = std::move(now);
  }

  /// An observer threw during the current operation.
  bool failed() const noexcept { return static_cast<bool>(error_); }
  /// Forgets an observer's exception: at the start of an operation, or when another error (out
  /// of memory) is the one the caller must see.
  void clear_error() const noexcept { error_ = nullptr; }
  /// Rethrows the observer's exception, if any, once the allocator is consistent.
  void rethrow_error() {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  static bool is_segment_action(allocator_action a) noexcept {
    return a == allocator_action::segment_alloc || a == allocator_action::segment_free ||
           a == allocator_action::segment_map || a == allocator_action::segment_unmap;
  }

  observer observer_;             // empty: nobody listens
  bool reserved_events_ = false;  // set_reserved_events (the allocator turns it on under stitch)
  std::vector<reserved_range<Stream>> reported_;  // what the last report counted
  mutable std::exception_ptr error_;              // the first exception an observer threw
};

}  // namespace gpumem::detail
