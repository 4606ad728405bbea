// Trains a small transformer encoder with LibTorch on a CUDA GPU, gpumem installed as PyTorch's
// CUDA allocator, and prints gpumem's memory summary after every epoch.
//
//   gpumem_example_libtorch_train [--epochs 3] [--steps 50] [--batch 16] [--config "policy:stitch"]
//
// Exit status: 0 after training, 2 for bad arguments or without a CUDA GPU.
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "gpumem/torch/cuda_allocator.hpp"

namespace {

struct options {
  int epochs = 3;
  int steps = 50;
  int batch = 16;
  std::string config;  // on top of GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    if (i + 1 >= argc) {
      std::cerr << "train: " << arg << " needs a value\n";
      return false;
    }
    const std::string value = argv[++i];
    try {
      if (arg == "--epochs") {
        o.epochs = std::stoi(value);
      } else if (arg == "--steps") {
        o.steps = std::stoi(value);
      } else if (arg == "--batch") {
        o.batch = std::stoi(value);
      } else if (arg == "--config") {
        o.config = value;
      } else {
        std::cerr << "train: unknown option " << arg << "\n";
        return false;
      }
    } catch (const std::exception&) {
      std::cerr << "train: " << arg << " takes a number, not '" << value << "'\n";
      return false;
    }
  }
  if (o.epochs < 1 || o.steps < 1 || o.batch < 1) {
    std::cerr << "train: --epochs, --steps and --batch must be at least 1\n";
    return false;
  }
  return true;
}

}  // namespace

static void train(const options& o, gpumem::torch::cuda_allocator& gpumem_allocator);

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    std::cerr << "usage: gpumem_example_libtorch_train [--epochs N] [--steps N] [--batch N] "
                 "[--config SETTINGS]\n";
    return 2;
  }
  // First, before any CUDA tensor exists.
  gpumem::torch::cuda_allocator& gpumem_allocator = gpumem::torch::install(o.config);
  if (!torch::cuda::is_available()) {
    std::cerr << "train: this example needs a CUDA GPU\n";
    return 2;
  }
  try {
    train(o, gpumem_allocator);
  } catch (const c10::Error& e) {
    std::cerr << "train: " << e.what_without_backtrace() << "\n";
    return 1;
  }
  return 0;
}

static void train(const options& o, gpumem::torch::cuda_allocator& gpumem_allocator) {
  const torch::Device cuda(torch::kCUDA, 0);
  constexpr int64_t d_model = 256;
  constexpr int64_t seq_len = 128;
  torch::nn::TransformerEncoder model(torch::nn::TransformerEncoderOptions(
      torch::nn::TransformerEncoderLayerOptions(d_model, 8).dim_feedforward(1024), 4));
  model->to(cuda);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));

  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (int step = 0; step < o.steps; ++step) {
      // Sequences of varying length: the allocation pattern that fragments a caching allocator.
      const int64_t len = seq_len / 2 + (step * 37) % (seq_len / 2);
      torch::Tensor x = torch::randn({len, o.batch, d_model}, cuda);
      torch::Tensor loss = torch::mse_loss(model->forward(x), x);
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
    }
    torch::cuda::synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        o.steps;
    std::cout << "epoch " << epoch << ": loss " << loss_sum / o.steps << ", " << ms << " ms/step\n"
              << gpumem_allocator.memory_summary(0, /*abbreviated=*/true) << "\n";
  }
}
