// gpumem::train::gradient_accumulator, dynamic_loss_scaler and in_process_communicator on CPU.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/graph_task.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpumem/train/accumulate.hpp"
#include "gpumem/train/communicator.hpp"

namespace {

using gpumem::train::accumulation_options;
using gpumem::train::dynamic_loss_scaler;
using gpumem::train::gradient_accumulator;
using gpumem::train::in_process_communicator;
using gpumem::train::in_process_group;

torch::nn::Sequential make_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 1));
}

std::vector<torch::Tensor> params_of(const torch::nn::Sequential& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                  double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol))
        << "tensor " << i << " differs by " << (a[i] - b[i]).abs().max().item<double>();
  }
}

torch::Tensor loss_of(torch::nn::Sequential& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(m->forward(x), y);  // a mean over the batch
}

// Records the gradients each optimizer step sees (SGD with lr 1: the parameter change).
TEST(GradientAccumulator, KMicroBatchesEqualOneBatchKTimesAsLarge) {
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({32, 8});
  const torch::Tensor y = torch::randn({32, 1});
  for (std::size_t k : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE(k);
    torch::nn::Sequential big = make_model();
    torch::optim::SGD big_opt(big->parameters(), 0.1);
    loss_of(big, x, y).backward();
    big_opt.step();

    torch::nn::Sequential small = make_model();
    torch::optim::SGD small_opt(small->parameters(), 0.1);
    gradient_accumulator acc(small_opt, {k});
    const int64_t b = 32 / static_cast<int64_t>(k);
    for (std::size_t i = 0; i < k; ++i) {
      const bool stepped = acc.backward(loss_of(small, x.narrow(0, static_cast<int64_t>(i) * b, b),
                                                y.narrow(0, static_cast<int64_t>(i) * b, b)));
      EXPECT_EQ(stepped, i + 1 == k);
      if (i + 1 < k) {
        EXPECT_EQ(acc.micro_step(), i + 1);
      }
    }
    EXPECT_EQ(acc.steps_taken(), 1u);
    expect_close(params_of(big), params_of(small));
    for (const auto& p : small->parameters()) {  // zeroed after the step
      EXPECT_TRUE(!p.grad().defined() || p.grad().abs().sum().item<double>() == 0.0);
    }
  }
}

TEST(GradientAccumulator, ClipsTheTrueNormAfterUnscaling) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({16, 8}) * 50;
  const torch::Tensor y = torch::randn({16, 1});
  // Reference: plain backward, clip to 0.5, step.
  torch::nn::Sequential ref = make_model();
  torch::optim::SGD ref_opt(ref->parameters(), 0.1);
  loss_of(ref, x, y).backward();
  const double norm_before = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.5);
  ASSERT_GT(norm_before, 0.5);  // clipping matters in this test
  ref_opt.step();
  // Accumulated in 2 micro-batches under a 1024x loss scale.
  torch::nn::Sequential m = make_model();
  torch::optim::SGD opt(m->parameters(), 0.1);
  dynamic_loss_scaler scaler(1024.0);
  gradient_accumulator acc(opt, {2, 0.5}, nullptr, &scaler);
  acc.backward(loss_of(m, x.narrow(0, 0, 8), y.narrow(0, 0, 8)));
  acc.backward(loss_of(m, x.narrow(0, 8, 8), y.narrow(0, 8, 8)));
  EXPECT_FALSE(acc.last_step_skipped());
  expect_close(params_of(ref), params_of(m), 1e-4, 1e-5);
}

TEST(DynamicLossScaler, SkipsTheStepOnOverflowBacksOffAndGrows) {
  torch::nn::Sequential m = make_model();
  torch::optim::SGD opt(m->parameters(), 0.1);
  dynamic_loss_scaler scaler(8.0, 2.0, 0.5, 2);
  gradient_accumulator acc(opt, {1}, nullptr, &scaler);
  const auto before = params_of(m);
  acc.backward(m->forward(torch::ones({1, 8})).sum() * std::numeric_limits<float>::infinity());
  EXPECT_TRUE(acc.last_step_skipped());
  EXPECT_EQ(acc.steps_taken(), 0u);
  expect_close(before, params_of(m), 0, 0);  // untouched
  EXPECT_EQ(scaler.scale(), 4.0);
  const torch::Tensor x = torch::randn({4, 8});
  acc.backward(m->forward(x).sum());
  EXPECT_EQ(scaler.scale(), 4.0);
  acc.backward(m->forward(x).sum());
  EXPECT_EQ(scaler.scale(), 8.0);  // two clean steps: grows
  EXPECT_EQ(acc.steps_taken(), 2u);
  EXPECT_THROW(dynamic_loss_scaler(0.0), std::invalid_argument);
  EXPECT_THROW(dynamic_loss_scaler(1.0, 1.0), std::invalid_argument);
}

TEST(GradientAccumulator, BadOptionsAreClearErrors) {
  torch::nn::Sequential m = make_model();
  torch::optim::SGD opt(m->parameters(), 0.1);
  try {
    gradient_accumulator acc(opt, {0});
    FAIL() << "K = 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("at least 1"), std::string::npos);
  }
  EXPECT_THROW(gradient_accumulator(opt, {1, -1.0}), std::invalid_argument);
  EXPECT_THROW(gradient_accumulator(opt, {1, std::nan("")}), std::invalid_argument);
  EXPECT_THROW(gradient_accumulator(opt, {1, 0.0, 0}), std::invalid_argument);
}

// Each rank trains on its own shard; after the window every rank holds the same parameters, equal
// to one process training on all shards' average gradient.
void data_parallel(int world, std::size_t k, std::size_t bucket_bytes, bool overlap = true) {
  torch::manual_seed(21);
  const torch::Tensor x = torch::randn({static_cast<int64_t>(world * k * 4), 8});
  const torch::Tensor y = torch::randn({static_cast<int64_t>(world * k * 4), 1});
  torch::nn::Sequential ref = make_model();
  torch::optim::SGD ref_opt(ref->parameters(), 0.1);
  loss_of(ref, x, y).backward();
  ref_opt.step();

  auto group = std::make_shared<in_process_group>(world);
  std::vector<std::vector<torch::Tensor>> results(static_cast<std::size_t>(world));
  std::vector<std::size_t> calls(static_cast<std::size_t>(world));
  // Models are made here, one after the other: their initialisation draws from the one global
  // random-number generator, which the rank threads must not race for.
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model());
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      torch::nn::Sequential m = models[static_cast<std::size_t>(r)];
      torch::optim::SGD opt(m->parameters(), 0.1);
      in_process_communicator comm(group, r);
      gradient_accumulator acc(opt, {k, 0.0, bucket_bytes, overlap}, &comm);
      const int64_t shard = static_cast<int64_t>(k * 4);
      for (std::size_t i = 0; i < k; ++i) {
        const int64_t begin = r * shard + static_cast<int64_t>(i) * 4;
        acc.backward(loss_of(m, x.narrow(0, begin, 4), y.narrow(0, begin, 4)));
        if (i + 1 < k) {
          EXPECT_EQ(acc.communicator_calls(), 0u);  // only at the boundary
        }
      }
      calls[static_cast<std::size_t>(r)] = acc.communicator_calls();
      results[static_cast<std::size_t>(r)] = params_of(m);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(calls[static_cast<std::size_t>(r)], 1u);
    expect_close(params_of(ref), results[static_cast<std::size_t>(r)]);
    for (std::size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(results[0][i], results[static_cast<std::size_t>(r)][i]));
    }
  }
}

TEST(InProcessCommunicator, TwoRanksAverageAtTheBoundary) {
  data_parallel(2, 4, 25u << 20);
}
TEST(InProcessCommunicator, ThreeRanksWithTinyBuckets) {
  data_parallel(3, 2, 64);
}
TEST(InProcessCommunicator, WithoutOverlapTheSameResults) {
  data_parallel(2, 4, 25u << 20, false);
  data_parallel(3, 2, 64, false);
}

TEST(InProcessCommunicator, MismatchedBucketsAreAnErrorOnEveryRank) {
  auto group = std::make_shared<in_process_group>(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      in_process_communicator comm(group, r);
      std::vector<torch::Tensor> buckets{torch::ones({r == 0 ? 4 : 5})};
      try {
        comm.all_reduce_average(buckets);
      } catch (const std::invalid_argument& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("bucket 0 has 5 elements on rank 1, 4 on rank 0"), std::string::npos) << e;
  }
  // The group is usable again afterwards.
  std::vector<std::thread> again;
  std::vector<double> values(2);
  for (int r = 0; r < 2; ++r) {
    again.emplace_back([&, r] {
      in_process_communicator comm(group, r);
      std::vector<torch::Tensor> buckets{torch::full({3}, static_cast<double>(r * 2))};
      comm.all_reduce_average(buckets);
      values[static_cast<std::size_t>(r)] = buckets[0][0].item<double>();
    });
  }
  for (auto& t : again) t.join();
  EXPECT_EQ(values, (std::vector<double>{1.0, 1.0}));
  EXPECT_THROW(in_process_communicator(group, 2), std::invalid_argument);
  EXPECT_THROW(in_process_group(0), std::invalid_argument);
}

TEST(InProcessCommunicator, AMissingRankTimesOut) {
  auto group = std::make_shared<in_process_group>(2, std::chrono::milliseconds(50));
  in_process_communicator comm(group, 0);
  std::vector<torch::Tensor> buckets{torch::ones({2})};
  EXPECT_THROW(comm.all_reduce_average(buckets), std::runtime_error);
}

// A communicator that fails: the error comes out of backward(), the optimizer does not step and
// the window's gradients are intact.
class failing_communicator final : public gpumem::train::communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce_average(std::vector<torch::Tensor>& buckets) override {
    for (auto& b : buckets) b.fill_(12345.0);  // garbage that must not reach the gradients
    throw std::runtime_error("link down");
  }
};

TEST(GradientAccumulator, AFailingCommunicatorLeavesTheWindowIntact) {
  torch::nn::Sequential m = make_model();
  torch::optim::SGD opt(m->parameters(), 0.1);
  failing_communicator comm;
  gradient_accumulator acc(opt, {1}, &comm);
  const auto before = params_of(m);
  torch::Tensor loss = m->forward(torch::randn({4, 8})).sum();
  try {
    acc.backward(loss);
    FAIL() << "the communicator's failure was swallowed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "link down");
  }
  EXPECT_EQ(acc.steps_taken(), 0u);
  expect_close(before, params_of(m), 0, 0);
  for (const auto& p : m->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_LT(p.grad().abs().max().item<double>(), 12345.0);
  }
}

// --- The loss scaler's fused kernels ------------------------------------------------------------

TEST(DynamicLossScaler, UnscalesEveryGradientAndFindsInfInAnyDtype) {
  dynamic_loss_scaler scaler(4.0);
  std::vector<torch::Tensor> params{
      torch::zeros({3}, torch::requires_grad()),
      torch::zeros({2}, torch::dtype(torch::kDouble).requires_grad(true)),
      torch::zeros({2}, torch::requires_grad())};
  params[0].mutable_grad() = torch::tensor({4.0f, 8.0f, -12.0f});
  params[1].mutable_grad() = torch::tensor({2.0, 6.0}, torch::kDouble);
  // params[2] has no gradient: skipped.
  torch::Tensor found = scaler.unscale_(params);
  ASSERT_TRUE(found.defined());
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(params[0].grad(), torch::tensor({1.0f, 2.0f, -3.0f})));
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::tensor({0.5, 1.5}, torch::kDouble)));
  params[1].mutable_grad() = torch::tensor({std::nan(""), 1.0}, torch::kDouble);
  EXPECT_TRUE(scaler.unscale(params));  // a NaN in the float64 group only
  params[1].mutable_grad() = torch::tensor({1.0, 1.0}, torch::kDouble);
  params[0].mutable_grad() = torch::tensor({1.0f, std::numeric_limits<float>::infinity(), 0.f});
  EXPECT_TRUE(scaler.unscale(params));
  std::vector<torch::Tensor> none{torch::zeros({1}, torch::requires_grad())};
  EXPECT_FALSE(scaler.unscale_(none).defined());
  EXPECT_FALSE(scaler.unscale(none));
}

TEST(DynamicLossScaler, TheScaleLivesInATensorAndUpdatesThere) {
  dynamic_loss_scaler scaler(16.0, 2.0, 0.25, 3);
  EXPECT_EQ(scaler.scale(), 16.0);
  EXPECT_FALSE(scaler.scale_tensor().defined());
  const torch::Tensor scaled = scaler.scale(torch::tensor(2.0f));
  EXPECT_EQ(scaled.item<float>(), 32.0f);
  ASSERT_TRUE(scaler.scale_tensor().defined());
  EXPECT_EQ(scaler.scale_tensor().scalar_type(), torch::kFloat);
  scaler.update(torch::ones({1}));  // overflow: backs off
  EXPECT_EQ(scaler.scale(), 4.0);
  for (int i = 0; i < 2; ++i) scaler.update(torch::zeros({1}));
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.update(false);  // the third clean step in a row: grows
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2.0);
}

// --- All-reduce overlapped with backward --------------------------------------------------------

// A deeper model: 6 Linear layers, so that small buckets make several of them.
torch::nn::Sequential make_deep_model() {
  torch::manual_seed(4);
  torch::nn::Sequential m;
  for (int i = 0; i < 6; ++i) {
    m->push_back(torch::nn::Linear(16, 16));
    m->push_back(torch::nn::Tanh());
  }
  m->push_back(torch::nn::Linear(16, 1));
  return m;
}

// Wraps a rank's communicator and notes, for each call, whether backward was running
// (the autograd engine's current graph task) and how many elements it averaged.
class observing_communicator final : public gpumem::train::communicator {
 public:
  explicit observing_communicator(gpumem::train::communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  void all_reduce_average(std::vector<torch::Tensor>& buckets) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_backward.push_back(torch::autograd::get_current_graph_task_id() != -1);
      for (const auto& b : buckets) numel.push_back(b.numel());
    }
    inner_.all_reduce_average(buckets);
  }
  std::vector<bool> in_backward;
  std::vector<int64_t> numel;

 private:
  gpumem::train::communicator& inner_;
  std::mutex mutex_;
};

struct overlap_result {
  std::vector<std::vector<bool>> in_backward;  // per rank, per call
  std::vector<std::size_t> bucket_count, launched_in_backward, reduced;
  std::vector<std::vector<torch::Tensor>> params;
};

// Two ranks train the deep model for `windows` windows of K = 3 micro-batches; `extra` is a
// module registered after the model that the forward never uses.
overlap_result run_overlap(bool overlap, std::size_t bucket_bytes, int windows, bool extra) {
  const int world = 2;
  const std::size_t k = 3;
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({world * 12, 16});
  const torch::Tensor y = torch::randn({world * 12, 1});
  auto group = std::make_shared<in_process_group>(world);
  overlap_result r;
  r.in_backward.resize(world);
  r.bucket_count.resize(world);
  r.launched_in_backward.resize(world);
  r.reduced.resize(world);
  r.params.resize(world);
  std::vector<torch::nn::Sequential> models;
  std::vector<torch::nn::Linear> unused;
  for (int i = 0; i < world; ++i) {
    models.push_back(make_deep_model());
    unused.push_back(torch::nn::Linear(4, 4));
  }
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      const auto ri = static_cast<std::size_t>(rank);
      torch::nn::Sequential m = models[ri];
      std::vector<torch::Tensor> params = m->parameters();
      if (extra) {
        for (const auto& p : unused[ri]->parameters()) params.push_back(p);
      }
      torch::optim::SGD opt(params, 0.05);
      in_process_communicator inner(group, rank);
      observing_communicator comm(inner);
      gradient_accumulator acc(opt, {k, 0.0, bucket_bytes, overlap}, &comm);
      for (int w = 0; w < windows; ++w) {
        for (std::size_t i = 0; i < k; ++i) {
          const int64_t begin = rank * 12 + static_cast<int64_t>(i) * 4;
          acc.backward(loss_of(m, x.narrow(0, begin, 4), y.narrow(0, begin, 4)));
          if (i + 1 < k) {
            EXPECT_TRUE(comm.in_backward.size() == static_cast<std::size_t>(w) * acc.bucket_count())
                << "a micro-batch before the boundary communicated";
          }
        }
      }
      r.in_backward[ri] = comm.in_backward;
      r.bucket_count[ri] = acc.bucket_count();
      r.launched_in_backward[ri] = acc.buckets_launched_in_backward();
      r.reduced[ri] = acc.buckets_reduced();
      for (const auto& p : params) r.params[ri].push_back(p.detach().clone());
    });
  }
  for (auto& t : ranks) t.join();
  return r;
}

TEST(AllReduceOverlap, EveryBucketStartsBeforeBackwardEnds) {
  // A 16x16 layer's weight and bias are 1088 bytes: 1100-byte buckets hold one layer each.
  const overlap_result r = run_overlap(true, 1100, 2, false);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const auto ri = static_cast<std::size_t>(rank);
    EXPECT_EQ(r.bucket_count[ri], 7u);
    EXPECT_EQ(r.reduced[ri], 14u);  // 7 buckets x 2 windows
    EXPECT_EQ(r.launched_in_backward[ri], 14u);
    ASSERT_EQ(r.in_backward[ri].size(), 14u);
    for (bool b : r.in_backward[ri]) EXPECT_TRUE(b);  // observed by the communicator itself
  }
  std::printf("all-reduce overlap: %zu of %zu buckets started before backward ended\n",
              r.launched_in_backward[0], r.reduced[0]);
}

TEST(AllReduceOverlap, WithoutOverlapNoBucketStartsInBackward) {
  // The control: the same run with overlap off is observed as such.
  const overlap_result r = run_overlap(false, 1100, 2, false);
  for (std::size_t ri = 0; ri < 2; ++ri) {
    EXPECT_EQ(r.reduced[ri], 14u);
    EXPECT_EQ(r.launched_in_backward[ri], 0u);
    for (bool b : r.in_backward[ri]) EXPECT_FALSE(b);
  }
}

TEST(AllReduceOverlap, SameParametersAsWithoutOverlapAndAsOneProcess) {
  const overlap_result with = run_overlap(true, 1100, 2, false);
  const overlap_result without = run_overlap(false, 1100, 2, false);
  for (std::size_t ri = 0; ri < 2; ++ri) {
    ASSERT_EQ(with.params[ri].size(), without.params[ri].size());
    for (std::size_t i = 0; i < with.params[ri].size(); ++i) {
      EXPECT_TRUE(torch::equal(with.params[ri][i], without.params[ri][i])) << i;
      EXPECT_TRUE(torch::equal(with.params[ri][i], with.params[0][i])) << i;
    }
  }
}

TEST(AllReduceOverlap, AnUnusedParameterIsAveragedAfterBackward) {
  // The unused Linear's parameters (registered last) form the first bucket: backward never
  // finalises them, so that bucket, and every later one, waits for the end of backward (buckets
  // go in the same order on every rank).
  const overlap_result r = run_overlap(true, 1100, 1, true);
  for (std::size_t ri = 0; ri < 2; ++ri) {
    EXPECT_EQ(r.bucket_count[ri], 7u);  // the unused layer shares the output layer's bucket
    EXPECT_EQ(r.reduced[ri], 7u);
    EXPECT_EQ(r.launched_in_backward[ri], 0u);
  }
  // Nothing hangs and the gradients are those of the run without overlap:
  const overlap_result ref = run_overlap(false, 1100, 1, true);
  for (std::size_t i = 0; i < r.params[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(r.params[0][i], ref.params[0][i])) << i;
  }
}

TEST(AllReduceOverlap, OneLargeBucketStartsInBackwardToo) {
  const overlap_result r = run_overlap(true, 25u << 20, 1, false);
  EXPECT_EQ(r.bucket_count[0], 1u);
  EXPECT_EQ(r.launched_in_backward[0], 1u);
}

}  // namespace
