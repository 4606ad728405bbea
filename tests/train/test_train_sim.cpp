// gpumem/train on CUDA tensors, LibTorch on the CUDA simulator (tools/cudasim) with gpumem as
// PyTorch's CUDA allocator: checkpoint's recomputation under CUDA autocast, the host
// synchronisations of a training step with the loss scaler, and the stream ordering of all-reduce
// overlapped with backward.
//
// The simulator's kernels compute nothing, so values are not checked here (the CPU tests do);
// what is checked is what the GPU would see: dtypes, the calls that make the host wait, and the
// order of work on streams — the simulator reports a race between unordered streams. The test
// runs with GPUMEM_SIM_STRICT=off and reads the violation counters itself, so that its control
// can show that a missing ordering is caught.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpumem/torch/cuda_allocator.hpp"
#include "gpumem/train/accumulate.hpp"
#include "gpumem/train/autocast.hpp"
#include "gpumem/train/checkpoint.hpp"
#include "sim_training.hpp"

namespace {

using gpumem::train::accumulation_options;
using gpumem::train::autocast_guard;
using gpumem::train::checkpoint;
using gpumem::train::dynamic_loss_scaler;
using gpumem::train::gradient_accumulator;

using gpumem_train_sim::host_syncs;

gpumemSimCounters sim() {
  gpumemSimCounters c{};
  if (!gpumem_train_sim::read_counters(c)) ADD_FAILURE() << "not running on the simulator";
  return c;
}

const torch::Device cuda(torch::kCUDA, 0);

class OnSimulator : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(torch::cuda::is_available());
    ASSERT_NE(gpumem::torch::installed(), nullptr);
    violations_ = sim().violations;
  }
  void TearDown() override {
    torch::cuda::synchronize();
    EXPECT_EQ(sim().violations, violations_) << "the simulator reported a violation";
  }
  unsigned long long violations_ = 0;
};

// --- Checkpoint under CUDA autocast ----------------------------------------------------------

struct seen_state {
  bool cuda_enabled;
  at::ScalarType cuda_dtype;
  at::ScalarType prelu_dtype;  // what autocast made of an op on its lower-precision list
};

TEST_F(OnSimulator, CheckpointRecomputesUnderTheForwardsCudaAutocast) {
  std::vector<seen_state> seen;
  torch::Tensor w = torch::full({1}, 0.25, torch::TensorOptions().device(cuda).requires_grad(true));
  auto fn = [&](torch::Tensor in) {
    torch::Tensor h = torch::prelu(in, w);  // on autocast's float16 list; no cuBLAS
    seen.push_back({at::autocast::is_autocast_enabled(torch::kCUDA),
                    at::autocast::get_autocast_dtype(torch::kCUDA), h.scalar_type()});
    return h * 2;
  };
  torch::Tensor x = torch::ones({64}, torch::TensorOptions().device(cuda).requires_grad(true));
  torch::Tensor y;
  {
    autocast_guard amp(torch::kCUDA, torch::kHalf);
    y = checkpoint(fn, x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kHalf);
  y.sum().backward();  // outside autocast; CUDA backward runs on the autograd engine's thread
  ASSERT_EQ(seen.size(), 2u);
  for (const seen_state& s : seen) {
    EXPECT_TRUE(s.cuda_enabled);
    EXPECT_EQ(s.cuda_dtype, torch::kHalf);
    EXPECT_EQ(s.prelu_dtype, torch::kHalf);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCUDA));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
}

TEST_F(OnSimulator, WithoutCheckpointBackwardRunsOutsideAutocast) {
  // The control: what backward itself sees is not the forward's state, so the recomputation's
  // float16 above comes from checkpoint restoring it.
  bool enabled_in_backward = true;
  torch::Tensor x = torch::ones({64}, torch::TensorOptions().device(cuda).requires_grad(true));
  torch::Tensor y;
  {
    autocast_guard amp(torch::kCUDA, torch::kHalf);
    y = x * 3;
  }
  y.register_hook([&](torch::Tensor g) {
    enabled_in_backward = at::autocast::is_autocast_enabled(torch::kCUDA);
    return g;
  });
  y.sum().backward();
  EXPECT_FALSE(enabled_in_backward);
}

// --- Host synchronisations of a step with the loss scaler ------------------------------------

using gpumem_train_sim::elementwise;

// Host synchronisations per optimizer step, averaged over `steps` steps after a warm-up step.
double syncs_per_step(gradient_accumulator& acc, elementwise& model, std::size_t k, int steps) {
  const torch::Tensor x = torch::ones({8, 256}, torch::TensorOptions().device(cuda));
  const double per_step = gpumem_train_sim::syncs_per_step(acc, model, x, k, steps);
  EXPECT_GE(per_step, 0.0) << "not running on the simulator";
  return per_step;
}

TEST_F(OnSimulator, AStepWithTheLossScalerSynchronisesTheHostOnce) {
  elementwise model(8, 256);  // 16 gradients
  model->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.01);
  dynamic_loss_scaler scaler;
  gradient_accumulator acc(opt, {2, /*max_grad_norm=*/1.0}, nullptr, &scaler);
  const double per_step = syncs_per_step(acc, model, 2, 5);
  std::printf("host synchronisations per step (16 gradients, K = 2, scaler + clipping): %.1f\n",
              per_step);
  EXPECT_EQ(per_step, 1.0);
  EXPECT_EQ(scaler.scale_tensor().device(), cuda);
}

TEST_F(OnSimulator, WithoutTheLossScalerAStepNeverSynchronises) {
  elementwise model(8, 256);
  model->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.01);
  gradient_accumulator acc(opt, {2, 1.0});
  EXPECT_EQ(syncs_per_step(acc, model, 2, 5), 0.0);
}

TEST_F(OnSimulator, APerGradientCheckWouldSynchroniseOncePerGradient) {
  // The control, and the cost of the check this scaler replaced (a read per gradient): the counter
  // sees each read.
  elementwise model(8, 256);
  model->to(cuda);
  const torch::Tensor x = torch::ones({8, 256}, torch::TensorOptions().device(cuda));
  (model->forward(x).pow(2).mean() * 65536.0).backward();
  const unsigned long long before = host_syncs(sim());
  // Finite gradients are the common case: every one is read (the simulator's values are not
  // computed, so the loop reads them all rather than stop at the first that looks infinite).
  bool found_inf = false;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model->parameters()) {
      torch::Tensor g = p.grad();
      g.div_(65536.0);
      found_inf = !torch::isfinite(g).all().item<bool>() || found_inf;
    }
  }
  const unsigned long long per_step = host_syncs(sim()) - before;
  std::printf("host synchronisations of a per-gradient check (16 gradients): %llu\n", per_step);
  EXPECT_EQ(per_step, 16u);
}

// --- All-reduce overlapped with backward: streams ----------------------------------------------

// Stands for NCCL, which enqueues on the current stream: two device-to-device copies of each
// bucket on the current stream (copies are what the simulator tracks), noting the stream.
class loopback_communicator final : public gpumem::train::communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce_average(std::vector<torch::Tensor>& buckets) override {
    streams.push_back(c10::cuda::getCurrentCUDAStream().id());
    for (torch::Tensor& b : buckets) b.copy_(b.clone());
  }
  std::vector<c10::StreamId> streams;
};

TEST_F(OnSimulator, BucketsAreReducedOnACommunicationStreamInOrder) {
  elementwise model(6, 4096);  // 16 KiB per gradient
  model->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.01);
  loopback_communicator comm;
  auto* gpumem_allocator = gpumem::torch::installed();
  const auto allocated = [&] {
    return gpumem_allocator->default_pool(0).stats().allocated_bytes[0].current;
  };
  gradient_accumulator acc(opt, {2, 0.0, /*bucket_bytes=*/32 << 10}, &comm);
  EXPECT_EQ(acc.bucket_count(), 6u);  // weight and bias of one layer per bucket
  const torch::Tensor x = torch::ones({4, 4096}, torch::TensorOptions().device(cuda));
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 2; ++i) acc.backward(model->forward(x).pow(2).mean());
  }
  EXPECT_EQ(acc.buckets_reduced(), 18u);
  EXPECT_EQ(acc.buckets_launched_in_backward(), 18u);
  ASSERT_EQ(comm.streams.size(), 18u);
  const c10::StreamId compute = c10::cuda::getCurrentCUDAStream().id();
  for (c10::StreamId s : comm.streams) {
    EXPECT_NE(s, compute);
    EXPECT_EQ(s, comm.streams.front());
  }
  // The buckets are gpumem's memory, in its statistics.
  torch::cuda::synchronize();
  const auto with_buckets = allocated();
  EXPECT_EQ(acc.bucket_buffer_bytes(), 6u * 2 * 4096 * 4);
  for (const torch::Tensor& b : acc.bucket_buffers()) {
    EXPECT_EQ(gpumem_allocator->default_pool(0).owns(b.data_ptr()), true);
  }
  EXPECT_GE(static_cast<std::size_t>(with_buckets), acc.bucket_buffer_bytes());
}

TEST_F(OnSimulator, TheBucketsAreFreedThroughGpumem) {
  elementwise model(2, 4096);
  model->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.01);
  loopback_communicator comm;
  auto& pool = gpumem::torch::installed()->default_pool(0);
  const torch::Tensor x = torch::ones({4, 4096}, torch::TensorOptions().device(cuda));
  torch::cuda::synchronize();
  const auto before = pool.stats().allocated_bytes[0].current;
  std::size_t bucket_bytes = 0;
  {
    gradient_accumulator acc(opt, {1}, &comm);
    acc.backward(model->forward(x).pow(2).mean());
    bucket_bytes = acc.bucket_buffer_bytes();
    torch::cuda::synchronize();
    EXPECT_EQ(static_cast<std::size_t>(pool.stats().allocated_bytes[0].current - before),
              bucket_bytes);
  }
  EXPECT_EQ(bucket_bytes, 2u * 2 * 4096 * 4);
  torch::cuda::synchronize();
  EXPECT_EQ(pool.stats().allocated_bytes[0].current, before);
}

TEST(SimulatorControl, AMissingStreamOrderIsCounted) {
  // The control for the stream checks above: a bucket filled on one stream and copied on another
  // without ordering is a race the simulator reports (the tests above would see it).
  const unsigned long long before = sim().violations_race;
  torch::Tensor grad = torch::ones({1024}, torch::TensorOptions().device(cuda));
  torch::Tensor flat = torch::empty({1024}, torch::TensorOptions().device(cuda));
  flat.copy_(grad);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    flat.copy_(flat.clone());  // no wait for the copy above
  }
  torch::cuda::synchronize();
  EXPECT_GE(sim().violations_race - before, 1u);
}

class InstallGpumem : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* conf = std::getenv("GPUMEM_TRAIN_SIM_CONF");
    gpumem::torch::install(conf == nullptr ? "" : conf);
  }
};

const auto* const install_once = ::testing::AddGlobalTestEnvironment(new InstallGpumem);

}  // namespace
