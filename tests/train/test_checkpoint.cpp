// gpumem::train::checkpoint and checkpoint_sequential on CPU tensors: gradients equal those without
// checkpointing, bit for bit (deterministic CPU ops), with dropout too.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>
#include <vector>

#include "gpumem/train/checkpoint.hpp"

namespace {

using gpumem::train::checkpoint;
using gpumem::train::checkpoint_sequential;

torch::nn::Sequential make_model() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::GELU(),
                               torch::nn::Dropout(0.3), torch::nn::Linear(32, 32),
                               torch::nn::Tanh(), torch::nn::Dropout(0.2),
                               torch::nn::Linear(32, 8));
}

std::vector<torch::Tensor> grads_of(const torch::nn::Sequential& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

void expect_bitwise_equal(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "gradient " << i << " differs";
  }
}

// One training step's gradients, the model's forward wrapped by `forward`.
template <class Forward>
std::vector<torch::Tensor> gradients(Forward forward) {
  torch::nn::Sequential model = make_model();
  model->train();
  torch::manual_seed(7);  // the dropout masks
  torch::Tensor x = torch::randn({4, 16});
  torch::Tensor y = forward(model, x);
  y.pow(2).sum().backward();
  return grads_of(model);
}

TEST(Checkpoint, GradientsEqualThoseWithoutCheckpointingWithDropout) {
  const auto plain =
      gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  const auto checkpointed = gradients([](torch::nn::Sequential& m, torch::Tensor x) {
    return checkpoint([&m](torch::Tensor in) { return m->forward(in); }, x);
  });
  expect_bitwise_equal(plain, checkpointed);
}

TEST(Checkpoint, WithoutRestoringTheRandomStateDropoutWouldDiffer) {
  // The check above can fail: recomputing with a different random state changes the gradients.
  const auto plain =
      gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  const auto reseeded = gradients([](torch::nn::Sequential& m, torch::Tensor x) {
    {
      torch::NoGradGuard no_grad;
      m->forward(x);  // a forward that draws dropout masks, as checkpoint's does
    }
    return m->forward(x);  // a recomputation that would draw the next masks
  });
  bool any_differs = false;
  for (std::size_t i = 0; i < plain.size(); ++i)
    any_differs |= !torch::equal(plain[i], reseeded[i]);
  EXPECT_TRUE(any_differs);
}

TEST(Checkpoint, TheForwardKeepsNoActivations) {
  torch::nn::Sequential model = make_model();
  torch::Tensor x = torch::randn({4, 16}, torch::requires_grad());
  torch::Tensor y = checkpoint([&model](torch::Tensor in) { return model->forward(in); }, x);
  // The graph holds one checkpoint node, whose inputs are x and checkpoint's anchor: none of
  // the model's intermediate results is kept.
  ASSERT_TRUE(y.grad_fn());
  EXPECT_NE(y.grad_fn()->name().find("checkpoint_function"), std::string::npos)
      << y.grad_fn()->name();
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 2u);
}

TEST(Checkpoint, InputsThatDoNotRequireGradGetNoGradient) {
  torch::Tensor a = torch::randn({3, 3}, torch::requires_grad());
  torch::Tensor b = torch::randn({3, 3});  // data, no grad
  torch::Tensor y =
      checkpoint([](torch::Tensor p, torch::Tensor q) { return (p * q).tanh(); }, a, b);
  y.sum().backward();
  ASSERT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  torch::Tensor a2 = a.detach().clone().requires_grad_(true);
  (a2 * b).tanh().sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), a2.grad()));
}

TEST(Checkpoint, SeveralOutputs) {
  torch::Tensor a = torch::randn({5}, torch::requires_grad());
  torch::Tensor b = torch::randn({5}, torch::requires_grad());
  auto outs = checkpoint(
      [](torch::Tensor p, torch::Tensor q) {
        return std::vector<torch::Tensor>{p.sin() * q, p + q.exp()};
      },
      a, b);
  ASSERT_EQ(outs.size(), 2u);
  (outs[0].sum() * 2 + outs[1].pow(2).sum()).backward();
  torch::Tensor a2 = a.detach().clone().requires_grad_(true);
  torch::Tensor b2 = b.detach().clone().requires_grad_(true);
  ((a2.sin() * b2).sum() * 2 + (a2 + b2.exp()).pow(2).sum()).backward();
  EXPECT_TRUE(torch::equal(a.grad(), a2.grad()));
  EXPECT_TRUE(torch::equal(b.grad(), b2.grad()));
}

TEST(Checkpoint, OnlyOneOfSeveralOutputsUsed) {
  torch::Tensor a = torch::randn({5}, torch::requires_grad());
  auto outs = checkpoint(
      [](torch::Tensor p) {
        return std::vector<torch::Tensor>{p * 3, p.cos()};
      },
      a);
  outs[1].sum().backward();
  EXPECT_TRUE(torch::allclose(a.grad(), -a.detach().sin()));
}

TEST(Checkpoint, Nested) {
  const auto plain =
      gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  const auto nested = gradients([](torch::nn::Sequential& m, torch::Tensor x) {
    return checkpoint(
        [&m](torch::Tensor in) {
          torch::Tensor h = checkpoint([&m](torch::Tensor t) { return m->forward(t); }, in);
          return h;
        },
        x);
  });
  expect_bitwise_equal(plain, nested);
}

TEST(CheckpointSequential, GradientsEqualThePlainModelForEverySegmentCount) {
  const auto plain =
      gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  for (std::size_t segments = 1; segments <= 7; ++segments) {
    SCOPED_TRACE(segments);
    const auto split = gradients([segments](torch::nn::Sequential& m, torch::Tensor x) {
      return checkpoint_sequential(m, segments, x);
    });
    expect_bitwise_equal(plain, split);
  }
}

TEST(CheckpointSequential, BadSegmentCountsAreClearErrors) {
  torch::nn::Sequential model = make_model();
  torch::Tensor x = torch::randn({2, 16});
  EXPECT_THROW(checkpoint_sequential(model, 0, x), std::invalid_argument);
  try {
    checkpoint_sequential(model, 8, x);
    FAIL() << "8 segments of 7 modules";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("8 segments for 7 modules"), std::string::npos);
  }
  EXPECT_THROW(checkpoint(gpumem::train::tensor_list_fn{}, {x}), std::invalid_argument);
}

}  // namespace
