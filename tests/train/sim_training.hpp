// The training step measured on the CUDA simulator, shared by the training tests
// (tests/train/test_train_sim.cpp) and the host-synchronisation benchmark (bench/train_syncs.cpp):
// a model without matrix products (cuBLAS does not start on the simulator) and the count of the
// calls that make the host wait for the device.
#pragma once

#include <dlfcn.h>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/train/accumulate.hpp"
#include "gpumem_cudasim.h"

namespace gpumem_train_sim {

/// The simulator's counters in `out`; false when the process does not run on the simulator.
inline bool read_counters(gpumemSimCounters& out) {
  auto get =
      reinterpret_cast<gpumemSimGetCounters_t>(dlsym(RTLD_DEFAULT, GPUMEM_SIM_GET_COUNTERS_NAME));
  out = gpumemSimCounters{};
  return get != nullptr && get(&out, sizeof out) == 0;
}

/// The calls that make the host wait for the device.
inline unsigned long long host_syncs(const gpumemSimCounters& c) {
  return c.stream_synchronize + c.calls.event_synchronize + c.calls.device_synchronize;
}

/// LAYERS elementwise layers x -> tanh(x * w + b): 2 x LAYERS gradients of WIDTH values.
struct elementwise_impl : torch::nn::Module {
  elementwise_impl(int64_t layers, int64_t width) {
    for (int64_t i = 0; i < layers; ++i) {
      weights.push_back(register_parameter("w" + std::to_string(i), torch::ones({width})));
      biases.push_back(register_parameter("b" + std::to_string(i), torch::zeros({width})));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < weights.size(); ++i) x = torch::tanh(x * weights[i] + biases[i]);
    return x;
  }
  std::vector<torch::Tensor> weights, biases;
};
TORCH_MODULE_IMPL(elementwise, elementwise_impl);

/// Host synchronisations per optimizer step of `acc` (K micro-batches of `x` each), averaged over
/// `steps` steps after a warm-up step. Returns a negative number off the simulator.
inline double syncs_per_step(gpumem::train::gradient_accumulator& acc, elementwise& model,
                             const torch::Tensor& x, std::size_t k, int steps) {
  auto one_step = [&] {
    for (std::size_t i = 0; i < k; ++i) acc.backward(model->forward(x).pow(2).mean());
  };
  one_step();
  gpumemSimCounters before{}, after{};
  if (!read_counters(before)) return -1.0;
  for (int s = 0; s < steps; ++s) one_step();
  read_counters(after);
  return static_cast<double>(host_syncs(after) - host_syncs(before)) / steps;
}

}  // namespace gpumem_train_sim
