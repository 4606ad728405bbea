// gpumem::nccl::nccl_communicator: the environment it starts from, and (on a GPU, label gpu) a
// one-rank all-reduce and segment registration with a real NCCL communicator.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/cuda_device.hpp"
#include "gpumem/nccl/communicator.hpp"
#include "gpumem/nccl/nccl_device.hpp"

namespace {

struct env_guard {
  explicit env_guard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
  }
  ~env_guard() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
  }
};

TEST(TorchrunEnvironment, ReadsTorchrunsVariables) {
  env_guard env({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29500"}});
  const auto e = gpumem::nccl::torchrun_environment::read();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(TorchrunEnvironment, NamesEveryMissingOrMalformedVariable) {
  env_guard env({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
  try {
    gpumem::nccl::torchrun_environment::read();
    FAIL() << "an incomplete environment was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("RANK=\"x\" is not a number"), std::string::npos) << what;
    EXPECT_NE(what.find("LOCAL_RANK is not set"), std::string::npos) << what;
    EXPECT_NE(what.find("MASTER_ADDR is not set"), std::string::npos) << what;
    EXPECT_NE(what.find("MASTER_PORT is not set"), std::string::npos) << what;
  }
  env_guard ranks({{"RANK", "2"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "0"},
                   {"MASTER_ADDR", "h"},
                   {"MASTER_PORT", "1"}});
  EXPECT_THROW(gpumem::nccl::torchrun_environment::read(), std::invalid_argument);
  EXPECT_THROW(gpumem::nccl::nccl_communicator::from_comm(nullptr), std::invalid_argument);
}

bool have_gpu() {
  return gpumem::cuda_device::device_count() > 0;
}

// ncclMemAlloc's out of memory (NCCL allocates with the driver and never sets the runtime's last
// error) is recognised, so that caching_allocator's free-and-retry runs; other failures are not.
TEST(NcclDevice, RecognisesNcclMemAllocsOutOfMemory) {
  using gpumem::nccl::detail::nccl_alloc_out_of_memory;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  EXPECT_FALSE(nccl_alloc_out_of_memory(ncclSuccess, cudaSuccess, 0, 64 * MiB));
  EXPECT_TRUE(nccl_alloc_out_of_memory(ncclUnhandledCudaError, cudaErrorMemoryAllocation,
                                       80000 * MiB, 64 * MiB));
  EXPECT_TRUE(nccl_alloc_out_of_memory(ncclUnhandledCudaError, cudaSuccess, 10 * MiB, 64 * MiB));
  EXPECT_TRUE(nccl_alloc_out_of_memory(ncclSystemError, cudaSuccess, 65 * MiB, 64 * MiB));
  EXPECT_FALSE(nccl_alloc_out_of_memory(ncclUnhandledCudaError, cudaSuccess, 8000 * MiB, 64 * MiB));
  EXPECT_FALSE(nccl_alloc_out_of_memory(ncclInvalidArgument, cudaSuccess, 0, 64 * MiB));
}

TEST(NcclOnGpu, OneRankAllReduceAverageAndRegistration) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA GPU (label gpu)";
  env_guard env({{"RANK", "0"},
                 {"WORLD_SIZE", "1"},
                 {"LOCAL_RANK", "0"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29511"}});
  auto comm = gpumem::nccl::nccl_communicator::from_environment();
  EXPECT_EQ(comm.world_size(), 1);
  std::vector<torch::Tensor> buckets{torch::full({1024}, 3.0, torch::kCUDA)};
  comm.all_reduce_average(buckets);
  EXPECT_EQ(buckets[0].sum().item<double>(), 3.0 * 1024);
  // gpumem's segments registered with the communicator while they exist.
  gpumem::cuda_device device(0);
  {
    gpumem::caching_allocator<gpumem::cuda_device> a(
        device, gpumem::allocator_config::parse("policy:classic"));
    gpumem::nccl::segment_registry registry(gpumem::nccl::nccl_registrar(comm.comm()));
    a.set_event_observer([&registry](const gpumem::allocator_event<cudaStream_t>& e) {
      registry.on_event(e.action, e.address, e.size);
    });
    void* p = a.allocate(64 << 20);
    EXPECT_EQ(registry.ranges().size(), 1u);
    a.deallocate(p);
    a.empty_cache();
    EXPECT_TRUE(registry.ranges().empty());
    a.set_event_observer({});
  }
  // ncclMemAlloc memory through gpumem.
  gpumem::nccl::nccl_device nccl_memory(0);
  gpumem::caching_allocator<gpumem::nccl::nccl_device> pool(nccl_memory,
                                                            gpumem::allocator_config::parse(""));
  void* q = pool.allocate(1 << 20);
  EXPECT_NE(q, nullptr);
  pool.deallocate(q);
}

}  // namespace
