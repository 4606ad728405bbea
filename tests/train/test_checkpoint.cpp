// gpumem::train::checkpoint and checkpoint_sequential on CPU tensors: gradients equal those without
// checkpointing, bit for bit (deterministic CPU ops), with dropout too.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>
#include <vector>

#include "gpumem/train/autocast.hpp"
#include "gpumem/train/checkpoint.hpp"

namespace {

using gpumem::train::autocast_guard;
using gpumem::train::autocast_state;
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

// --- Autocast (automatic mixed precision) -----------------------------------------------------

// One step's gradients with the forward under CPU autocast (bfloat16) and the backward outside it,
// as PyTorch recommends; the forward wrapped by `forward`.
template <class Forward>
std::vector<torch::Tensor> autocast_gradients(Forward forward) {
  torch::nn::Sequential model = make_model();
  model->train();
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({4, 16});
  torch::Tensor y;
  {
    autocast_guard amp(torch::kCPU, torch::kBFloat16);
    y = forward(model, x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);  // the last Linear ran in bfloat16
  y.to(torch::kFloat).pow(2).sum().backward();
  return grads_of(model);
}

TEST(CheckpointAutocast, GradientsEqualThoseWithoutCheckpointingUnderCpuBfloat16) {
  const auto plain =
      autocast_gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  const auto checkpointed = autocast_gradients([](torch::nn::Sequential& m, torch::Tensor x) {
    return checkpoint([&m](torch::Tensor in) { return m->forward(in); }, x);
  });
  expect_bitwise_equal(plain, checkpointed);
  const auto sequential = autocast_gradients(
      [](torch::nn::Sequential& m, torch::Tensor x) { return checkpoint_sequential(m, 3, x); });
  expect_bitwise_equal(plain, sequential);
}

TEST(CheckpointAutocast, ARecomputationInFloat32WouldGiveOtherGradients) {
  // The check above can fail: the same forward recomputed outside autocast (what backward sees
  // unless the state is restored) gives other gradients.
  const auto plain =
      autocast_gradients([](torch::nn::Sequential& m, torch::Tensor x) { return m->forward(x); });
  const auto float32 = autocast_gradients([](torch::nn::Sequential& m, torch::Tensor x) {
    torch::Tensor forward_result;
    {
      torch::NoGradGuard no_grad;
      forward_result = m->forward(x);  // the checkpoint's forward: bfloat16, nothing kept
    }
    torch::Tensor recomputed;
    {
      autocast_guard off(torch::kCPU, std::nullopt, /*enabled=*/false);
      recomputed = m->forward(x);  // a recomputation in float32, as backward would run it
    }
    return recomputed.to(torch::kBFloat16);
  });
  bool any_differs = false;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    any_differs |= !torch::equal(plain[i], float32[i]);
  }
  EXPECT_TRUE(any_differs);
}

// What the function saw each time it ran: CPU autocast on?, its dtype, the cast cache on?
struct seen_state {
  bool enabled;
  at::ScalarType dtype;
  bool cache;
};

TEST(CheckpointAutocast, TheRecomputationSeesTheForwardsStateAndBackwardKeepsItsOwn) {
  std::vector<seen_state> seen;
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  auto fn = [&](torch::Tensor in) {
    seen.push_back({at::autocast::is_autocast_enabled(torch::kCPU),
                    at::autocast::get_autocast_dtype(torch::kCPU),
                    at::autocast::is_autocast_cache_enabled()});
    return torch::mm(in, w);  // autocast casts mm to the lower-precision dtype
  };
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor y;
  {
    autocast_guard amp(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/false);
    y = checkpoint(fn, x);
  }
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  // Backward inside another autocast state: float16, cache on. The recomputation must not see it,
  // and backward's own state must be intact afterwards.
  {
    autocast_guard other(torch::kCPU, torch::kHalf, true, /*cache_enabled=*/true);
    y.to(torch::kFloat).sum().backward();
    const autocast_state after = autocast_state::capture();
    EXPECT_TRUE(after.enabled(torch::kCPU));
    EXPECT_EQ(after.dtype(torch::kCPU), torch::kHalf);
    EXPECT_TRUE(after.cache_enabled);
  }
  ASSERT_EQ(seen.size(), 2u);  // the forward and the recomputation
  for (const seen_state& s : seen) {
    EXPECT_TRUE(s.enabled);
    EXPECT_EQ(s.dtype, torch::kBFloat16);
    EXPECT_FALSE(s.cache);
  }
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
}

TEST(CheckpointAutocast, AForwardOutsideAutocastIsRecomputedOutsideIt) {
  std::vector<seen_state> seen;
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  torch::Tensor y = checkpoint(
      [&](torch::Tensor in) {
        seen.push_back({at::autocast::is_autocast_enabled(torch::kCPU),
                        at::autocast::get_autocast_dtype(torch::kCPU),
                        at::autocast::is_autocast_cache_enabled()});
        return torch::mm(in, w);
      },
      x);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  {
    autocast_guard amp(torch::kCPU, torch::kBFloat16);  // backward under autocast by mistake
    y.sum().backward();
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_FALSE(seen[1].enabled);
  // The same code without checkpointing, its backward under the same autocast.
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  torch::Tensor y2 = torch::mm(x2, w.detach());
  {
    autocast_guard amp(torch::kCPU, torch::kBFloat16);
    y2.sum().backward();
  }
  EXPECT_TRUE(torch::equal(x.grad(), x2.grad()));
}

TEST(AutocastGuard, NestsAndRestoresLikeTorchAutocast) {
  const autocast_state outside = autocast_state::capture();
  EXPECT_FALSE(outside.enabled(torch::kCPU));
  {
    autocast_guard a(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kBFloat16);
    {
      autocast_guard b(torch::kCPU, std::nullopt, /*enabled=*/false);
      EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
  }
  const autocast_state after = autocast_state::capture();
  EXPECT_FALSE(after.enabled(torch::kCPU));
  EXPECT_EQ(after.dtype(torch::kCPU), outside.dtype(torch::kCPU));
  EXPECT_EQ(after.cache_enabled, outside.cache_enabled);
  EXPECT_THROW(autocast_guard(c10::DeviceType::FPGA), c10::Error);
}

}  // namespace
