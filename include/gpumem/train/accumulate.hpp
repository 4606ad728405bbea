// gpumem — gradient accumulation over K micro-batches for the LibTorch C++ frontend, with a
// dynamic loss scaler (AMP's GradScaler) and a communicator that averages the gradients across
// ranks only in the last micro-batch of each window (the C++ counterpart of DDP's no_sync()),
// overlapped with its backward.
//
//   gpumem::train::gradient_accumulator acc(optimizer, {/*steps=*/4, /*max_grad_norm=*/1.0});
//   for (auto& batch : loader) acc.backward(loss_fn(model->forward(batch.data), batch.target));
//
// Each backward() runs loss / K backward; every K-th call closes the window, in this order:
//   1. the communicator (if any, with 2+ ranks) averages the gradients across ranks, over flat
//      buckets of at most bucket_bytes per dtype and device, made in reverse order of the
//      parameters (the order backward finalises them). With `overlap` (the default) each bucket
//      is launched from backward itself, as soon as the last of its gradients is final (a hook on
//      each parameter's gradient accumulator, as DDP's reducer), on a communication stream of its
//      device ordered after the gradients' stream; buckets go in the same order on every rank.
//      The K-1 micro-batches before never communicate. Without overlap, or for parameters whose
//      gradient backward did not produce, the buckets are averaged after backward;
//   2. the loss scaler (if any) unscales the gradients and checks them for inf/NaN, on the device
//      (fused kernels, no host read);
//   3. gradients are clipped to max_grad_norm (if > 0), on their true, unscaled values, on the
//      device (the total norm is never read to the host);
//   4. the inf/NaN flag is read: the step's one host synchronisation (none without a scaler); the
//      optimizer steps unless it is set;
//   5. the loss scaler updates its scale on the device (backs off after inf/NaN, grows after
//      growth_interval clean steps);
//   6. the gradients are zeroed.
// This is GradScaler's documented order (unscale, clip, step, update). K micro-batches of size B
// give the gradients of one batch of size K x B (for losses that are means over the batch),
// within floating-point tolerance.
//
// The buckets' flat buffers are allocated once, at the first boundary, with the tensors' own
// allocator: gpumem's when gpumem is PyTorch's CUDA allocator (they then show in its statistics);
// each is marked as used on the communication stream (record_stream).
//
// Thread safety: one accumulator per training loop (rank). Not copyable or movable (backward
// hooks refer to it). Errors: std::invalid_argument for bad options; what the communicator throws
// propagates out of backward() with the gradients of the window intact and the optimizer not
// stepped (with overlap, backward runs to its end first and no later bucket is launched);
// std::logic_error when, with overlap, a parameter's gradient is accumulated again after its
// bucket was launched (a parameter used both inside and outside a re-entrant checkpoint): use
// overlap = false for such models.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/train/communicator.hpp"

namespace gpumem::train {

/// AMP's GradScaler for the C++ frontend: multiplies the loss by a scale, divides the gradients
/// by it before the step, skips steps whose gradients overflowed and adapts the scale.
///
/// The scale and its growth counter live in one-element tensors on the device of the first loss
/// scaled (or of the first gradient unscaled), and everything per step runs there with PyTorch's
/// fused kernels, as torch.amp.GradScaler does: unscale_() divides and checks all gradients with
/// at::_amp_foreach_non_finite_check_and_unscale_ (one launch per device and dtype) and returns
/// the inf/NaN flag as a tensor; update() adapts the scale with at::_amp_update_scale_. Neither
/// reads anything to the host: a training step reads one flag (gradient_accumulator does, to
/// decide whether to step). scale() as a double reads the scale to the host (a synchronisation on
/// a GPU); the training loop never calls it.
class dynamic_loss_scaler {
 public:
  /// Throws std::invalid_argument unless init_scale > 0, growth_factor > 1,
  /// 0 < backoff_factor < 1 and growth_interval >= 1.
  explicit dynamic_loss_scaler(double init_scale = 65536.0, double growth_factor = 2.0,
                               double backoff_factor = 0.5, int growth_interval = 2000)
      : init_scale_(init_scale),
        growth_factor_(growth_factor),
        backoff_factor_(backoff_factor),
        growth_interval_(growth_interval) {
    if (!(init_scale > 0) || !(growth_factor > 1) || !(backoff_factor > 0 && backoff_factor < 1) ||
        growth_interval < 1) {
      throw std::invalid_argument(
          "gpumem::train::dynamic_loss_scaler: need init_scale > 0, growth_factor > 1, "
          "0 < backoff_factor < 1 and growth_interval >= 1");
    }
  }

  /// The current scale, read from its tensor: a host synchronisation when it lives on a GPU.
  double scale() const { return scale_.defined() ? scale_.item<double>() : init_scale_; }
  /// The scale as a one-element float32 tensor (undefined before the first use).
  const ::torch::Tensor& scale_tensor() const noexcept { return scale_; }

  /// loss times the scale (on the loss's device; float32, shape {1}, as GradScaler's).
  ::torch::Tensor scale(const ::torch::Tensor& loss) {
    ensure_state(loss.device());
    return loss * scale_.to(loss.device(), /*non_blocking=*/true);
  }

  /// Divides every defined gradient by the scale and checks them all for inf/NaN on their devices,
  /// without reading anything to the host. Returns the flag: a one-element float32 tensor on the
  /// scale's device, 0 when every gradient is finite (undefined when no gradient is defined).
  /// Throws std::invalid_argument for a sparse gradient.
  ::torch::Tensor unscale_(const std::vector<::torch::Tensor>& params) {
    ::torch::NoGradGuard no_grad;
    // Gradients by device, then dtype (the fused kernel takes one device and dtype at a time).
    struct group {
      c10::Device device;
      std::vector<std::pair<at::ScalarType, std::vector<::torch::Tensor>>> by_dtype;
    };
    std::vector<group> groups;
    for (const ::torch::Tensor& p : params) {
      const ::torch::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (g.is_sparse()) {
        throw std::invalid_argument(
            "gpumem::train::dynamic_loss_scaler: sparse gradients are not supported");
      }
      group* target = nullptr;
      for (group& gr : groups) {
        if (gr.device == g.device()) target = &gr;
      }
      if (target == nullptr) target = &groups.emplace_back(group{g.device(), {}});
      std::vector<::torch::Tensor>* list = nullptr;
      for (auto& [dtype, tensors] : target->by_dtype) {
        if (dtype == g.scalar_type()) list = &tensors;
      }
      if (list == nullptr)
        list =
            &target->by_dtype.emplace_back(g.scalar_type(), std::vector<::torch::Tensor>{}).second;
      list->push_back(g);
    }
    if (groups.empty()) return {};
    ensure_state(groups.front().device);
    // 1 / scale in double precision, then float32 (GradScaler's rounding).
    const ::torch::Tensor inv_scale = scale_.to(::torch::kDouble).reciprocal().to(::torch::kFloat);
    ::torch::Tensor found_inf;
    for (group& gr : groups) {
      ::torch::Tensor device_found =
          ::torch::zeros({1}, ::torch::TensorOptions().dtype(::torch::kFloat).device(gr.device));
      const ::torch::Tensor device_inv = inv_scale.to(gr.device, /*non_blocking=*/true);
      for (auto& entry : gr.by_dtype) {
        at::_amp_foreach_non_finite_check_and_unscale_(entry.second, device_found, device_inv);
      }
      device_found = device_found.to(scale_.device(), /*non_blocking=*/true);
      found_inf = found_inf.defined() ? found_inf + device_found : device_found;
    }
    return found_inf;
  }

  /// unscale_() and one read of its flag: true when any gradient is inf or NaN. On a GPU this is
  /// the one host synchronisation of a step.
  bool unscale(const std::vector<::torch::Tensor>& params) {
    const ::torch::Tensor found_inf = unscale_(params);
    return found_inf.defined() && found_inf.item<float>() != 0.0f;
  }

  /// After a step, on the scale's device (no host synchronisation): back off when `found_inf` is
  /// non-zero, grow after growth_interval clean steps in a row. An undefined flag counts as clean.
  void update(const ::torch::Tensor& found_inf) {
    ensure_state(found_inf.defined() ? found_inf.device() : c10::Device(c10::DeviceType::CPU));
    const ::torch::Tensor flag =
        found_inf.defined() ? found_inf.to(scale_.device(), ::torch::kFloat, /*non_blocking=*/true)
                            : ::torch::zeros({1}, scale_.options());
    at::_amp_update_scale_(scale_, growth_tracker_, flag, growth_factor_, backoff_factor_,
                           growth_interval_);
  }
  /// update() with a flag known on the host.
  void update(bool found_inf) {
    ensure_state(c10::Device(c10::DeviceType::CPU));
    update(::torch::full({1}, found_inf ? 1.0f : 0.0f, scale_.options()));
  }

 private:
  void ensure_state(c10::Device device) {
    if (scale_.defined()) return;
    scale_ = ::torch::full({1}, init_scale_,
                           ::torch::TensorOptions().dtype(::torch::kFloat).device(device));
    growth_tracker_ =
        ::torch::zeros({1}, ::torch::TensorOptions().dtype(::torch::kInt).device(device));
  }

  double init_scale_;
  double growth_factor_;
  double backoff_factor_;
  int growth_interval_;
  ::torch::Tensor scale_;           // float32 {1}
  ::torch::Tensor growth_tracker_;  // int32 {1}: clean steps in a row
};

struct accumulation_options {
  std::size_t steps = 1;       ///< K: micro-batches per optimizer step (>= 1)
  double max_grad_norm = 0.0;  ///< > 0: clip the total gradient norm to this after unscaling
  std::size_t bucket_bytes = std::size_t{25} << 20;  ///< flat bucket size for the communicator
  bool overlap = true;  ///< launch each bucket's all-reduce from backward (see the top of the file)
};

/// Accumulates gradients over accumulation_options::steps micro-batches; see the top of the file.
class gradient_accumulator {
 public:
  /// `comm` and `scaler` are optional and must outlive the accumulator. Throws
  /// std::invalid_argument for steps == 0, a negative or NaN max_grad_norm, or bucket_bytes == 0.
  /// With a communicator of 2+ ranks, the buckets are laid out here from the optimizer's
  /// parameters that require grad, and (with overlap) a hook is put on each one's gradient
  /// accumulator; the destructor takes the hooks off.
  gradient_accumulator(::torch::optim::Optimizer& optimizer, accumulation_options options,
                       communicator* comm = nullptr, dynamic_loss_scaler* scaler = nullptr)
      : optimizer_(optimizer), options_(options), comm_(comm), scaler_(scaler) {
    if (options.steps == 0) {
      throw std::invalid_argument(
          "gpumem::train::gradient_accumulator: steps (K) must be at least 1");
    }
    if (!(options.max_grad_norm >= 0.0)) {
      throw std::invalid_argument(
          "gpumem::train::gradient_accumulator: max_grad_norm must be >= 0 (0 = no clipping)");
    }
    if (options.bucket_bytes == 0) {
      throw std::invalid_argument("gpumem::train::gradient_accumulator: bucket_bytes is 0");
    }
    if (comm_ != nullptr && comm_->world_size() > 1) {
      params_ = parameters();
      lay_out_buckets();
      if (options_.overlap) install_hooks();
    }
  }

  ~gradient_accumulator() {
    for (const hook& h : hooks_) h.accumulator->del_post_hook(h.key);
  }
  gradient_accumulator(const gradient_accumulator&) = delete;
  gradient_accumulator& operator=(const gradient_accumulator&) = delete;

  /// Backward of loss / K (times the loss scale). Returns true when this call closed a window
  /// (whether or not the step was skipped for inf/NaN: see last_step_skipped()).
  bool backward(const ::torch::Tensor& loss) {
    ::torch::Tensor scaled = loss / static_cast<double>(options_.steps);
    if (scaler_ != nullptr) scaled = scaler_->scale(scaled);
    const bool boundary = micro_step_ + 1 >= options_.steps;
    if (boundary && !hooks_.empty()) arm();
    try {
      scaled.backward();
    } catch (...) {
      disarm();
      throw;
    }
    if (++micro_step_ < options_.steps) return false;
    close_window();
    micro_step_ = 0;
    return true;
  }

  /// Micro-batches accumulated in the open window (0 right after a step).
  std::size_t micro_step() const noexcept { return micro_step_; }
  /// Whether the last window's step was skipped because the gradients held inf/NaN.
  bool last_step_skipped() const noexcept { return skipped_; }
  /// Optimizer steps taken (skipped ones not counted).
  std::size_t steps_taken() const noexcept { return steps_taken_; }
  /// Windows in which the gradients were averaged across ranks (once per window with a
  /// communicator of 2+ ranks).
  std::size_t communicator_calls() const noexcept { return communicator_calls_; }
  /// Number of flat buckets (0 without a communicator of 2+ ranks).
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// Buckets averaged so far, and of those, the ones launched from inside backward (by the hook
  /// of their last gradient) rather than after it.
  std::size_t buckets_reduced() const noexcept { return buckets_reduced_; }
  std::size_t buckets_launched_in_backward() const noexcept { return launched_in_backward_; }
  /// Bytes of the buckets' flat buffers (allocated at the first boundary).
  std::size_t bucket_buffer_bytes() const noexcept {
    std::size_t total = 0;
    for (const bucket& b : buckets_) {
      if (b.flat.defined()) total += static_cast<std::size_t>(b.flat.nbytes());
    }
    return total;
  }
  /// The buckets' flat buffers (undefined before the first boundary), in launch order.
  std::vector<::torch::Tensor> bucket_buffers() const {
    std::vector<::torch::Tensor> out;
    for (const bucket& b : buckets_) out.push_back(b.flat);
    return out;
  }

 private:
  struct bucket {
    std::vector<std::size_t> members;  // indices into params_, in reverse registration order
    std::vector<int64_t> offsets;      // of each member in `flat`
    int64_t numel = 0;
    std::size_t bytes = 0;
    at::ScalarType dtype = at::kFloat;
    c10::Device device{c10::DeviceType::CPU};
    ::torch::Tensor flat;
    std::size_t ready = 0;  // members packed in this window
    bool launched = false;
  };
  struct hook {
    std::shared_ptr<::torch::autograd::Node>
        accumulator;  // kept alive: the variable holds it weakly
    uintptr_t key;
  };

  std::vector<::torch::Tensor> parameters() const {
    std::vector<::torch::Tensor> params;
    for (const auto& group : optimizer_.param_groups()) {
      for (const ::torch::Tensor& p : group.params()) {
        if (p.requires_grad()) params.push_back(p);
      }
    }
    return params;
  }

  // Buckets per dtype and device, filled with the parameters in reverse order (backward produces
  // the gradients of the last layers first), each at most bucket_bytes unless one gradient is
  // larger; numbered in the order they close, which is the order they are launched in.
  void lay_out_buckets() {
    std::vector<std::size_t> open;  // indices into buckets_ of the bucket being filled, per kind
    param_bucket_.assign(params_.size(), 0);
    for (std::size_t i = params_.size(); i-- > 0;) {
      const ::torch::Tensor& p = params_[i];
      const std::size_t bytes = static_cast<std::size_t>(p.numel()) * p.element_size();
      std::optional<std::size_t> target;
      for (std::size_t& o : open) {
        bucket& b = buckets_[o];
        if (b.dtype != p.scalar_type() || b.device != p.device()) continue;
        if (b.bytes > 0 && b.bytes + bytes > options_.bucket_bytes) {
          o = buckets_.size();  // this kind's bucket is full: a new one takes its place
          buckets_.emplace_back();
        }
        target = o;
        break;
      }
      if (!target) {
        target = buckets_.size();
        open.push_back(*target);
        buckets_.emplace_back();
      }
      bucket& b = buckets_[*target];
      b.dtype = p.scalar_type();
      b.device = p.device();
      b.members.push_back(i);
      b.offsets.push_back(b.numel);
      b.numel += p.numel();
      b.bytes += bytes;
      param_bucket_[i] = *target;
    }
    // Launch order: by the position of each bucket's first (latest-registered) member, so that
    // the buckets of the last layers go first whatever their dtype or device.
    std::vector<std::size_t> order(buckets_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return buckets_[a].members.front() > buckets_[b].members.front();
    });
    std::vector<bucket> sorted;
    std::vector<std::size_t> new_index(buckets_.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      new_index[order[i]] = i;
      sorted.push_back(std::move(buckets_[order[i]]));
    }
    buckets_ = std::move(sorted);
    for (std::size_t& b : param_bucket_) b = new_index[b];
    position_in_bucket_.assign(params_.size(), 0);
    for (const bucket& b : buckets_) {
      for (std::size_t m = 0; m < b.members.size(); ++m) position_in_bucket_[b.members[m]] = m;
    }
  }

  void install_hooks() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      std::shared_ptr<::torch::autograd::Node> acc =
          ::torch::autograd::impl::grad_accumulator(params_[i]);
      if (!acc) continue;  // not a leaf: averaged after backward
      const uintptr_t key =
          acc->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
              [this, i](const ::torch::autograd::variable_list& outputs,
                        const ::torch::autograd::variable_list&) {
                on_gradient_final(i);
                return outputs;
              }));
      hooks_.push_back({std::move(acc), key});
    }
  }

  void arm() {
    armed_ = true;
    next_launch_ = 0;
    error_ = nullptr;
    packed_.assign(params_.size(), false);
    for (bucket& b : buckets_) {
      b.ready = 0;
      b.launched = false;
    }
  }
  void disarm() noexcept { armed_ = false; }

  // A parameter's gradient accumulator ran in the window's last backward: its gradient is final.
  // Runs on the autograd thread of the gradient's device, with the gradient's stream current.
  void on_gradient_final(std::size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);  // one autograd thread per device may call
    if (!armed_ || error_) return;
    try {
      if (packed_[i]) {
        if (buckets_[param_bucket_[i]].launched) {
          throw std::logic_error(
              "gpumem::train::gradient_accumulator: a parameter's gradient was accumulated again "
              "after its bucket was launched (used both inside and outside a re-entrant "
              "checkpoint?); construct the accumulator with overlap = false");
        }
        pack(i);  // accumulated again before the launch: pack its new value
        return;
      }
      pack(i);
      packed_[i] = true;
      ++buckets_[param_bucket_[i]].ready;
      // Launch, in order, every bucket that is now complete.
      while (next_launch_ < buckets_.size() &&
             buckets_[next_launch_].ready == buckets_[next_launch_].members.size()) {
        launch(buckets_[next_launch_++]);
        ++launched_in_backward_;
      }
    } catch (...) {
      error_ = std::current_exception();  // rethrown once backward has ended
    }
  }

  void allocate(bucket& b) {
    if (b.flat.defined()) return;
    b.flat = ::torch::empty({b.numel}, ::torch::TensorOptions().dtype(b.dtype).device(b.device));
  }

  // Copies parameter i's gradient (zeros when it has none) into its bucket, on the current stream,
  // and orders the bucket's communication stream after that copy.
  void pack(std::size_t i) {
    ::torch::NoGradGuard no_grad;
    const ::torch::Tensor& p = params_[i];
    bucket& b = buckets_[param_bucket_[i]];
    allocate(b);
    if (!p.grad().defined()) p.mutable_grad() = ::torch::zeros_like(p);
    const ::torch::Tensor& g = p.grad();
    b.flat.narrow(0, b.offsets[position_in_bucket_[i]], g.numel()).view_as(g).copy_(g);
    if (!b.device.is_cpu()) {
      c10::impl::VirtualGuardImpl impl(b.device.type());
      c10::Event copied(b.device.type());
      copied.record(impl.getStream(b.device));
      copied.block(comm_stream(b.device));
    }
  }

  // All-reduces one bucket: on its device's communication stream (which pack() ordered after the
  // copies into it), the buffer marked as used there.
  void launch(bucket& b) {
    b.launched = true;
    std::vector<::torch::Tensor> one{b.flat};
    if (b.device.is_cpu()) {
      comm_->all_reduce_average(one);
    } else {
      const c10::Stream comm = comm_stream(b.device);
      {
        c10::StreamGuard on_comm(comm);
        comm_->all_reduce_average(one);
      }
      b.flat.record_stream(comm);
    }
    ++buckets_reduced_;
  }

  c10::Stream comm_stream(c10::Device device) {
    for (const auto& [d, s] : comm_streams_) {
      if (d == device) return s;
    }
    c10::impl::VirtualGuardImpl impl(device.type());
    const c10::Stream s = impl.getStreamFromGlobalPool(device);
    comm_streams_.emplace_back(device, s);
    return s;
  }

  // After the window's last backward: launches what backward did not (every bucket without
  // overlap), makes the current streams wait for the communication streams, and copies the
  // averages back into the gradients. On failure the gradients are untouched.
  void average_across_ranks() {
    ::torch::NoGradGuard no_grad;
    if (hooks_.empty()) arm();
    armed_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    for (; next_launch_ < buckets_.size(); ++next_launch_) {
      bucket& b = buckets_[next_launch_];
      for (std::size_t i : b.members) {
        if (!packed_[i]) pack(i);
      }
      launch(b);
    }
    for (const auto& [device, stream] : comm_streams_) {
      c10::impl::VirtualGuardImpl impl(device.type());
      c10::Event done(device.type());
      done.record(stream);
      done.block(impl.getStream(device));
    }
    for (const bucket& b : buckets_) {
      for (std::size_t m = 0; m < b.members.size(); ++m) {
        const ::torch::Tensor& g = params_[b.members[m]].grad();
        g.copy_(b.flat.narrow(0, b.offsets[m], g.numel()).view_as(g));
      }
    }
  }

  // Clips the gradients' total 2-norm to max_norm on their devices, without reading the norm to
  // the host (torch.nn.utils.clip_grad_norm_'s arithmetic: coefficient max_norm / (norm + 1e-6),
  // at most 1).
  static void clip_on_device(const std::vector<::torch::Tensor>& params, double max_norm) {
    ::torch::NoGradGuard no_grad;
    std::vector<::torch::Tensor> grads;
    for (const ::torch::Tensor& p : params) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    if (grads.empty()) return;
    const c10::Device first = grads.front().device();
    std::vector<::torch::Tensor> norms;
    norms.reserve(grads.size());
    for (const ::torch::Tensor& g : grads) {
      norms.push_back(::torch::linalg_vector_norm(g, 2, std::nullopt, false, ::torch::kFloat)
                          .to(first, /*non_blocking=*/true));
    }
    const ::torch::Tensor total = ::torch::linalg_vector_norm(::torch::stack(norms), 2);
    const ::torch::Tensor coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (const ::torch::Tensor& g : grads) {
      g.mul_(coefficient.to(g.device(), /*non_blocking=*/true));
    }
  }

  void close_window() {
    const std::vector<::torch::Tensor> params = parameters();
    if (!buckets_.empty()) {
      average_across_ranks();
      ++communicator_calls_;
    }
    ::torch::Tensor found_inf;
    if (scaler_ != nullptr) found_inf = scaler_->unscale_(params);
    if (options_.max_grad_norm > 0.0) clip_on_device(params, options_.max_grad_norm);
    // The step's one read to the host.
    const bool skip = found_inf.defined() && found_inf.item<float>() != 0.0f;
    skipped_ = skip;
    if (!skip) {
      optimizer_.step();
      ++steps_taken_;
    }
    if (scaler_ != nullptr) scaler_->update(found_inf);
    optimizer_.zero_grad();
  }

  ::torch::optim::Optimizer& optimizer_;
  accumulation_options options_;
  communicator* comm_;
  dynamic_loss_scaler* scaler_;
  std::size_t micro_step_ = 0;
  std::size_t steps_taken_ = 0;
  std::size_t communicator_calls_ = 0;
  bool skipped_ = false;

  // The buckets (with a communicator of 2+ ranks).
  std::vector<::torch::Tensor> params_;    // the optimizer's, fixed at construction
  std::vector<bucket> buckets_;            // in launch order
  std::vector<std::size_t> param_bucket_;  // bucket of each parameter
  std::vector<std::size_t> position_in_bucket_;
  std::vector<hook> hooks_;
  std::vector<std::pair<c10::Device, c10::Stream>> comm_streams_;
  std::vector<bool> packed_;  // per parameter, in the current window's last backward
  std::size_t next_launch_ = 0;
  bool armed_ = false;
  std::exception_ptr error_;
  std::mutex mutex_;  // the hooks' state, against autograd threads of several devices
  std::size_t buckets_reduced_ = 0;
  std::size_t launched_in_backward_ = 0;
};

}  // namespace gpumem::train
