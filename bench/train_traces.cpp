// gpumem_train_traces: records the allocation traces of a LibTorch C++ training loop of a small
// GPT-style model, with activation checkpointing off and on and gradient accumulation over K = 1
// and K = 4 micro-batches (the same 8 sequences per optimizer step), in float32 and under autocast
// to bfloat16 (gpumem::train::autocast_guard; the forward and the loss, backward outside), on
// LibTorch's CPU allocator (gpumem::torch::cpu_trace_recorder). bench/train_traces.sh replays them
// under each allocator.
//
//   gpumem_train_traces OUT_DIR [--layers 6] [--width 384] [--seq 256] [--batch 8] [--steps 2]
//
// Writes OUT_DIR/gpt-<ckpt|nockpt>-k<K>[-bf16].trace (gpumem's native trace format) and prints one
// line per trace. CPU autocast casts the same kinds of operations as CUDA autocast (matrix
// products to bfloat16, normalisations and the loss in float32), so the traces stand for a GPU
// run under torch.autocast("cuda", torch.bfloat16) up to the few operations the two lists differ
// on.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "gpumem/torch/trace_recorder.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/train/accumulate.hpp"
#include "gpumem/train/autocast.hpp"
#include "gpumem/train/checkpoint.hpp"

namespace {

struct config {
  int64_t layers = 6;
  int64_t width = 384;
  int64_t heads = 6;
  int64_t vocab = 8192;
  int64_t seq = 256;
  int64_t batch = 8;  // sequences per optimizer step
  int steps = 2;      // optimizer steps recorded (the first also creates AdamW's state)
};

// A pre-norm decoder block: causal self-attention and a 4x GELU MLP, each with a residual.
struct block_impl : torch::nn::Module {
  block_impl(int64_t width, int64_t heads)
      : heads_(heads),
        ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv_(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj_(register_module("proj", torch::nn::Linear(width, width))),
        fc_(register_module("fc", torch::nn::Linear(width, 4 * width))),
        out_(register_module("out", torch::nn::Linear(4 * width, width))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto qkv = qkv_->forward(ln1_->forward(x)).view({b, t, 3, heads_, c / heads_});
    auto q = qkv.select(2, 0).transpose(1, 2);
    auto k = qkv.select(2, 1).transpose(1, 2);
    auto v = qkv.select(2, 2).transpose(1, 2);
    auto scores =
        torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(c / heads_));
    auto causal = torch::ones({t, t}, torch::kBool).triu(1);
    auto attention = torch::matmul(scores.masked_fill(causal, -1e9).softmax(-1), v);
    x = x + proj_->forward(attention.transpose(1, 2).reshape({b, t, c}));
    return x + out_->forward(torch::gelu(fc_->forward(ln2_->forward(x))));
  }

  int64_t heads_;
  torch::nn::LayerNorm ln1_, ln2_;
  torch::nn::Linear qkv_, proj_, fc_, out_;
};
TORCH_MODULE_IMPL(block, block_impl);

struct gpt_impl : torch::nn::Module {
  explicit gpt_impl(const config& c)
      : tokens_(register_module("tokens", torch::nn::Embedding(c.vocab, c.width))),
        positions_(register_parameter("positions", torch::randn({c.seq, c.width}) * 0.02)),
        ln_(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        head_(register_module("head", torch::nn::Linear(c.width, c.vocab))) {
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i), block(c.width, c.heads)));
    }
  }

  torch::Tensor forward(const torch::Tensor& ids, bool checkpointed) {
    torch::Tensor x = tokens_->forward(ids) + positions_.narrow(0, 0, ids.size(1));
    for (auto& b : blocks_) {
      x = checkpointed
              ? gpumem::train::checkpoint([&b](torch::Tensor h) { return b->forward(h); }, x)
              : b->forward(x);
    }
    return head_->forward(ln_->forward(x));
  }

  torch::nn::Embedding tokens_;
  torch::Tensor positions_;
  std::vector<block> blocks_;
  torch::nn::LayerNorm ln_;
  torch::nn::Linear head_;
};
TORCH_MODULE_IMPL(gpt, gpt_impl);

// Records one training run: model and optimizer creation, then `steps` optimizer steps.
gpumem::allocation_trace record(const config& c, bool checkpointed, int64_t k, bool bf16) {
  torch::manual_seed(0);
  gpumem::torch::cpu_trace_recorder recorder;
  {
    gpt model(c);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-4));
    gpumem::train::gradient_accumulator accumulate(optimizer, {static_cast<std::size_t>(k)});
    const int64_t micro = c.batch / k;
    for (int step = 0; step < c.steps; ++step) {
      for (int64_t i = 0; i < k; ++i) {
        torch::Tensor ids = torch::randint(c.vocab, {micro, c.seq}, torch::kLong);
        // logits outlives the autocast scope, as a Python loop's `out = model(x)` does.
        torch::Tensor logits, loss;
        {
          gpumem::train::autocast_guard amp(torch::kCPU, torch::kBFloat16, /*enabled=*/bf16);
          logits = model->forward(ids.narrow(1, 0, c.seq - 1), checkpointed);
          loss = torch::cross_entropy_loss(logits.reshape({-1, c.vocab}).to(torch::kFloat),
                                           ids.narrow(1, 1, c.seq - 1).reshape({-1}));
        }
        accumulate.backward(loss);
      }
    }
  }
  gpumem::allocation_trace trace = recorder.stop();
  trace.source = std::string("gpumem_train_traces gpt ") + (checkpointed ? "ckpt" : "nockpt") +
                 " k" + std::to_string(k) + (bf16 ? " bf16" : "");
  return trace;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]).rfind("--", 0) == 0) {
    std::cerr << "usage: gpumem_train_traces OUT_DIR [--layers N] [--width N] [--seq N] "
                 "[--batch N] [--steps N]\n";
    return 2;
  }
  const std::string out_dir = argv[1];
  config c;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const long long value = std::atoll(argv[i + 1]);
    if (value <= 0) {
      std::cerr << "gpumem_train_traces: " << key << " needs a positive number\n";
      return 2;
    }
    if (key == "--layers")
      c.layers = value;
    else if (key == "--width")
      c.width = value;
    else if (key == "--seq")
      c.seq = value;
    else if (key == "--batch")
      c.batch = value;
    else if (key == "--steps")
      c.steps = static_cast<int>(value);
    else {
      std::cerr << "gpumem_train_traces: unknown option " << key << "\n";
      return 2;
    }
  }
  if (c.batch % 4 != 0 || c.width % c.heads != 0) {
    std::cerr << "gpumem_train_traces: --batch must be a multiple of 4 and --width of 6\n";
    return 2;
  }
  torch::set_num_threads(2);
  for (bool bf16 : {false, true}) {
    for (bool checkpointed : {false, true}) {
      for (int64_t k : {1, 4}) {
        const auto start = std::chrono::steady_clock::now();
        const gpumem::allocation_trace trace = record(c, checkpointed, k, bf16);
        const std::string path = out_dir + "/gpt-" + (checkpointed ? "ckpt" : "nockpt") + "-k" +
                                 std::to_string(k) + (bf16 ? "-bf16" : "") + ".trace";
        std::ofstream out(path);
        gpumem::write_native_trace(out, trace);
        if (!out) {
          std::cerr << "gpumem_train_traces: cannot write " << path << "\n";
          return 1;
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::cout << path << ": " << trace.events.size() << " events (" << s << " s)\n";
      }
    }
  }
  return 0;
}
