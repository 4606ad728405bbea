// gpumem — recording_allocator: wraps any gpumem allocator and records what the program asks of
// it as a trace, so that any program using gpumem can hand its workload to gpumem-replay.
//
// The recorder holds its own lock across the allocator call and the append, so the trace's order
// is the order in which the allocator saw the calls (a free always comes before the allocation
// that reuses its address), whatever the number of threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <new>
#include <ostream>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"

namespace gpumem {

namespace detail {

/// A stream's id in a trace: the simulated device's id, a CUDA stream's handle value, an integer.
template <class Stream>
std::uint64_t trace_stream_id(const Stream& s) noexcept {
  if constexpr (std::is_pointer_v<Stream>) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s));
  } else if constexpr (std::is_integral_v<Stream>) {
    return static_cast<std::uint64_t>(s);
  } else {
    return static_cast<std::uint64_t>(s.id);
  }
}

}  // namespace detail

/// Forwards allocate / deallocate / record_stream to `Allocator` and records each call.
///
/// Two ways to keep the trace: in memory (trace(), take_trace(); the history for
/// write_pytorch_snapshot), or streamed to an std::ostream in the native format as it grows (for
/// long runs: memory stays flat; the stream must outlive the recorder, which finishes the file in
/// its destructor or in flush(); an out-of-memory becomes a comment line there). Times are
/// microseconds since the recorder was made.
template <class Allocator>
class recording_allocator {
 public:
  using allocator_type = Allocator;
  using stream_type = typename Allocator::stream_type;

  /// Records into memory.
  explicit recording_allocator(Allocator& allocator) : allocator_(allocator) {
    trace_.source = "gpumem recording_allocator";
  }

  /// Streams the native format to `sink` (header now, events in batches).
  recording_allocator(Allocator& allocator, std::ostream& sink)
      : allocator_(allocator), sink_(&sink) {
    trace_.source = "gpumem recording_allocator";
    allocation_trace header = trace_;
    write_native_trace(*sink_, header);
  }

  recording_allocator(const recording_allocator&) = delete;
  recording_allocator& operator=(const recording_allocator&) = delete;

  /// Writes what is still buffered (streaming mode). Never throws.
  ~recording_allocator() {
    try {
      flush();
    } catch (...) {
      // A destructor must not throw; the stream's state tells the caller.
    }
  }

  /// Allocates through the allocator and records it. An out_of_memory is recorded as the
  /// trace's recorded_oom_event (the first one) and rethrown; other errors are not recorded.
  void* allocate(std::size_t size, stream_type stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    try {
      p = allocator_.allocate(size, stream);
    } catch (const std::bad_alloc&) {
      if (!trace_.recorded_oom_event) trace_.recorded_oom_event = written_ + trace_.events.size();
      if (sink_ != nullptr) {  // the header is written already: say it where it happened
        write_buffered();
        *sink_ << "# out of memory here: a request of " << size << " bytes failed\n";
      }
      throw;
    }
    if (p != nullptr) {
      sizes_[reinterpret_cast<std::uintptr_t>(p)] = size;
      append({trace_event_kind::alloc, reinterpret_cast<std::uintptr_t>(p), size,
              detail::trace_stream_id(stream), now()});
    }
    return p;
  }

  /// Allocates on the default stream (stream 0 in the trace).
  void* allocate(std::size_t size) { return allocate(size, stream_type{}); }

  /// Frees through the allocator, recorded as free_requested with the block's requested size (the
  /// replay returns the block at once; the allocator under test decides when it can really be
  /// reused).
  void deallocate(void* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    allocator_.deallocate(p);  // first: a foreign pointer throws and is not recorded
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::uint64_t size = 0;
    if (auto it = sizes_.find(address); it != sizes_.end()) {
      size = it->second;
      sizes_.erase(it);
    }
    append({trace_event_kind::free_requested, address, size, 0, now()});
  }

  /// record_stream through the allocator, recorded.
  void record_stream(void* p, stream_type stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    allocator_.record_stream(p, stream);
    append({trace_event_kind::record_stream, reinterpret_cast<std::uintptr_t>(p), 0,
            detail::trace_stream_id(stream), now()});
  }

  /// The wrapped allocator (calls made on it directly are not recorded).
  Allocator& allocator() noexcept { return allocator_; }

  /// The trace so far (in-memory mode; in streaming mode only what is not yet written).
  allocation_trace trace() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return trace_;
  }

  /// Hands the trace over and starts an empty one. In-memory mode.
  allocation_trace take_trace() {
    std::lock_guard<std::mutex> lock(mutex_);
    allocation_trace out = std::move(trace_);
    trace_ = allocation_trace{};
    trace_.source = out.source;
    return out;
  }

  /// Streaming mode: writes the buffered events and flushes the stream. No-op in memory mode.
  void flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    write_buffered();
    if (sink_ != nullptr) sink_->flush();
  }

 private:
  std::int64_t now() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                 start_)
        .count();
  }

  void append(const trace_event& e) {
    trace_.events.push_back(e);
    if (sink_ != nullptr && trace_.events.size() >= batch) write_buffered();
  }

  void write_buffered() {
    if (sink_ == nullptr || trace_.events.empty()) return;
    fmt::memory_buffer buf;
    for (const trace_event& e : trace_.events) {
      fmt::format_to(std::back_inserter(buf), "{} 0x{:x} {} {} {}\n", to_string(e.kind), e.address,
                     e.size, e.stream, e.time_us);
    }
    sink_->write(buf.data(), static_cast<std::streamsize>(buf.size()));
    written_ += trace_.events.size();
    trace_.events.clear();
  }

  static constexpr std::size_t batch = 4096;

  Allocator& allocator_;
  std::ostream* sink_ = nullptr;
  mutable std::mutex mutex_;
  allocation_trace trace_;
  std::unordered_map<std::uint64_t, std::uint64_t> sizes_;  // live blocks' requested sizes
  std::size_t written_ = 0;                                 // events already streamed to sink_
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace gpumem
