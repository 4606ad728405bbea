// gpumem — the stream-event queue shared by caching_allocator and pinned_pool.
//
// Memory freed while streams may still use it waits on one event per stream (PyTorch's
// record_stream / record_event). The queue keeps those events per stream in recording order (work
// on one stream completes in order, so the first incomplete event ends that stream's scan) and
// recycles completed events per device. It knows nothing of blocks: each event carries an owner
// (a block pointer) handed back to the caller when the event is retired; the caller counts its
// owner's outstanding events.
//
// Exception safety: every member leaves the queue consistent when a device call throws. An event
// is removed from its queue before its owner is handed back, so an exception never retires one
// twice, and empty stream queues are never kept.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

#include "gpumem/device/device.hpp"

namespace gpumem::detail {

/// Device: create_event, record_event, query_event, synchronize_event, destroy_event, and
/// optionally stream_device / create_event_for (has_stream_device_v). Owner: a pointer or handle.
template <class Device, class Owner>
class stream_event_queue {
 public:
  using stream_type = typename Device::stream_type;
  using event_type = typename Device::event_type;

  /// `default_device`: the GPU events are created on when the device cannot tell a stream's.
  stream_event_queue(Device& device, int default_device) noexcept
      : device_(device), default_device_(default_device) {}

  stream_event_queue(const stream_event_queue&) = delete;
  stream_event_queue& operator=(const stream_event_queue&) = delete;

  /// Records an event on `stream` for `owner`, created on the stream's device (or reused from a
  /// completed one). Throws what the device throws, with nothing queued.
  void record(stream_type stream, Owner owner) {
    const int device = device_of(stream);
    const event_type e = take_event(stream, device);
    try {
      device_.record_event(e, stream);
      queue_for(stream).push_back(pending{e, owner, device});
    } catch (...) {
      recycle(device, e);
      drop_empty_queues();
      throw;
    }
  }

  /// Takes back the newest event recorded on `stream` (it must have one), for callers that record
  /// several events all or nothing. Never throws.
  void unrecord_newest(stream_type stream) noexcept {
    for (auto& [s, queue] : queues_) {
      if (s == stream && !queue.empty()) {
        recycle(queue.back().device, queue.back().event);
        queue.pop_back();
        break;
      }
    }
    drop_empty_queues();
  }

  /// Per stream, retires completed events in recording order, calling on_retired(owner) for each
  /// (after the event has left the queue). Throws what query_event or on_retired throws.
  template <class F>
  void retire_completed(F&& on_retired) {
    scan([this](const pending& p) { return device_.query_event(p.event); }, on_retired);
  }

  /// Waits for every event and retires it (PyTorch's synchronize_and_free_events). Throws what
  /// synchronize_event or on_retired throws; the events not yet retired stay queued.
  template <class F>
  void retire_all(F&& on_retired) {
    scan(
        [this](const pending& p) {
          device_.synchronize_event(p.event);
          return true;
        },
        on_retired);
  }

  bool empty() const noexcept { return queues_.empty(); }

  /// Events queued, over all streams.
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (const auto& entry : queues_) n += entry.second.size();
    return n;
  }

  /// f(owner) for every queued event; for invariant checks and reports.
  template <class F>
  void for_each_owner(F&& f) const {
    for (const auto& entry : queues_) {
      for (const pending& p : entry.second) f(p.owner);
    }
  }

  /// Destroys every event, queued or recycled, without waiting (`wait`: synchronise each queued
  /// event first). For destructors: failures are swallowed. Never throws.
  void destroy_all(bool wait) noexcept {
    for (auto& entry : queues_) {
      for (const pending& p : entry.second) {
        if (wait) swallow([&] { device_.synchronize_event(p.event); });
        swallow([&] { device_.destroy_event(p.event); });
      }
    }
    queues_.clear();
    for (const auto& entry : free_) swallow([&] { device_.destroy_event(entry.second); });
    free_.clear();
  }

 private:
  struct pending {
    event_type event;
    Owner owner;
    int device;  // the event's device: its stream's
  };

  template <class F>
  static void swallow(F&& f) noexcept {
    try {
      f();
    } catch (...) {
    }
  }

  int device_of(stream_type stream) const {
    if constexpr (has_stream_device_v<Device>) {
      return device_.stream_device(stream);
    } else {
      (void)stream;
      return default_device_;
    }
  }

  event_type take_event(stream_type stream, int device) {
    for (std::size_t i = free_.size(); i-- > 0;) {
      if (free_[i].first == device) {
        const event_type e = free_[i].second;
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return e;
      }
    }
    if constexpr (has_stream_device_v<Device>) {
      return device_.create_event_for(stream);
    } else {
      (void)stream;
      return device_.create_event();
    }
  }

  // Keeps a completed event for reuse; destroys it when it cannot be kept (out of host memory).
  void recycle(int device, event_type e) noexcept {
    try {
      free_.emplace_back(device, e);
    } catch (...) {
      swallow([&] { device_.destroy_event(e); });
    }
  }

  std::deque<pending>& queue_for(stream_type stream) {
    for (auto& [s, queue] : queues_) {
      if (s == stream) return queue;
    }
    queues_.emplace_back(stream, std::deque<pending>{});
    return queues_.back().second;
  }

  void drop_empty_queues() noexcept {
    queues_.erase(std::remove_if(queues_.begin(), queues_.end(),
                                 [](const auto& entry) { return entry.second.empty(); }),
                  queues_.end());
  }

  // Retires, per stream in order, the events `done` says are complete; stops a stream at the
  // first that is not.
  template <class Done, class F>
  void scan(Done&& done, F& on_retired) {
    try {
      for (auto& entry : queues_) {
        auto& queue = entry.second;
        while (!queue.empty()) {
          const pending p = queue.front();
          if (!done(p)) break;
          queue.pop_front();
          recycle(p.device, p.event);
          on_retired(p.owner);
        }
      }
    } catch (...) {
      drop_empty_queues();
      throw;
    }
    drop_empty_queues();
  }

  Device& device_;
  int default_device_;
  std::vector<std::pair<stream_type, std::deque<pending>>> queues_;
  std::vector<std::pair<int, event_type>> free_;  // completed events, per device, for reuse
};

}  // namespace gpumem::detail
