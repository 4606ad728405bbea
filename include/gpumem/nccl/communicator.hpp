// gpumem — NCCL for the training helpers: a gpumem::train::communicator that averages gradient
// buckets with ncclAllReduce(ncclAvg) inside one group call, set up from torchrun's environment or
// around an existing ncclComm_t (c10d's ProcessGroupNCCL's, for one); and nccl_registrar, which
// makes a segment_registry register gpumem's segments with a communicator.
//
//   auto comm = gpumem::nccl::nccl_communicator::from_environment();   // under torchrun
//   gpumem::train::gradient_accumulator acc(optimizer, {4}, &comm);
//
// NCCL's unique id goes from rank 0 to the others through c10d's TCPStore on MASTER_PORT (as
// PyTorch does; torchrun's own store under torchrun) or, without c10d or when asked, gpumem's
// authenticated TCP exchange: rendezvous.hpp and docs/nccl_rendezvous.md. GPUMEM_NCCL_TCPSTORE
// (defined to 0 or 1 before including this header) forces c10d's TCPStore out or in; by default
// it is in wherever LibTorch ships its header.
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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpumem/nccl/detail/tcp_rendezvous.hpp"
#include "gpumem/nccl/rendezvous.hpp"
#include "gpumem/nccl/segment_registry.hpp"
#include "gpumem/train/communicator.hpp"

#ifndef GPUMEM_NCCL_TCPSTORE
#if __has_include(<torch/csrc/distributed/c10d/TCPStore.hpp>) && !defined(TORCH_STABLE_ONLY) && \
    !defined(TORCH_TARGET_VERSION)
#define GPUMEM_NCCL_TCPSTORE 1
#else
#define GPUMEM_NCCL_TCPSTORE 0
#endif
#endif
#if GPUMEM_NCCL_TCPSTORE
#include "gpumem/nccl/detail/store_rendezvous.hpp"
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

namespace detail {
/// Numbers the calls of from_environment in this process (see store_key_prefix).
inline std::uint64_t next_rendezvous_sequence() noexcept {
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// Hands rank 0's `bytes` to every rank of `env` by the method `options` and the environment
/// choose (rendezvous.hpp): c10d's TCPStore at MASTER_ADDR:MASTER_PORT — a client of torchrun's
/// agent store where TORCHELASTIC_USE_AGENT_STORE=True, else served by rank 0 — or gpumem's TCP
/// exchange on GPUMEM_RENDEZVOUS_PORT with GPUMEM_RENDEZVOUS_TOKEN. A single rank needs nothing.
/// `sequence` numbers this call in the process. Throws std::invalid_argument for settings,
/// std::runtime_error for the rendezvous itself.
inline void share_unique_id(const torchrun_environment& env, const elastic_environment& elastic,
                            const rendezvous_options& options, std::uint64_t sequence,
                            std::vector<char>& bytes) {
  if (env.world_size == 1) return;
  const rendezvous_method method = resolve_method(options.method, GPUMEM_NCCL_TCPSTORE != 0);
  if (method == rendezvous_method::tcp_store) {
#if GPUMEM_NCCL_TCPSTORE
    const auto deadline = rendezvous_clock::now() + options.timeout;
    const bool server = env.rank == 0 && !elastic.agent_store;
    const c10::intrusive_ptr<c10d::Store> store =
        open_tcp_store(env.master_addr, env.master_port, env.rank, server, deadline);
    store_exchange(*store, store_key_prefix(elastic, sequence), env.rank, env.world_size, bytes,
                   deadline, options.timeout,
                   env.master_addr + ":" + std::to_string(env.master_port));
    return;
#else
    (void)sequence;  // numbers only the store's keys
    throw std::invalid_argument(
        "gpumem::nccl: the tcp_store rendezvous needs c10d's TCPStore, which this build left out "
        "(GPUMEM_NCCL_TCPSTORE=0): use the tcp rendezvous");
#endif
  }
  exchange(env.rank, env.world_size, env.master_addr, resolve_tcp_port(options.tcp_port), bytes,
           options.timeout, resolve_tcp_token(options.tcp_token, elastic));
}
}  // namespace detail

/// Averages buckets across ranks with NCCL; see the top of the file.
class nccl_communicator final : public train::communicator {
 public:
  /// Under torchrun (or with its variables set): selects GPU LOCAL_RANK, hands NCCL's unique id
  /// from rank 0 to every rank as `options` say (by default through c10d's TCPStore at
  /// MASTER_ADDR:MASTER_PORT; see rendezvous.hpp) and creates the communicator. Every rank calls
  /// it the same number of times, in the same order, from one thread at a time (the calls are
  /// numbered to keep their keys apart). Throws std::invalid_argument (environment, settings),
  /// std::runtime_error (rendezvous: deadline, refused peer, store error), nccl_error.
  static nccl_communicator from_environment(const rendezvous_options& options = {}) {
    const torchrun_environment env = torchrun_environment::read();
    const detail::elastic_environment elastic = detail::elastic_environment::read();
    if (cudaSetDevice(env.local_rank) != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::invalid_argument("gpumem::nccl: cannot select GPU LOCAL_RANK=" +
                                  std::to_string(env.local_rank));
    }
    ncclUniqueId id{};
    if (env.rank == 0) detail::check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<char> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    const std::uint64_t sequence = detail::next_rendezvous_sequence();
    detail::share_unique_id(env, elastic, options, sequence, bytes);
    std::memcpy(&id, bytes.data(), sizeof id);
    ncclComm_t comm = nullptr;
    detail::check(ncclCommInitRank(&comm, env.world_size, id, env.rank), "ncclCommInitRank");
    return nccl_communicator(comm, true);
  }

  /// Uses `comm` (not owned: the caller destroys it after this object). c10d's ProcessGroupNCCL
  /// gives its communicator for the current device, once the group ran a collective there, as
  /// `reinterpret_cast<ncclComm_t>(group.getCommPtr())`.
  static nccl_communicator from_comm(ncclComm_t comm) {
    if (comm == nullptr) throw std::invalid_argument("gpumem::nccl: null ncclComm_t");
    return nccl_communicator(comm, false);
  }

  nccl_communicator(nccl_communicator&& o) noexcept : comm_(o.comm_), owned_(o.owned_) {
    o.comm_ = nullptr;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  ~nccl_communicator() override {
    if (owned_ && comm_ != nullptr) (void)ncclCommDestroy(comm_);
  }

  ncclComm_t comm() const noexcept { return comm_; }

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
