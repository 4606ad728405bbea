// gpumem-nccl-bandwidth: the all-reduce bandwidth check people run before a multi-GPU job, with
// plain cudaMalloc buffers and with buffers served by gpumem and registered with NCCL
// (gpumem::nccl::segment_registry). One process drives every visible GPU (ncclCommInitAll).
//
//   gpumem-nccl-bandwidth [--min 1MiB] [--max 1GiB] [--iters 20] [--gpus N]
//
// Prints, per size, the time of one ncclAllReduce(sum, float) and the algorithm and bus bandwidth
// (bus = algorithm x 2(n-1)/n, NCCL's own convention), for both kinds of buffer. Exit status 2
// without a GPU or for bad arguments.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "command_line.hpp"
#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/device/cuda_device.hpp"
#include "gpumem/nccl/segment_registry.hpp"

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

using gpu_allocator = gpumem::caching_allocator<gpumem::cuda_device>;

struct rank_state {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::unique_ptr<gpumem::cuda_device> gpu;
  std::unique_ptr<gpu_allocator> allocator;
  std::unique_ptr<gpumem::nccl::segment_registry> registry;
};

// Milliseconds of one all-reduce of `bytes` on every rank's buffer, averaged over `iters`.
double time_all_reduce(std::vector<rank_state>& ranks, std::vector<void*>& buffers,
                       std::size_t bytes, int iters) {
  const std::size_t count = bytes / sizeof(float);
  auto launch = [&] {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      nccl_check(ncclAllReduce(buffers[r], buffers[r], count, ncclFloat, ncclSum, ranks[r].comm,
                               ranks[r].stream),
                 "ncclAllReduce");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  };
  for (int i = 0; i < 3; ++i) launch();  // warm-up
  for (auto& r : ranks) {
    cuda_check(cudaSetDevice(r.device), "cudaSetDevice");
    cuda_check(cudaEventRecord(r.start, r.stream), "cudaEventRecord");
  }
  for (int i = 0; i < iters; ++i) launch();
  double worst = 0;
  for (auto& r : ranks) {
    cuda_check(cudaSetDevice(r.device), "cudaSetDevice");
    cuda_check(cudaEventRecord(r.stop, r.stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(r.stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime");
    worst = std::max(worst, static_cast<double>(ms) / iters);
  }
  return worst;
}

int run(int argc, char** argv) {
  std::size_t min_bytes = std::size_t{1} << 20;
  std::size_t max_bytes = std::size_t{1} << 30;
  int iters = 20;
  int gpus = 0;
  gpumem_tools::command_line cl(argc, argv, "gpumem-nccl-bandwidth");
  while (cl.next()) {
    if (cl.is("--help") || cl.is("-h")) {
      cl.no_value();
      std::printf(
          "usage: gpumem-nccl-bandwidth [--min 1MiB] [--max 1GiB] [--iters 20] [--gpus N]\n"
          "  --gpus N   the first N visible GPUs (default: all of them)\n");
      return 0;
    } else if (cl.is("--min")) {
      min_bytes = static_cast<std::size_t>(cl.size_value());
    } else if (cl.is("--max")) {
      max_bytes = static_cast<std::size_t>(cl.size_value());
    } else if (cl.is("--iters")) {
      iters = static_cast<int>(cl.unsigned_value(1000000));
    } else if (cl.is("--gpus")) {
      gpus = static_cast<int>(cl.unsigned_value(1024));
    } else {
      cl.unknown();
    }
  }
  if (min_bytes < 4 || max_bytes < min_bytes || iters < 1) {
    cl.fail("need 4 B <= --min <= --max and --iters >= 1");
  }
  int visible = gpumem::cuda_device::device_count();
  if (visible == 0) {
    std::fprintf(stderr, "gpumem-nccl-bandwidth: no CUDA GPU\n");
    return 2;
  }
  const int n = gpus == 0 ? visible : std::min(gpus, visible);
  std::vector<int> devices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices[static_cast<std::size_t>(i)] = i;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<rank_state> ranks(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    rank_state& r = ranks[static_cast<std::size_t>(i)];
    r.device = i;
    r.comm = comms[static_cast<std::size_t>(i)];
    cuda_check(cudaSetDevice(i), "cudaSetDevice");
    cuda_check(cudaStreamCreate(&r.stream), "cudaStreamCreate");
    cuda_check(cudaEventCreate(&r.start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&r.stop), "cudaEventCreate");
    r.gpu = std::make_unique<gpumem::cuda_device>(i);
    r.allocator =
        std::make_unique<gpu_allocator>(*r.gpu, gpumem::allocator_config::parse("policy:classic"));
    r.registry = std::make_unique<gpumem::nccl::segment_registry>(gpumem::nccl::registrar{
        [comm = r.comm](void* p, std::size_t size) {
          void* h = nullptr;
          nccl_check(ncclCommRegister(comm, p, size, &h), "ncclCommRegister");
          return h;
        },
        [comm = r.comm](void* h) {
          nccl_check(ncclCommDeregister(comm, h), "ncclCommDeregister");
        }});
    r.allocator->set_event_observer(
        [reg = r.registry.get()](const gpumem::allocator_event<cudaStream_t>& e) {
          reg->on_event(e.action, e.address, e.size);
        });
  }
  std::printf("gpumem-nccl-bandwidth: %d GPU(s), ncclAllReduce(sum, float), %d iterations\n", n,
              iters);
  std::printf("%12s | %10s %10s %10s | %10s %10s %10s | %s\n", "size", "plain ms", "algbw GB/s",
              "busbw GB/s", "gpumem ms", "algbw GB/s", "busbw GB/s", "gpumem/plain time");
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    std::vector<void*> plain(ranks.size()), pooled(ranks.size());
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      cuda_check(cudaSetDevice(ranks[r].device), "cudaSetDevice");
      cuda_check(cudaMalloc(&plain[r], bytes), "cudaMalloc");
      pooled[r] = ranks[r].allocator->allocate(bytes, ranks[r].stream);
    }
    const double t_plain = time_all_reduce(ranks, plain, bytes, iters);
    const double t_pooled = time_all_reduce(ranks, pooled, bytes, iters);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      cuda_check(cudaSetDevice(ranks[r].device), "cudaSetDevice");
      cuda_check(cudaFree(plain[r]), "cudaFree");
      ranks[r].allocator->deallocate(pooled[r]);
    }
    auto gbps = [bytes](double ms) { return static_cast<double>(bytes) / (ms * 1e6); };
    std::printf("%12s | %10.3f %10.2f %10.2f | %10.3f %10.2f %10.2f | %.3f\n",
                gpumem::format_bytes(bytes).c_str(), t_plain, gbps(t_plain),
                gbps(t_plain) * bus_factor, t_pooled, gbps(t_pooled), gbps(t_pooled) * bus_factor,
                t_pooled / t_plain);
  }
  for (auto& r : ranks) {
    r.allocator->set_event_observer({});
    r.registry.reset();
    r.allocator.reset();
    (void)ncclCommDestroy(r.comm);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-nccl-bandwidth: %s\n", e.what());
    return 1;
  }
}
