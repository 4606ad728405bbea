// gpumem — what gradient accumulation needs from a collective library, and an in-process
// implementation (threads as ranks) for tests and single-process experiments.
//
// Implementations: in_process_communicator (this file); gpumem::nccl::nccl_communicator
// (gpumem/nccl/communicator.hpp: NCCL, set up from torchrun's environment or an existing
// ncclComm_t).
#pragma once

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpumem::train {

/// Averages tensors across the ranks of a data-parallel job.
class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Replaces every tensor of `buckets` by its average over all ranks. Collective: every rank
  /// calls it with the same number of buckets, each of the same size and dtype as on the other
  /// ranks. Throws (std::runtime_error or a subclass) on failure; the buckets are then unspecified.
  virtual void all_reduce_average(std::vector<::torch::Tensor>& buckets) = 0;
};

/// The meeting point of the ranks of an in_process_communicator: one per simulated job.
class in_process_group {
 public:
  /// `world_size` ranks; a rank waiting longer than `timeout` for the others throws.
  explicit in_process_group(int world_size,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : world_size_(world_size), timeout_(timeout), slots_(static_cast<std::size_t>(world_size)) {
    if (world_size < 1) {
      throw std::invalid_argument("gpumem::train::in_process_group: world size " +
                                  std::to_string(world_size) + " (need at least 1)");
    }
  }

  int world_size() const noexcept { return world_size_; }

 private:
  friend class in_process_communicator;

  // Every rank deposits its buckets; the last to arrive checks that they match, averages them in
  // rank order (the same result on every rank, bit for bit) and releases the others. Buckets on
  // a GPU are read and written by another thread's stream: each rank waits for its current
  // stream before depositing, and the last waits for its own after the reduction, so that the
  // work of every rank's stream is ordered around the host's (a test stand-in, not fast).
  void all_reduce_average(int rank, std::vector<::torch::Tensor>& buckets) {
    synchronize_streams(buckets);
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t generation = generation_;
    slots_[static_cast<std::size_t>(rank)] = &buckets;
    if (++arrived_ == world_size_) {
      reduce_locked();
      synchronize_streams(buckets);
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    } else if (!done_.wait_for(lock, timeout_, [&] { return generation_ != generation; })) {
      --arrived_;
      slots_[static_cast<std::size_t>(rank)] = nullptr;
      throw std::runtime_error(
          "gpumem::train::in_process_communicator: rank " + std::to_string(rank) + " waited " +
          std::to_string(timeout_.count()) + " ms for the other ranks of the all-reduce");
    }
    if (!error_.empty()) {
      const std::string error = error_;
      if (++errors_seen_ == world_size_) {
        error_.clear();
        errors_seen_ = 0;
      }
      throw std::invalid_argument(error);
    }
  }

  static void synchronize_streams(const std::vector<::torch::Tensor>& buckets) {
    for (const ::torch::Tensor& b : buckets) {
      if (!b.defined() || b.device().is_cpu()) continue;
      c10::impl::VirtualGuardImpl impl(b.device().type());
      impl.synchronizeStream(impl.getStream(b.device()));
    }
  }

  void reduce_locked() {
    const std::vector<::torch::Tensor>& first = *slots_[0];
    for (int r = 1; r < world_size_; ++r) {
      const std::vector<::torch::Tensor>& other = *slots_[static_cast<std::size_t>(r)];
      if (other.size() != first.size()) {
        error_ = "gpumem::train::in_process_communicator: rank " + std::to_string(r) + " has " +
                 std::to_string(other.size()) + " buckets, rank 0 has " +
                 std::to_string(first.size());
        return;
      }
      for (std::size_t b = 0; b < first.size(); ++b) {
        if (other[b].numel() != first[b].numel() || other[b].dtype() != first[b].dtype()) {
          error_ = "gpumem::train::in_process_communicator: bucket " + std::to_string(b) + " has " +
                   std::to_string(other[b].numel()) + " elements on rank " + std::to_string(r) +
                   ", " + std::to_string(first[b].numel()) + " on rank 0";
          return;
        }
      }
    }
    for (std::size_t b = 0; b < first.size(); ++b) {
      ::torch::NoGradGuard no_grad;
      ::torch::Tensor sum = slots_[0]->at(b).clone();
      for (int r = 1; r < world_size_; ++r) sum.add_(slots_[static_cast<std::size_t>(r)]->at(b));
      sum.div_(world_size_);
      for (int r = 0; r < world_size_; ++r) slots_[static_cast<std::size_t>(r)]->at(b).copy_(sum);
    }
  }

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<::torch::Tensor>*> slots_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string error_;  // a mismatch found by the last reduction, reported on every rank
  int errors_seen_ = 0;
};

/// One rank of an in_process_group (one per thread). Thread safety: one thread per rank.
class in_process_communicator final : public communicator {
 public:
  /// Throws std::invalid_argument for a rank outside [0, group.world_size()).
  in_process_communicator(std::shared_ptr<in_process_group> group, int rank)
      : group_(std::move(group)), rank_(rank) {
    if (!group_ || rank < 0 || rank >= group_->world_size()) {
      throw std::invalid_argument("gpumem::train::in_process_communicator: rank " +
                                  std::to_string(rank) + " outside the group");
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  void all_reduce_average(std::vector<::torch::Tensor>& buckets) override {
    group_->all_reduce_average(rank_, buckets);
  }

 private:
  std::shared_ptr<in_process_group> group_;
  int rank_;
};

}  // namespace gpumem::train
