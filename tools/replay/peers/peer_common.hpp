// gpumem-replay-peer: what the allocator adapters share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../json_text.hpp"

namespace gpumem::peers {

using gpumem_replay::json;

/// A configuration string the allocator does not accept.
class config_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What one allocation did: ok, or out of memory with the allocator's own message.
struct alloc_outcome {
  bool ok = true;
  std::string message;
};

/// Fails with the CUDA error's name when `e` is not cudaSuccess.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(fmt::format("{} failed: {}", what, cudaGetErrorString(e)));
  }
}

/// One cudaStream_t per dense stream index of the trace (index 0 too: a created stream, not the
/// legacy default stream). Never destroyed: the peer leaves with _Exit.
inline std::vector<cudaStream_t> create_streams(std::size_t n) {
  std::vector<cudaStream_t> streams(n, nullptr);
  for (cudaStream_t& s : streams) check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
  return streams;
}

}  // namespace gpumem::peers
