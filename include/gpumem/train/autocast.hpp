// gpumem — autocast (automatic mixed precision) for the LibTorch C++ frontend: a scoped guard, the
// C++ counterpart of Python's `with torch.autocast(device_type, dtype):`, and the thread's autocast
// state as a value that can be captured and put back (what checkpoint() does for its
// recomputation).
//
//   {
//     gpumem::train::autocast_guard amp(torch::kCUDA, torch::kHalf);   // or (torch::kCPU,
//     kBFloat16) loss = loss_fn(model->forward(x), y);                            // matmuls in
//     float16
//   }
//   loss.backward();                                                   // outside, as in PyTorch
//
// Autocast is per thread: the enabled flag and the lower-precision dtype of each device type, and
// whether casts of leaf tensors (weights) are cached. Entering a guard counts one nesting level;
// leaving the outermost level empties the cast cache, as torch.autocast does.
//
// Thread safety: everything here reads or sets the calling thread's state only.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <array>
#include <cstddef>
#include <optional>

namespace gpumem::train {

/// The calling thread's autocast state: per device type (CPU, CUDA and every other type autocast
/// supports) whether autocast is on and its dtype, and whether the cast cache is enabled.
struct autocast_state {
  struct device_entry {
    c10::DeviceType type = c10::DeviceType::CPU;
    bool enabled = false;
    at::ScalarType dtype = at::kFloat;
  };
  std::array<device_entry, at::autocast::_AUTOCAST_SUPPORTED_DEVICES.size()> devices{};
  bool cache_enabled = true;

  /// The calling thread's state now.
  static autocast_state capture() {
    autocast_state s;
    for (std::size_t i = 0; i < s.devices.size(); ++i) {
      const c10::DeviceType type = at::autocast::_AUTOCAST_SUPPORTED_DEVICES[i];
      s.devices[i] = {type, at::autocast::is_autocast_enabled(type),
                      at::autocast::get_autocast_dtype(type)};
    }
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
  }

  /// Makes this the calling thread's state (the cast cache and the nesting level are untouched).
  void apply() const {
    for (const device_entry& d : devices) {
      at::autocast::set_autocast_dtype(d.type, d.dtype);
      at::autocast::set_autocast_enabled(d.type, d.enabled);
    }
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }

  bool enabled(c10::DeviceType type) const noexcept {
    for (const device_entry& d : devices) {
      if (d.type == type) return d.enabled;
    }
    return false;
  }
  at::ScalarType dtype(c10::DeviceType type) const noexcept {
    for (const device_entry& d : devices) {
      if (d.type == type) return d.dtype;
    }
    return at::kFloat;
  }
};

/// Puts an autocast state in place for a scope and the previous one back at its end, counting a
/// nesting level: leaving the outermost one empties the cast cache (torch.autocast's rule).
class scoped_autocast_state {
 public:
  explicit scoped_autocast_state(const autocast_state& state)
      : previous_(autocast_state::capture()) {
    state.apply();
    at::autocast::increment_nesting();
  }
  ~scoped_autocast_state() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    previous_.apply();
  }
  scoped_autocast_state(const scoped_autocast_state&) = delete;
  scoped_autocast_state& operator=(const scoped_autocast_state&) = delete;

 private:
  autocast_state previous_;
};

/// `with torch.autocast(device_type, dtype, enabled, cache_enabled):` for C++. The dtype defaults
/// to the device type's current autocast dtype (float16 for CUDA, bfloat16 for CPU unless changed),
/// cache_enabled to the current setting. Other device types keep their state. Throws c10::Error
/// for a device type autocast does not support (PyTorch's message).
class autocast_guard {
 public:
  explicit autocast_guard(c10::DeviceType device_type,
                          std::optional<at::ScalarType> dtype = std::nullopt, bool enabled = true,
                          std::optional<bool> cache_enabled = std::nullopt)
      : scope_(make_state(device_type, dtype, enabled, cache_enabled)) {}

 private:
  static autocast_state make_state(c10::DeviceType device_type, std::optional<at::ScalarType> dtype,
                                   bool enabled, std::optional<bool> cache_enabled) {
    TORCH_CHECK(at::autocast::is_autocast_available(device_type),
                "gpumem::train::autocast_guard: autocast does not support device type ",
                device_type);
    autocast_state s = autocast_state::capture();
    for (autocast_state::device_entry& d : s.devices) {
      if (d.type != device_type) continue;
      d.enabled = enabled;
      if (dtype) d.dtype = *dtype;
    }
    if (cache_enabled) s.cache_enabled = *cache_enabled;
    return s;
  }

  scoped_autocast_state scope_;
};

}  // namespace gpumem::train
