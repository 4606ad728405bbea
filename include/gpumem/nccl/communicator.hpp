// gpumem — NCCL for the training helpers: a gpumem::train::communicator that averages gradient
// buckets with ncclAllReduce(ncclAvg) inside one group call, set up from torchrun's environment or
// around an existing ncclComm_t (c10d's ProcessGroupNCCL's, for one); and nccl_registrar, which
// makes a segment_registry register gpumem's segments with a communicator.
//
//   auto comm = gpumem::nccl::nccl_communicator::from_environment();   // under torchrun
//   gpumem::train::gradient_accumulator acc(optimizer, {4}, &comm);
//
// Needs NCCL >= 2.19 (ncclCommRegister, ncclMemAlloc), the CUDA runtime and LibTorch (CUDA).
// Thread safety: a communicator is used by one thread at a time (NCCL's rule). Errors:
// nccl_error (a std::runtime_error naming the call and NCCL's message), std::invalid_argument for
// a bad environment or tensors NCCL cannot reduce.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpumem/nccl/detail/tcp_rendezvous.hpp"
#include "gpumem/nccl/segment_registry.hpp"
#include "gpumem/train/communicator.hpp"

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>) && defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define GPUMEM_NCCL_HAS_C10D 1
#endif

namespace gpumem::nccl {

/// An NCCL call failed.
class nccl_error : public std::runtime_error {
 public:
  nccl_error(ncclResult_t result, const std::string& call)
      : std::runtime_error("gpumem::nccl: " + call + " failed: " + ncclGetErrorString(result)),
        result_(result) {}
  ncclResult_t result() const noexcept { return result_; }

 private:
  ncclResult_t result_;
};

namespace detail {
inline void check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess && result != ncclInProgress) throw nccl_error(result, call);
}

inline ncclDataType_t nccl_type(const ::torch::Tensor& t) {
  switch (t.scalar_type()) {
    case ::torch::kFloat:
      return ncclFloat32;
    case ::torch::kDouble:
      return ncclFloat64;
    case ::torch::kHalf:
      return ncclFloat16;
    case ::torch::kBFloat16:
      return ncclBfloat16;
    case ::torch::kInt:
      return ncclInt32;
    case ::torch::kLong:
      return ncclInt64;
    default:
      throw std::invalid_argument(std::string("gpumem::nccl: cannot average tensors of type ") +
                                  c10::toString(t.scalar_type()));
  }
}
}  // namespace detail

/// torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct torchrun_environment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;

  /// Reads them; throws std::invalid_argument naming each missing or malformed variable.
  static torchrun_environment read() {
    torchrun_environment e;
    std::string problems;
    auto number = [&](const char* name, int& out) {
      const char* v = std::getenv(name);
      char* end = nullptr;
      const long n = v != nullptr ? std::strtol(v, &end, 10) : 0;
      if (v == nullptr || *v == '\0' || *end != '\0' || n < 0 || n > 1 << 30) {
        problems += std::string(problems.empty() ? "" : ", ") + name +
                    (v == nullptr ? " is not set" : "=\"" + std::string(v) + "\" is not a number");
        return;
      }
      out = static_cast<int>(n);
    };
    number("RANK", e.rank);
    number("WORLD_SIZE", e.world_size);
    number("LOCAL_RANK", e.local_rank);
    number("MASTER_PORT", e.master_port);
    const char* addr = std::getenv("MASTER_ADDR");
    if (addr == nullptr || *addr == '\0') {
      problems += std::string(problems.empty() ? "" : ", ") + "MASTER_ADDR is not set";
    } else {
      e.master_addr = addr;
    }
    if (problems.empty() && e.rank >= e.world_size) {
      problems =
          "RANK " + std::to_string(e.rank) + " >= WORLD_SIZE " + std::to_string(e.world_size);
    }
    if (!problems.empty()) {
      throw std::invalid_argument("gpumem::nccl: torchrun's environment is incomplete: " +
                                  problems + " (launch with torchrun, or set them)");
    }
    return e;
  }
};

/// Averages buckets across ranks with NCCL; see the top of the file.
class nccl_communicator final : public train::communicator {
 public:
  /// Under torchrun: selects GPU LOCAL_RANK, exchanges NCCL's unique id from rank 0 over TCP on
  /// MASTER_ADDR:(MASTER_PORT + port_offset) — MASTER_PORT itself is c10d's store — and creates
  /// the communicator. Throws std::invalid_argument, std::runtime_error (rendezvous), nccl_error.
  static nccl_communicator from_environment(
      int port_offset = 1, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
    const torchrun_environment env = torchrun_environment::read();
    if (cudaSetDevice(env.local_rank) != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::invalid_argument("gpumem::nccl: cannot select GPU LOCAL_RANK=" +
                                  std::to_string(env.local_rank));
    }
    ncclUniqueId id{};
    if (env.rank == 0) detail::check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<char> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    detail::exchange(env.rank, env.world_size, env.master_addr, env.master_port + port_offset,
                     bytes, timeout);
    std::memcpy(&id, bytes.data(), sizeof id);
    ncclComm_t comm = nullptr;
    detail::check(ncclCommInitRank(&comm, env.world_size, id, env.rank), "ncclCommInitRank");
    return nccl_communicator(comm, true);
  }

  /// Uses `comm` (not owned: the caller destroys it after this object).
  static nccl_communicator from_comm(ncclComm_t comm) {
    if (comm == nullptr) throw std::invalid_argument("gpumem::nccl: null ncclComm_t");
    return nccl_communicator(comm, false);
  }

#ifdef GPUMEM_NCCL_HAS_C10D
  /// Uses the communicator of c10d's ProcessGroupNCCL for the current device (it exists once
  /// the group ran a collective on that device; not owned).
  static nccl_communicator from_process_group(c10d::ProcessGroupNCCL& group) {
    return from_comm(reinterpret_cast<ncclComm_t>(group.getCommPtr()));
  }
#endif

  nccl_communicator(nccl_communicator&& o) noexcept : comm_(o.comm_), owned_(o.owned_) {
    o.comm_ = nullptr;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  ~nccl_communicator() override {
    if (owned_ && comm_ != nullptr) (void)ncclCommDestroy(comm_);
  }

  ncclComm_t comm() const noexcept {
    return comm_;
  }

  int rank() const override {
    int r = 0;
    detail::check(ncclCommUserRank(comm_, &r), "ncclCommUserRank");
    return r;
  }
  int world_size() const override {
    int n = 0;
    detail::check(ncclCommCount(comm_, &n), "ncclCommCount");
    return n;
  }

  /// ncclAllReduce(ncclAvg) of every bucket, in place, in one group call on the buckets' device's
  /// current stream. Buckets must be contiguous CUDA tensors.
  void all_reduce_average(std::vector<::torch::Tensor>& buckets) override {
    if (buckets.empty()) return;
    for (const ::torch::Tensor& b : buckets) {
      if (!b.is_cuda() || !b.is_contiguous()) {
        throw std::invalid_argument("gpumem::nccl: buckets must be contiguous CUDA tensors");
      }
    }
    const c10::cuda::CUDAGuard guard(buckets.front().device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    detail::check(ncclGroupStart(), "ncclGroupStart");
    try {
      for (::torch::Tensor& b : buckets) {
        detail::check(ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<size_t>(b.numel()),
                                    detail::nccl_type(b), ncclAvg, comm_, stream),
                      "ncclAllReduce");
      }
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    detail::check(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  nccl_communicator(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {}
  ncclComm_t comm_;
  bool owned_;
};

/// A registrar (segment_registry) for `comm`: ncclCommRegister / ncclCommDeregister.
inline registrar nccl_registrar(ncclComm_t comm) {
  return {[comm](void* ptr, std::size_t size) {
            void* handle = nullptr;
            detail::check(ncclCommRegister(comm, ptr, size, &handle), "ncclCommRegister");
            return handle;
          },
          [comm](void* handle) {
            detail::check(ncclCommDeregister(comm, handle), "ncclCommDeregister");
          }};
}

}  // namespace gpumem::nccl
