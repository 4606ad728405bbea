// gpumem — activation checkpointing for the LibTorch C++ frontend.
//
//   auto y = gpumem::train::checkpoint([&](torch::Tensor x) { return block->forward(x); }, x);
//   auto z = gpumem::train::checkpoint_sequential(model, /*segments=*/4, x);
//
// checkpoint(fn, inputs...) runs `fn` without keeping the activations it creates, and runs it again
// during backward to compute its gradients (PyTorch's torch.utils.checkpoint, re-entrant variant).
// The CPU and CUDA random-number states are saved before the forward and restored for the
// recomputation, so dropout draws the same masks; so is the autocast state (enabled flag and dtype
// of every device type, whether casts are cached: gpumem/train/autocast.hpp), so that under mixed
// precision the recomputation runs at the forward's dtypes even though backward runs outside
// autocast, and on another thread for CUDA tensors. Gradients equal those without checkpointing
// (bitwise on CPU for deterministic operations, with or without autocast). Inputs that do not
// require grad, several outputs, parameters used inside `fn`, and checkpoints nested inside `fn`
// are handled.
//
// This is the re-entrant form (the recomputation runs its own backward inside the checkpoint's
// backward). PyTorch's non-reentrant form needs saved-tensor hooks that apply to every operation
// inside `fn`; LibTorch only lets Python install them (at::SavedTensorDefaultHooks holds Python
// objects, and the C++ autograd engine has no default hooks), so it cannot be offered in C++. As
// with torch.utils.checkpoint's re-entrant form, use backward() (or gradient_accumulator), not
// torch::autograd::grad(), through a checkpoint: the recomputation accumulates into .grad.
//
// Contract: `fn` must be a pure function of its inputs, the module parameters it uses and the
// random-number state (it runs twice). Thread safety: like any autograd code; the random-number
// generators are locked while their state is read or set. Errors: std::invalid_argument for bad
// arguments; whatever `fn` throws, unchanged.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpumem/train/autocast.hpp"

namespace gpumem::train {

/// A function of a list of tensors returning a list of tensors (what checkpoint recomputes).
using tensor_list_fn =
    std::function<std::vector<::torch::Tensor>(const std::vector<::torch::Tensor>&)>;

namespace detail {

// The random-number states a recomputation must see again: the CPU generator's and those of the
// CUDA devices the inputs live on.
struct rng_states {
  ::torch::Tensor cpu;
  std::vector<std::pair<c10::Device, ::torch::Tensor>> cuda;

  static ::torch::Tensor get(at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  }
  static void set(at::Generator g, const ::torch::Tensor& state) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }

  static rng_states capture(const std::vector<::torch::Tensor>& inputs) {
    rng_states s;
    auto& context = at::globalContext();
    s.cpu = get(context.defaultGenerator(c10::Device(c10::DeviceType::CPU)));
    for (const ::torch::Tensor& t : inputs) {
      if (!t.defined() || !t.is_cuda()) continue;
      const c10::Device d = t.device();
      bool seen = false;
      for (const auto& entry : s.cuda) seen = seen || entry.first == d;
      if (!seen) s.cuda.emplace_back(d, get(context.defaultGenerator(d)));
    }
    return s;
  }

  void restore() const {
    auto& context = at::globalContext();
    set(context.defaultGenerator(c10::Device(c10::DeviceType::CPU)), cpu);
    for (const auto& [device, state] : cuda) set(context.defaultGenerator(device), state);
  }
};

// Puts the random-number states of `now` back when the recomputation ends, however it ends.
struct restore_rng_at_exit {
  const rng_states& now;
  ~restore_rng_at_exit() { now.restore(); }
};

// What the backward needs besides the saved inputs: the function, the random-number states and
// the autocast state of the forward.
struct checkpoint_state : ::torch::CustomClassHolder {
  tensor_list_fn fn;
  rng_states rng;
  autocast_state autocast;
};

struct checkpoint_function : ::torch::autograd::Function<checkpoint_function> {
  static std::vector<::torch::Tensor> forward(::torch::autograd::AutogradContext* ctx,
                                              tensor_list_fn fn, at::TensorList inputs) {
    auto state = c10::make_intrusive<checkpoint_state>();
    state->fn = std::move(fn);
    // The last input is the anchor (see checkpoint()), not an argument of fn.
    std::vector<::torch::Tensor> args(inputs.begin(), inputs.end() - 1);
    state->rng = rng_states::capture(args);
    state->autocast = autocast_state::capture();
    std::vector<::torch::Tensor> outputs;
    {
      ::torch::NoGradGuard no_grad;  // the activations of fn are not kept
      outputs = state->fn(args);
    }
    for (const ::torch::Tensor& out : outputs) {
      if (out.defined() && !out.is_floating_point() && !out.is_complex()) {
        ctx->mark_non_differentiable({out});
      }
    }
    ctx->save_for_backward(args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static std::vector<::torch::Tensor> backward(::torch::autograd::AutogradContext* ctx,
                                               std::vector<::torch::Tensor> grad_outputs) {
    auto state =
        c10::static_intrusive_pointer_cast<checkpoint_state>(ctx->saved_data["state"].toCapsule());
    std::vector<::torch::Tensor> saved = ctx->get_saved_variables();
    std::vector<::torch::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const ::torch::Tensor& t : saved) {
      if (!t.defined()) {
        inputs.push_back(t);
        continue;
      }
      ::torch::Tensor leaf = t.detach();
      leaf.requires_grad_(t.requires_grad());
      inputs.push_back(std::move(leaf));
    }
    // Recompute with the forward's random-number and autocast states, then put the current ones
    // back (the autocast scope empties the cast cache when it is the outermost, as
    // torch.autocast does).
    const rng_states now = rng_states::capture(inputs);
    std::vector<::torch::Tensor> outputs;
    {
      restore_rng_at_exit restore{now};
      state->rng.restore();
      scoped_autocast_state autocast(state->autocast);
      ::torch::AutoGradMode grad(true);
      outputs = state->fn(inputs);
    }
    if (outputs.size() != grad_outputs.size()) {
      throw std::logic_error("gpumem::train::checkpoint: the recomputation returned " +
                             std::to_string(outputs.size()) + " tensors, the forward " +
                             std::to_string(grad_outputs.size()) +
                             " (the function must be deterministic)");
    }
    std::vector<::torch::Tensor> with_grad;
    std::vector<::torch::Tensor> grads;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!with_grad.empty()) ::torch::autograd::backward(with_grad, grads);
    std::vector<::torch::Tensor> result;  // one per forward argument: fn, each input, the anchor
    result.reserve(2 + inputs.size());
    result.emplace_back();
    for (const ::torch::Tensor& in : inputs) {
      result.push_back(in.defined() && in.requires_grad() ? in.grad() : ::torch::Tensor());
    }
    result.emplace_back();
    return result;
  }
};

template <class T>
struct is_tensor_vector : std::false_type {};
template <>
struct is_tensor_vector<std::vector<::torch::Tensor>> : std::true_type {};

// fn(args[0], args[1], ...) as a list of tensors.
template <class F, std::size_t... I>
std::vector<::torch::Tensor> call_with_list(const F& f, const std::vector<::torch::Tensor>& args,
                                            std::index_sequence<I...>) {
  auto r = f(args[I]...);
  if constexpr (std::is_same_v<decltype(r), ::torch::Tensor>) {
    return {std::move(r)};
  } else {
    return r;
  }
}

}  // namespace detail

/// Runs fn(inputs) without keeping its activations; they are recomputed during backward.
/// Returns fn's outputs (connected to the autograd graph when any input or parameter used by fn
/// requires grad). Throws std::invalid_argument for an empty `fn`.
inline std::vector<::torch::Tensor> checkpoint(tensor_list_fn fn,
                                               const std::vector<::torch::Tensor>& inputs) {
  if (!fn) throw std::invalid_argument("gpumem::train::checkpoint: empty function");
  // An empty tensor that requires grad puts the checkpoint in the graph even when no input does:
  // the parameters fn uses still get their gradients (torch.utils.checkpoint's reentrant variant
  // would lose them).
  std::vector<::torch::Tensor> args(inputs);
  args.push_back(::torch::empty({0}, ::torch::requires_grad(::torch::GradMode::is_enabled())));
  return detail::checkpoint_function::apply(std::move(fn), at::TensorList(args));
}

/// checkpoint for a callable taking tensors: fn(a, b, ...) returning a torch::Tensor or a
/// std::vector<torch::Tensor>; the result has the same type.
template <class Fn, class... Tensors,
          class = std::enable_if_t<(std::is_convertible_v<Tensors, ::torch::Tensor> && ...)>>
auto checkpoint(Fn&& fn, const Tensors&... inputs) {
  using result = std::decay_t<std::invoke_result_t<Fn&, const Tensors&...>>;
  static_assert(std::is_same_v<result, ::torch::Tensor> || detail::is_tensor_vector<result>::value,
                "gpumem::train::checkpoint: the function must return ::torch::Tensor or "
                "std::vector<::torch::Tensor>");
  tensor_list_fn list_fn = [f = std::forward<Fn>(fn)](const std::vector<::torch::Tensor>& args) {
    return detail::call_with_list(f, args, std::index_sequence_for<Tensors...>{});
  };
  std::vector<::torch::Tensor> outputs =
      checkpoint(std::move(list_fn), {::torch::Tensor(inputs)...});
  if constexpr (std::is_same_v<result, ::torch::Tensor>) {
    return outputs.at(0);
  } else {
    return outputs;
  }
}

/// torch.utils.checkpoint.checkpoint_sequential: splits `sequential`'s modules into `segments`
/// consecutive runs of equal length (the last takes the remainder), checkpoints every run but the
/// last, which runs normally (its activations are needed right away by backward). Every module
/// must take and return one tensor. Throws std::invalid_argument unless
/// 1 <= segments <= number of modules.
inline ::torch::Tensor checkpoint_sequential(::torch::nn::Sequential& sequential,
                                             std::size_t segments, ::torch::Tensor input) {
  const std::size_t n = sequential->size();
  if (segments < 1 || segments > n) {
    throw std::invalid_argument(
        "gpumem::train::checkpoint_sequential: " + std::to_string(segments) + " segments for " +
        std::to_string(n) + " modules (need 1 to " + std::to_string(n) + ")");
  }
  auto run = [&sequential](std::size_t begin, std::size_t end, ::torch::Tensor x) {
    for (auto it = sequential->begin() + static_cast<std::ptrdiff_t>(begin);
         it != sequential->begin() + static_cast<std::ptrdiff_t>(end); ++it) {
      x = it->forward(x);
    }
    return x;
  };
  const std::size_t per_segment = n / segments;
  std::size_t begin = 0;
  for (std::size_t s = 0; s + 1 < segments; ++s) {
    const std::size_t end = begin + per_segment;
    input = checkpoint([run, begin, end](::torch::Tensor x) { return run(begin, end, x); }, input);
    begin = end;
  }
  return run(begin, n, input);
}

}  // namespace gpumem::train
