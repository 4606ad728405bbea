// caching_allocator::checkpoint and restore (PyTorch's getCheckpointState and
// setCheckpointPoolState, which CUDA-graph trees use on a graph's private pool), under each policy:
// the checkpointed blocks are allocated again at their addresses, everything else is free, the
// statistics are those of the restored allocations, and the invariants hold after every restore.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/pinned_segments.hpp"
#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::block_state;
using gpumem::simulated_device;
using stream_type = simulated_device::stream_type;

using extent = std::pair<std::uintptr_t, std::size_t>;

std::set<extent> allocated_blocks(const allocator& a) {
  std::set<extent> out;
  for (const auto& seg : a.snapshot()) {
    for (const auto& b : seg.blocks) {
      if (b.state == block_state::active_allocated) out.emplace(b.address, b.size);
    }
  }
  return out;
}

std::set<void*> pointers(const std::set<extent>& blocks) {
  std::set<void*> out;
  for (const auto& [address, size] : blocks) out.insert(reinterpret_cast<void*>(address));
  return out;
}

std::int64_t current(const gpumem::stat_array& s) {
  return s[0].current;
}

// What each block list of `before`'s segments looked like, by segment address.
std::vector<std::pair<std::uintptr_t, std::vector<std::pair<extent, block_state>>>> layout(
    const std::vector<gpumem::segment_snapshot<stream_type>>& segments) {
  std::vector<std::pair<std::uintptr_t, std::vector<std::pair<extent, block_state>>>> out;
  for (const auto& seg : segments) {
    std::vector<std::pair<extent, block_state>> blocks;
    for (const auto& b : seg.blocks) blocks.push_back({{b.address, b.size}, b.state});
    out.emplace_back(seg.address, std::move(blocks));
  }
  return out;
}

class Checkpoint : public ::testing::TestWithParam<std::string> {
 protected:
  gpumem::allocator_config policy() const { return config("policy:" + GetParam()); }
};

// A random mix of small and large requests on two streams, some freed; then a checkpoint; then
// more work (frees of checkpointed blocks, new blocks, new segments); then the restore.
TEST_P(Checkpoint, RestoresTheCheckpointedAllocations) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    simulated_device dev{device_options(16 * GiB)};
    allocator a(dev, policy());
    a.set_memory_fixed(true);  // as a private pool in use: nothing is unmapped or freed
    const stream_type side = dev.create_stream();
    std::mt19937_64 rng(seed);
    std::vector<void*> live;
    auto work = [&](int ops) {
      for (int op = 0; op < ops; ++op) {
        if (rng() % 100 < 60 || live.empty()) {
          const std::size_t size = rng() % 2 == 0 ? 1 + rng() % (1 * MiB) : 1 + rng() % (30 * MiB);
          live.push_back(a.allocate(size, rng() % 4 == 0 ? side : dev.default_stream()));
        } else {
          const std::size_t i = rng() % live.size();
          a.deallocate(live[i]);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
    };
    work(120);
    const gpumem::allocator_checkpoint<stream_type> cp = a.checkpoint();
    const std::set<extent> kept = allocated_blocks(a);
    const auto segments_at_checkpoint = a.snapshot();
    const gpumem::device_stats at_checkpoint = a.stats();

    work(150);
    const std::set<extent> before_restore = allocated_blocks(a);
    const gpumem::device_stats before = a.stats();
    const gpumem::checkpoint_delta delta = a.restore(cp);
    ASSERT_NO_THROW(a.check_invariants());

    EXPECT_EQ(allocated_blocks(a), kept);
    EXPECT_EQ(std::set<void*>(delta.allocated.begin(), delta.allocated.end()), pointers(kept));
    EXPECT_EQ(delta.allocated.size(), kept.size());
    EXPECT_EQ(std::set<void*>(delta.freed.begin(), delta.freed.end()), pointers(before_restore));
    EXPECT_EQ(delta.freed.size(), before_restore.size());

    // Each checkpointed segment has its blocks back, unless an expandable range mapped more pages
    // since (its last free block is larger) or stitch cut a free run at pages another range held
    // (only the allocations are compared there).
    if (GetParam() != "stitch") {
      const auto now = a.snapshot();
      const auto then = layout(segments_at_checkpoint);
      const auto now_layout = layout(now);
      for (std::size_t k = 0; k < segments_at_checkpoint.size(); ++k) {
        std::size_t j = 0;
        while (j < now.size() && now[j].address != segments_at_checkpoint[k].address) ++j;
        ASSERT_LT(j, now.size());
        if (now[j].mapped_size != segments_at_checkpoint[k].mapped_size) continue;
        EXPECT_EQ(now_layout[j].second, then[k].second) << "segment " << now[j].address;
      }
    }

    // The statistics of the restored allocations (PyTorch's: a restored block's requested size is
    // its size); reserved memory is what it was before the restore.
    const gpumem::device_stats after = a.stats();
    std::int64_t kept_bytes = 0;
    for (const auto& [address, size] : kept) kept_bytes += static_cast<std::int64_t>(size);
    EXPECT_EQ(current(after.allocation), static_cast<std::int64_t>(kept.size()));
    EXPECT_EQ(current(after.allocated_bytes), kept_bytes);
    EXPECT_EQ(current(after.active_bytes), kept_bytes);
    EXPECT_EQ(current(after.requested_bytes), kept_bytes);
    EXPECT_EQ(current(after.reserved_bytes), current(before.reserved_bytes));
    EXPECT_EQ(current(after.segment), current(before.segment));
    EXPECT_EQ(current(after.allocated_bytes), current(at_checkpoint.allocated_bytes));
    if (GetParam() == "classic") {  // the segments made since the checkpoint are whole and free
      EXPECT_EQ(current(after.inactive_split), current(at_checkpoint.inactive_split));
      EXPECT_EQ(current(after.inactive_split_bytes), current(at_checkpoint.inactive_split_bytes));
    }

    // The restored blocks are ordinary allocations: freed by pointer, and the allocator goes on.
    live.assign(delta.allocated.begin(), delta.allocated.end());
    work(100);
    ASSERT_NO_THROW(a.check_invariants());
    EXPECT_NO_THROW(a.restore(cp));  // twice from the same checkpoint
    ASSERT_NO_THROW(a.check_invariants());
    EXPECT_EQ(allocated_blocks(a), kept);
    for (const auto& [address, size] : kept) a.deallocate(reinterpret_cast<void*>(address));
    EXPECT_EQ(current(a.stats().allocated_bytes), 0);
    ASSERT_NO_THROW(a.check_invariants());
    dev.destroy_stream(side);
  }
}

// A checkpoint with nothing allocated frees everything; restoring into an allocator whose
// checkpointed segment is gone is refused without a change.
TEST_P(Checkpoint, EmptyCheckpointFreesAllAndAGoneSegmentIsRefused) {
  simulated_device dev{device_options(4 * GiB)};
  allocator a(dev, policy());
  const auto empty = a.checkpoint();
  void* p = a.allocate(3 * MiB);
  void* q = a.allocate(4096);
  const auto cp = a.checkpoint();
  const auto delta = a.restore(empty);
  EXPECT_EQ(std::set<void*>(delta.freed.begin(), delta.freed.end()), (std::set<void*>{p, q}));
  EXPECT_TRUE(delta.allocated.empty());
  EXPECT_EQ(current(a.stats().allocation), 0);
  ASSERT_NO_THROW(a.check_invariants());

  a.empty_cache();  // the checkpointed segments go back to the device
  void* r = a.allocate(1 * MiB + 512);
  const auto before = allocated_blocks(a);
  EXPECT_THROW(a.restore(cp), gpumem::usage_error);
  EXPECT_EQ(allocated_blocks(a), before);
  ASSERT_NO_THROW(a.check_invariants());
  a.deallocate(r);
}

// A block used on another stream when it is freed by the restore is waited for (outside a
// capture); during a capture the restore is refused.
TEST_P(Checkpoint, WaitsForStreamUsesAndIsRefusedDuringACapture) {
  simulated_device dev{device_options(4 * GiB, gpumem::event_completion::manual)};
  allocator a(dev, policy());
  const stream_type side = dev.create_stream();
  const auto cp = a.checkpoint();
  void* p = a.allocate(2 * MiB);
  a.record_stream(p, side);
  a.begin_capture();
  EXPECT_THROW(a.restore(cp), gpumem::usage_error);
  EXPECT_TRUE(a.owns(p));
  a.end_capture();
  const auto delta = a.restore(cp);
  EXPECT_EQ(delta.freed, std::vector<void*>{p});
  EXPECT_EQ(current(a.stats().active_bytes), 0);  // not left pending on the side stream's event
  ASSERT_NO_THROW(a.check_invariants());
  dev.destroy_stream(side);
}

INSTANTIATE_TEST_SUITE_P(Policies, Checkpoint, ::testing::Values("classic", "expandable", "stitch"),
                         [](const auto& param_info) { return param_info.param; });

bool has_shared_pages(const allocator& a) {
  for (const auto& seg : a.snapshot()) {
    if (seg.reserved_size < seg.mapped_size) return true;
  }
  return false;
}

// Stitch's shared pages: a checkpointed block on pages mapped at two addresses is allocated again
// where it was, its range holding the pages again, after the pages' other range used them.
TEST(CheckpointStitch, RestoresBlocksOnSharedPages) {
  simulated_device dev{device_options(202 * MiB)};
  allocator a(dev, config("policy:stitch"));
  a.set_memory_fixed(true);
  std::vector<void*> keep = pin_segments(a);
  void* big = a.allocate(30 * MiB);  // on pages of the pinned segments' free blocks
  ASSERT_TRUE(has_shared_pages(a));
  const auto cp = a.checkpoint();  // big holds the shared pages
  const auto kept = allocated_blocks(a);

  // The pages go back to their first ranges: big is freed and 9 MiB blocks take them there.
  a.deallocate(big);
  std::vector<void*> there;
  for (int i = 0; i < 10; ++i) there.push_back(a.allocate(9 * MiB));
  ASSERT_NO_THROW(a.check_invariants());

  const auto delta = a.restore(cp);
  ASSERT_NO_THROW(a.check_invariants());
  EXPECT_EQ(allocated_blocks(a), kept);
  EXPECT_EQ(delta.freed.size(), keep.size() + there.size());
  // The free blocks of the first ranges on big's pages are unusable while big lives: new requests
  // get other memory, and the invariants hold throughout.
  std::vector<void*> more;
  for (int i = 0; i < 4; ++i) more.push_back(a.allocate(9 * MiB));
  ASSERT_NO_THROW(a.check_invariants());
  for (void* p : more) a.deallocate(p);
  for (const auto& [address, size] : kept) a.deallocate(reinterpret_cast<void*>(address));
  ASSERT_NO_THROW(a.check_invariants());
  EXPECT_EQ(current(a.stats().allocated_bytes), 0);
}

// The reverse: a checkpoint taken before the sharing; the shared range's block is freed by the
// restore and the pinned blocks come back on pages that are then mapped in two ranges.
TEST(CheckpointStitch, RestoreFreesTheBlockThatSharedPages) {
  simulated_device dev{device_options(202 * MiB)};
  allocator a(dev, config("policy:stitch"));
  a.set_memory_fixed(true);
  std::vector<void*> keep = pin_segments(a);
  const auto cp = a.checkpoint();
  const auto kept = allocated_blocks(a);
  void* big = a.allocate(30 * MiB);
  ASSERT_TRUE(has_shared_pages(a));
  const auto delta = a.restore(cp);
  ASSERT_NO_THROW(a.check_invariants());
  EXPECT_EQ(allocated_blocks(a), kept);
  EXPECT_NE(std::find(delta.freed.begin(), delta.freed.end(), big), delta.freed.end());
  void* again = a.allocate(30 * MiB);  // the shared pages are usable again
  ASSERT_NO_THROW(a.check_invariants());
  a.deallocate(again);
  for (const auto& [address, size] : kept) a.deallocate(reinterpret_cast<void*>(address));
  ASSERT_NO_THROW(a.check_invariants());
}

}  // namespace
