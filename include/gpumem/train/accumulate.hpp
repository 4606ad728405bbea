// gpumem — gradient accumulation over K micro-batches for the LibTorch C++ frontend, with a
// dynamic loss scaler (AMP's GradScaler) and a communicator called only at accumulation
// boundaries (the C++ counterpart of DDP's no_sync()).
//
//   gpumem::train::gradient_accumulator acc(optimizer, {/*steps=*/4, /*max_grad_norm=*/1.0});
//   for (auto& batch : loader) acc.backward(loss_fn(model->forward(batch.data), batch.target));
//
// Each backward() runs loss / K backward; every K-th call closes the window, in this order:
//   1. the communicator (if any) averages the gradients across ranks, over flat buckets of at most
//      bucket_bytes per dtype and device — once per window, never per micro-batch;
//   2. the loss scaler (if any) unscales the gradients and looks for inf/NaN;
//   3. gradients are clipped to max_grad_norm (if > 0), on their true, unscaled values;
//   4. the optimizer steps — skipped when step 2 found inf/NaN;
//   5. the loss scaler updates its scale (backs off after inf/NaN, grows after growth_interval
//      clean steps);
//   6. the gradients are zeroed.
// This is GradScaler's documented order (unscale, clip, step, update). K micro-batches of size B
// give the gradients of one batch of size K x B (for losses that are means over the batch),
// within floating-point tolerance.
//
// Thread safety: one accumulator per training loop (rank). Errors: std::invalid_argument for bad
// options; what the communicator throws propagates out of backward() with the gradients of the
// window intact and the optimizer not stepped.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpumem/train/communicator.hpp"

namespace gpumem::train {

/// AMP's GradScaler for the C++ frontend: multiplies the loss by a scale, divides the gradients
/// by it before the step, skips steps whose gradients overflowed and adapts the scale.
class dynamic_loss_scaler {
 public:
  /// Throws std::invalid_argument unless init_scale > 0, growth_factor > 1,
  /// 0 < backoff_factor < 1 and growth_interval >= 1.
  explicit dynamic_loss_scaler(double init_scale = 65536.0, double growth_factor = 2.0,
                               double backoff_factor = 0.5, int growth_interval = 2000)
      : scale_(init_scale),
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

  double scale() const noexcept { return scale_; }
  ::torch::Tensor scale(const ::torch::Tensor& loss) const { return loss * scale_; }

  /// Divides every defined gradient by the scale; returns true when any is inf or NaN.
  bool unscale(const std::vector<::torch::Tensor>& params) const {
    ::torch::NoGradGuard no_grad;
    bool found_inf = false;
    for (const ::torch::Tensor& p : params) {
      ::torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      g.div_(scale_);
      if (!found_inf && !::torch::isfinite(g).all().item<bool>()) found_inf = true;
    }
    return found_inf;
  }

  /// After a step: back off on overflow, grow after growth_interval clean steps in a row.
  void update(bool found_inf) noexcept {
    if (found_inf) {
      scale_ *= backoff_factor_;
      clean_steps_ = 0;
    } else if (++clean_steps_ == growth_interval_) {
      scale_ *= growth_factor_;
      clean_steps_ = 0;
    }
  }

 private:
  double scale_;
  double growth_factor_;
  double backoff_factor_;
  int growth_interval_;
  int clean_steps_ = 0;
};

struct accumulation_options {
  std::size_t steps = 1;       ///< K: micro-batches per optimizer step (>= 1)
  double max_grad_norm = 0.0;  ///< > 0: clip the total gradient norm to this after unscaling
  std::size_t bucket_bytes = std::size_t{25} << 20;  ///< flat bucket size for the communicator
};

/// Accumulates gradients over accumulation_options::steps micro-batches; see the top of the file.
class gradient_accumulator {
 public:
  /// `comm` and `scaler` are optional and must outlive the accumulator. Throws
  /// std::invalid_argument for steps == 0, a negative or NaN max_grad_norm, or bucket_bytes == 0.
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
  }

  /// Backward of loss / K (times the loss scale). Returns true when this call closed a window
  /// (whether or not the step was skipped for inf/NaN: see last_step_skipped()).
  bool backward(const ::torch::Tensor& loss) {
    ::torch::Tensor scaled = loss / static_cast<double>(options_.steps);
    if (scaler_ != nullptr) scaled = scaler_->scale(scaled);
    scaled.backward();
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
  /// Times the communicator was called (once per window with a communicator of 2+ ranks).
  std::size_t communicator_calls() const noexcept { return communicator_calls_; }

 private:
  std::vector<::torch::Tensor> parameters() const {
    std::vector<::torch::Tensor> params;
    for (const auto& group : optimizer_.param_groups()) {
      for (const ::torch::Tensor& p : group.params()) {
        if (p.requires_grad()) params.push_back(p);
      }
    }
    return params;
  }

  void close_window() {
    const std::vector<::torch::Tensor> params = parameters();
    if (comm_ != nullptr && comm_->world_size() > 1) {
      average_across_ranks(params);
      ++communicator_calls_;
    }
    const bool found_inf = scaler_ != nullptr && scaler_->unscale(params);
    if (!found_inf && options_.max_grad_norm > 0.0) {
      ::torch::nn::utils::clip_grad_norm_(params, options_.max_grad_norm);
    }
    skipped_ = found_inf;
    if (!found_inf) {
      optimizer_.step();
      ++steps_taken_;
    }
    if (scaler_ != nullptr) scaler_->update(found_inf);
    optimizer_.zero_grad();
  }

  // Packs the gradients into flat buckets (per dtype and device, in parameter order, at most
  // bucket_bytes each unless one gradient is larger), averages them, and copies them back only
  // once the communicator succeeded.
  void average_across_ranks(const std::vector<::torch::Tensor>& params) {
    ::torch::NoGradGuard no_grad;
    struct bucket {
      std::vector<::torch::Tensor> grads;
      std::size_t bytes = 0;
    };
    std::vector<bucket> buckets;
    for (const ::torch::Tensor& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = ::torch::zeros_like(p);  // same layout everywhere
      const ::torch::Tensor& g = p.grad();
      const std::size_t bytes = static_cast<std::size_t>(g.numel()) * g.element_size();
      bucket* target = nullptr;
      for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
        const ::torch::Tensor& first = it->grads.front();
        if (first.scalar_type() == g.scalar_type() && first.device() == g.device()) {
          if (it->bytes + bytes <= options_.bucket_bytes) target = &*it;
          break;
        }
      }
      if (target == nullptr) target = &buckets.emplace_back();
      target->grads.push_back(g);
      target->bytes += bytes;
    }
    std::vector<::torch::Tensor> flat;
    flat.reserve(buckets.size());
    for (const bucket& b : buckets) {
      std::vector<::torch::Tensor> pieces;
      for (const ::torch::Tensor& g : b.grads) pieces.push_back(g.reshape({-1}));
      flat.push_back(::torch::cat(pieces));
    }
    comm_->all_reduce_average(flat);
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      int64_t offset = 0;
      for (const ::torch::Tensor& g : buckets[i].grads) {
        g.copy_(flat[i].narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  }

  ::torch::optim::Optimizer& optimizer_;
  accumulation_options options_;
  communicator* comm_;
  dynamic_loss_scaler* scaler_;
  std::size_t micro_step_ = 0;
  std::size_t steps_taken_ = 0;
  std::size_t communicator_calls_ = 0;
  bool skipped_ = false;
};

}  // namespace gpumem::train
