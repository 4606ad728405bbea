// gpumem — records the allocation trace of a LibTorch program on the CPU, so that its memory on a
// GPU can be predicted without one: gpumem-replay replays the trace on a simulated GPU under any
// allocator (README.md, "Reproducing an out-of-memory").
//
//   gpumem::torch::cpu_trace_recorder recorder;   // from now on, every CPU tensor allocation
//   train_step();
//   gpumem::write_native_trace(file, recorder.stop());
//
// While it is active the recorder is LibTorch's CPU allocator: it forwards every request to the
// allocator it replaced and appends an alloc event (address, bytes) and, when the storage is
// released, free_requested and free_completed events, all on stream 0. A CPU allocation stands
// for the device allocation the same program makes on a GPU (the same tensors, the same order);
// what runs only on a GPU (cuBLAS workspaces, NCCL buffers) is not in the trace.
//
// Thread safety: allocations from any thread are recorded, in the order they happen. One recorder
// at a time; storages still alive when it stops are freed later into the allocator they came
// from, unrecorded. Errors: std::logic_error when a recorder is already active.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "gpumem/trace/event.hpp"

namespace gpumem::torch {

/// LibTorch's CPU allocator, recording; see the top of this file.
class cpu_trace_recorder final : public c10::Allocator {
 public:
  cpu_trace_recorder() : state_(std::make_shared<shared_state>()) {
    base_ = c10::GetAllocator(c10::DeviceType::CPU);
    if (dynamic_cast<cpu_trace_recorder*>(base_) != nullptr) {
      throw std::logic_error("gpumem::torch::cpu_trace_recorder: a recorder is already active");
    }
    state_->trace.source = "gpumem::torch::cpu_trace_recorder";
    c10::SetAllocator(c10::DeviceType::CPU, this, kPriority);
  }

  cpu_trace_recorder(const cpu_trace_recorder&) = delete;
  cpu_trace_recorder& operator=(const cpu_trace_recorder&) = delete;

  ~cpu_trace_recorder() override { stop(); }

  /// Puts the replaced allocator back and returns the trace (once; later calls return an empty
  /// trace). Storages allocated while recording stay valid.
  allocation_trace stop() {
    if (!active_.exchange(false)) return {};
    c10::SetAllocator(c10::DeviceType::CPU, base_, kPriority);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->recording = false;
    return std::move(state_->trace);
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    if (n == 0 || inner.get() == nullptr) return inner;
    void* data = inner.get();
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->recording) {
        state_->trace.events.push_back(
            {trace_event_kind::alloc, reinterpret_cast<std::uintptr_t>(data), n, 0, no_time});
      }
    }
    storages& live = live_storages();
    {
      std::lock_guard<std::mutex> lock(live.mutex);
      live.by_address[data] = held_storage{std::move(inner), state_, n};
    }
    // A simple DataPtr (context == data), so that raw_allocate / raw_deallocate work too.
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  // Above LibTorch's own registrations (priority 0), so the recorder wins while it is active.
  static constexpr std::uint8_t kPriority = 100;

  struct shared_state {
    std::mutex mutex;
    bool recording = true;
    allocation_trace trace;
  };

  // What a recorded storage owns: the replaced allocator's DataPtr, and the trace it goes to.
  struct held_storage {
    c10::DataPtr inner;
    std::shared_ptr<shared_state> state;
    std::size_t bytes = 0;
  };

  // Every recorded storage still alive, by address; it may outlive its recorder. Never destroyed
  // (storages can be freed during exit).
  struct storages {
    std::mutex mutex;
    std::unordered_map<void*, held_storage> by_address;
  };
  static storages& live_storages() {
    static auto* live = new storages;
    return *live;
  }

  static void release(void* data) {
    held_storage held;
    {
      storages& live = live_storages();
      std::lock_guard<std::mutex> lock(live.mutex);
      auto it = live.by_address.find(data);
      if (it == live.by_address.end()) return;  // not ours: nothing to do
      held = std::move(it->second);
      live.by_address.erase(it);
    }
    {
      std::lock_guard<std::mutex> lock(held.state->mutex);
      if (held.state->recording) {
        const auto address = reinterpret_cast<std::uintptr_t>(data);
        auto& events = held.state->trace.events;
        events.push_back({trace_event_kind::free_requested, address, held.bytes, 0, no_time});
        events.push_back({trace_event_kind::free_completed, address, held.bytes, 0, no_time});
      }
    }
    held.inner.clear();  // frees into the replaced allocator
  }

  c10::Allocator* base_ = nullptr;
  std::shared_ptr<shared_state> state_;
  std::atomic<bool> active_{true};
};

}  // namespace gpumem::torch
