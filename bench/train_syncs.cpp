// gpumem_train_syncs: host synchronisations per optimizer step of gpumem::train's
// gradient_accumulator on CUDA tensors, counted by the CUDA simulator (tools/cudasim): the calls
// that make the host wait for the device (cudaStreamSynchronize, cudaEventSynchronize,
// cudaDeviceSynchronize). A model of elementwise layers (cuBLAS does not start on the simulator)
// with 2 x LAYERS gradients, K = 2 micro-batches per step, SGD.
//
//   LD_LIBRARY_PATH=build/cudasim build/bench/gpumem_train_syncs [LAYERS]
//
// Prints one markdown table row per configuration: loss scaler off/on, clipping off/on.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "gpumem/train/accumulate.hpp"
#include "sim_training.hpp"

namespace {

using gpumem_train_sim::elementwise;

double syncs_per_step(int64_t layers, bool scaled, double clip) {
  const torch::Device cuda(torch::kCUDA, 0);
  elementwise model(layers, 1024);
  model->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.01);
  gpumem::train::dynamic_loss_scaler scaler;
  gpumem::train::gradient_accumulator acc(opt, {2, clip}, nullptr, scaled ? &scaler : nullptr);
  const torch::Tensor x = torch::ones({8, 1024}, torch::TensorOptions().device(cuda));
  const double per_step = gpumem_train_sim::syncs_per_step(acc, model, x, 2, 10);
  if (per_step < 0) {
    std::fprintf(stderr, "gpumem_train_syncs: not running on the CUDA simulator\n");
    std::exit(1);
  }
  return per_step;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t layers = argc > 1 ? std::atoll(argv[1]) : 8;
  if (layers < 1) {
    std::fprintf(stderr, "usage: gpumem_train_syncs [LAYERS >= 1]\n");
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "gpumem_train_syncs: no CUDA device (run it on the simulator)\n");
    return 1;
  }
  std::printf("| gradients | loss scaler | clipping | host synchronisations per step |\n");
  std::printf("|---:|---|---|---:|\n");
  for (bool scaled : {false, true}) {
    for (double clip : {0.0, 1.0}) {
      std::printf("| %lld | %s | %s | %.1f |\n", static_cast<long long>(2 * layers),
                  scaled ? "on" : "off", clip > 0 ? "1.0" : "off",
                  syncs_per_step(layers, scaled, clip));
    }
  }
  return 0;
}
