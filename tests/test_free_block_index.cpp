// The free-block index must answer exactly what an ordered set of (size, address) answers, and
// the pointer map exactly what a hash map answers, under random inserts and erases.
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/detail/free_block_index.hpp"
#include "gpumem/core/detail/pointer_map.hpp"
#include "gpumem/core/detail/pools.hpp"

namespace {

using block = gpumem::detail::block<int>;
using index_type = gpumem::detail::free_block_index<int>;

TEST(FreeBlockIndex, ClassesAreMonotonicInSize) {
  std::size_t last = 0;
  for (std::size_t size = 512; size < (std::size_t{1} << 40); size += size / 7 + 512) {
    const std::size_t c = index_type::class_of(size);
    ASSERT_GE(c, last) << size;
    ASSERT_LT(c, index_type::k_num_classes);
    last = c;
  }
  EXPECT_EQ(index_type::class_of(512), 1u);
  EXPECT_EQ(index_type::class_of((1u << 20) - 512), 2047u);
  EXPECT_EQ(index_type::class_of(1u << 20), 2048u);
}

TEST(FreeBlockIndex, MatchesOrderedSetUnderRandomOperations) {
  std::mt19937_64 rng(42);
  auto index = std::make_unique<index_type>();
  std::set<std::pair<std::size_t, std::uintptr_t>> reference;
  std::vector<std::unique_ptr<block>> storage;
  std::vector<block*> present;
  std::uintptr_t next_address = 1u << 30;
  auto random_size = [&]() -> std::size_t {
    switch (rng() % 3) {
      case 0:
        return 512 * (1 + rng() % 2048);  // small pool sizes
      case 1:
        return 512 * (2048 + rng() % 40000);  // up to ~20 MiB
      default:
        return (std::size_t{2} << 20) * (1 + rng() % 4000);  // up to ~8 GiB
    }
  };
  for (int step = 0; step < 200000; ++step) {
    const unsigned op = static_cast<unsigned>(rng() % 10);
    if (op < 5 || present.empty()) {
      auto b = std::make_unique<block>();
      // Repeated sizes exercise the address tie-break.
      b->size = (rng() % 4 == 0 && !present.empty()) ? present[rng() % present.size()]->size
                                                     : random_size();
      b->ptr = next_address;
      next_address += b->size + 512 * (rng() % 3);
      index->insert(b.get());
      reference.emplace(b->size, b->ptr);
      present.push_back(b.get());
      storage.push_back(std::move(b));
    } else if (op < 8) {
      const std::size_t i = rng() % present.size();
      block* b = present[i];
      index->erase(b);
      reference.erase({b->size, b->ptr});
      present[i] = present.back();
      present.pop_back();
    } else {
      const std::size_t want = random_size();
      block* got = index->lower_bound(want);
      auto it = reference.lower_bound({want, 0});
      if (it == reference.end()) {
        ASSERT_EQ(got, nullptr) << "step " << step;
      } else {
        ASSERT_NE(got, nullptr) << "step " << step;
        ASSERT_EQ(got->size, it->first) << "step " << step;
        ASSERT_EQ(got->ptr, it->second) << "step " << step;
      }
      if (got != nullptr) {  // the successor in (size, address) order
        block* after = index->next(got);
        auto succ = std::next(it);
        if (succ == reference.end()) {
          ASSERT_EQ(after, nullptr) << "step " << step;
        } else {
          ASSERT_NE(after, nullptr) << "step " << step;
          ASSERT_EQ(after->size, succ->first) << "step " << step;
          ASSERT_EQ(after->ptr, succ->second) << "step " << step;
        }
      }
      block* largest = index->largest();
      if (reference.empty()) {
        ASSERT_EQ(largest, nullptr);
      } else {
        ASSERT_EQ(largest->size, reference.rbegin()->first);
        ASSERT_EQ(largest->ptr, reference.rbegin()->second);
      }
    }
    if (step % 4096 == 0) {
      ASSERT_EQ(index->size(), reference.size());  // size() walks the index
    }
  }
  ASSERT_EQ(index->size(), reference.size());
  using entries = std::vector<std::pair<std::size_t, std::uintptr_t>>;
  entries visited;
  index->for_each([&](block* b) { visited.emplace_back(b->size, b->ptr); });
  const entries expected(reference.begin(), reference.end());
  EXPECT_EQ(visited, expected);
}

// check() accepts a consistent index and finds each kind of damage: a block resized in place (it
// sits in the wrong class), a block whose flag says it left, two equal keys out of order.
TEST(FreeBlockIndex, CheckFindsItsOwnDamage) {
  auto index = std::make_unique<index_type>();
  std::vector<block> blocks(64);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].ptr = (std::uintptr_t{1} << 30) + i * (std::size_t{4} << 20);
    blocks[i].size = 512 * (1 + i % 5) + (i % 2) * (std::size_t{3} << 20);
    index->insert(&blocks[i]);
  }
  EXPECT_NO_THROW(index->check());
  blocks[7].size += std::size_t{64} << 20;  // another class now
  EXPECT_THROW(index->check(), std::logic_error);
  blocks[7].size -= std::size_t{64} << 20;
  EXPECT_NO_THROW(index->check());
  blocks[9].indexed = false;
  EXPECT_THROW(index->check(), std::logic_error);
  blocks[9].indexed = true;
  const std::uintptr_t a = blocks[0].ptr;  // blocks 0 and 10 have the same size and class
  blocks[0].ptr = blocks[10].ptr;
  blocks[10].ptr = a;
  EXPECT_THROW(index->check(), std::logic_error);
}

// A pool checks that each of its sets holds its own blocks in the set's state, and that a class
// pool's free bound covers its largest free block.
TEST(Pool, CheckFindsBlocksInTheWrongSet) {
  using pool_type = gpumem::detail::pool<int>;
  auto p = std::make_unique<pool_type>();
  auto other = std::make_unique<pool_type>();
  std::vector<block> blocks(3);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].ptr = (std::uintptr_t{1} << 30) + i * (std::size_t{2} << 20);
    blocks[i].size = std::size_t{2} << 20;
    blocks[i].owner = p.get();
  }
  p->index.insert(&blocks[0]);
  blocks[1].mapped = false;
  p->unmapped.insert(&blocks[1]);
  blocks[2].shadowed = true;
  p->shadowed.insert(&blocks[2]);
  std::size_t bound = std::size_t{2} << 20;
  p->free_bound = &bound;
  EXPECT_NO_THROW(p->check());
  bound -= 1;
  EXPECT_THROW(p->check(), std::logic_error);
  bound += 1;
  blocks[1].mapped = true;
  EXPECT_THROW(p->check(), std::logic_error);
  blocks[1].mapped = false;
  blocks[2].owner = other.get();
  EXPECT_THROW(p->check(), std::logic_error);
  blocks[2].owner = p.get();
  blocks[0].owner = other.get();
  EXPECT_THROW(p->check(), std::logic_error);
}

TEST(PointerMap, MatchesHashMapUnderRandomOperations) {
  std::mt19937_64 rng(7);
  gpumem::detail::pointer_map<int> map(16);
  std::unordered_map<std::uintptr_t, int*> reference;
  std::vector<int> values(1000);
  std::vector<std::uintptr_t> keys;
  for (int step = 0; step < 300000; ++step) {
    const unsigned op = static_cast<unsigned>(rng() % 3);
    if (op == 0 || keys.empty()) {
      const std::uintptr_t key = (std::uintptr_t{1} << 32) + 512 * (rng() % 100000);
      if (reference.count(key) != 0) continue;
      int* v = &values[rng() % values.size()];
      map.insert(key, v);
      reference[key] = v;
      keys.push_back(key);
    } else if (op == 1) {
      const std::size_t i = rng() % keys.size();
      ASSERT_EQ(map.erase(keys[i]), reference[keys[i]]);
      reference.erase(keys[i]);
      keys[i] = keys.back();
      keys.pop_back();
    } else {
      const std::uintptr_t key = (std::uintptr_t{1} << 32) + 512 * (rng() % 100000);
      auto it = reference.find(key);
      ASSERT_EQ(map.find(key), it == reference.end() ? nullptr : it->second);
    }
    ASSERT_EQ(map.size(), reference.size());
  }
  EXPECT_EQ(map.erase(12345), nullptr);
}

}  // namespace
