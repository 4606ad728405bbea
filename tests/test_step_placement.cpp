// Stitch's step placement on its own (core/detail/step_placement.hpp): it finds the period of a
// loop's requests with no help from the program, offers each request where the request one period
// earlier went, and offers nothing where the requests do not repeat.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/detail/step_placement.hpp"

namespace {

struct fake_pool {};
using placement_type = gpumem::detail::step_placement<fake_pool>;

// A training step's requests: a head of distinct sizes (embedding), `layers` repeats of one
// layer's pattern, a tail of distinct sizes (loss, optimizer). Sizes in bytes.
std::vector<std::size_t> training_step(std::size_t layers) {
  std::vector<std::size_t> step;
  for (std::size_t i = 0; i < 24; ++i) step.push_back((1000 + i) * 512);
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t i = 0; i < 20; ++i) step.push_back((10 + i % 7) * 4096);
  }
  for (std::size_t i = 0; i < 24; ++i) step.push_back((3000 + i) * 512);
  return step;
}

struct offers {
  std::vector<std::vector<const placement_type::placement*>> by_step;  // per step, per request
  std::vector<std::vector<std::uintptr_t>> placed;                     // where each request went
};

// Runs `steps` steps of `step`; request r of step s is placed at a fresh address unless an offer
// came, in which case it takes the offer (as the allocator does when the memory is free).
offers run(placement_type& p, const std::vector<std::size_t>& step, std::size_t steps,
           fake_pool& pool) {
  offers o;
  std::uintptr_t fresh = 0x10000000;
  for (std::size_t s = 0; s < steps; ++s) {
    o.by_step.emplace_back();
    o.placed.emplace_back();
    for (std::size_t size : step) {
      const placement_type::placement* offer = p.next(size, 0);
      o.by_step.back().push_back(offer);
      const std::uintptr_t at = offer != nullptr ? offer->ptr : (fresh += 1 << 20);
      o.placed.back().push_back(at);
      p.record({&pool, at, at, size});
    }
  }
  return o;
}

// A placement that has followed `steps` steps of `step` (and must have confirmed its period).
void follow(placement_type& p, const std::vector<std::size_t>& step, std::size_t steps,
            fake_pool& pool) {
  run(p, step, steps, pool);
  ASSERT_TRUE(p.confirmed());
}

TEST(StepPlacement, FindsTheStepOfALoopWithRepeatedLayers) {
  placement_type p(64);
  fake_pool pool;
  const std::vector<std::size_t> step = training_step(12);
  const offers o = run(p, step, 4, pool);
  EXPECT_EQ(p.period(), step.size());
  EXPECT_TRUE(p.confirmed());
  // From the third step on, every request is offered exactly where the same request of the step
  // before went (the second step's first requests come before the step is recognised).
  for (std::size_t s = 2; s < 4; ++s) {
    for (std::size_t r = 0; r < step.size(); ++r) {
      ASSERT_NE(o.by_step[s][r], nullptr) << "step " << s + 1 << " request " << r;
      EXPECT_EQ(o.by_step[s][r]->ptr, o.placed[s - 1][r]) << "step " << s + 1 << " request " << r;
    }
  }
  // The second step is followed once the first stretch of 64 requests has matched.
  std::size_t offered = 0;
  for (const auto* offer : o.by_step[1]) offered += offer != nullptr;
  EXPECT_GT(offered, step.size() / 2);
}

TEST(StepPlacement, OffersNothingWhereRequestsDoNotRepeat) {
  placement_type p(64);
  fake_pool pool;
  std::mt19937_64 random(7);
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 20000; ++i) sizes.push_back((random() % 100000 + 1) * 512);
  const offers o = run(p, sizes, 1, pool);
  for (const auto* offer : o.by_step[0]) ASSERT_EQ(offer, nullptr);
  EXPECT_FALSE(p.confirmed());
}

TEST(StepPlacement, ARequestThatDiffersGetsNoOfferAndTheLoopGoesOn) {
  placement_type p(64);
  fake_pool pool;
  const std::vector<std::size_t> step = training_step(4);
  follow(p, step, 3, pool);
  std::vector<std::size_t> changed = step;
  changed[30] += 512;  // one request of another size this step
  const offers o = run(p, changed, 1, pool);
  EXPECT_EQ(o.by_step[0][30], nullptr);
  EXPECT_NE(o.by_step[0][29], nullptr);
  EXPECT_NE(o.by_step[0][31], nullptr);  // one difference does not end the period
  EXPECT_EQ(p.period(), step.size());
}

TEST(StepPlacement, StreamsAreToldApart) {
  placement_type p(16);
  fake_pool pool;
  follow(p, training_step(2), 3, pool);
  // The same size on another stream is another request: no offer.
  EXPECT_EQ(p.next(training_step(2)[0], 1), nullptr);
}

TEST(StepPlacement, MatchZeroIsOff) {
  EXPECT_FALSE(placement_type(0).enabled());
  EXPECT_TRUE(placement_type(1).enabled());
}

TEST(StepPlacement, AStepLongerThanItsWindowIsNotFollowed) {
  placement_type p(64);
  fake_pool pool;
  std::vector<std::size_t> step;
  std::mt19937_64 random(11);
  for (std::size_t i = 0; i < placement_type::k_max_period + 1000; ++i) {
    step.push_back((random() % 100000 + 1) * 512);
  }
  const offers o = run(p, step, 2, pool);
  for (const auto* offer : o.by_step[1]) ASSERT_EQ(offer, nullptr);
}

}  // namespace
