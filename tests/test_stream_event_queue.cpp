// The stream-event queue shared by caching_allocator and pinned_pool
// (gpumem/device/detail/stream_event_queue.hpp): order per stream, reuse per device, and a queue
// left consistent by every device failure.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <vector>

#include "gpumem/device/detail/stream_event_queue.hpp"

namespace {

// Events complete when the test says so; any event call can be made to throw once.
struct fake_device {
  using stream_type = int;
  using event_type = int;

  std::map<int, bool> complete;  // event -> completed
  std::map<int, int> device_of;  // event -> the device it was created on
  std::set<int> destroyed;
  int created = 0;
  bool fail_next_record = false;
  bool fail_next_query = false;
  bool fail_next_synchronize = false;
  std::vector<int> synchronized;

  // Streams 0-9 are on GPU 0, 10-19 on GPU 1.
  int stream_device(stream_type s) const { return s / 10; }
  event_type create_event_for(stream_type s) {
    const int e = ++created;
    device_of[e] = stream_device(s);
    complete[e] = false;
    return e;
  }
  event_type create_event() { return create_event_for(0); }
  void record_event(event_type e, stream_type) {
    if (fail_next_record) {
      fail_next_record = false;
      throw std::runtime_error("record failed");
    }
    complete[e] = false;
  }
  bool query_event(event_type e) {
    if (fail_next_query) {
      fail_next_query = false;
      throw std::runtime_error("query failed");
    }
    return complete.at(e);
  }
  void synchronize_event(event_type e) {
    if (fail_next_synchronize) {
      fail_next_synchronize = false;
      throw std::runtime_error("synchronize failed");
    }
    synchronized.push_back(e);
    complete[e] = true;
  }
  void destroy_event(event_type e) {
    if (!destroyed.insert(e).second) throw std::logic_error("event destroyed twice");
  }
};

using queue_type = gpumem::detail::stream_event_queue<fake_device, int>;

// The owners retired, in order.
struct retired_list {
  std::vector<int> owners;
  void operator()(int owner) { owners.push_back(owner); }
};

TEST(StreamEventQueue, RetiresEachStreamInRecordingOrderAndStopsAtTheFirstIncomplete) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 100);        // event 1
  q.record(1, 101);        // event 2
  q.record(2, 200);        // event 3
  dev.complete[2] = true;  // the second on stream 1 completed, the first not: nothing retires there
  dev.complete[3] = true;
  retired_list r;
  q.retire_completed(std::ref(r));
  EXPECT_EQ(r.owners, (std::vector<int>{200}));
  EXPECT_EQ(q.size(), 2u);
  dev.complete[1] = true;
  q.retire_completed(std::ref(r));
  EXPECT_EQ(r.owners, (std::vector<int>{200, 100, 101}));
  EXPECT_TRUE(q.empty());
}

TEST(StreamEventQueue, ReusesCompletedEventsOnTheirOwnDeviceOnly) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 1);   // event 1, GPU 0
  q.record(11, 2);  // event 2, GPU 1
  dev.complete[1] = dev.complete[2] = true;
  retired_list r;
  q.retire_completed(std::ref(r));
  q.record(12, 3);  // GPU 1: reuses event 2, not event 1
  q.record(3, 4);   // GPU 0: reuses event 1
  q.record(4, 5);   // GPU 0: none left, a new one
  EXPECT_EQ(dev.created, 3);
  EXPECT_EQ(q.size(), 3u);
  q.retire_all(std::ref(r));
  EXPECT_EQ(dev.synchronized.size(), 3u);
  EXPECT_EQ(dev.device_of.at(dev.synchronized[0]), 1);  // stream 12's event was created on GPU 1
}

TEST(StreamEventQueue, AFailedRecordQueuesNothingAndKeepsTheEvent) {
  fake_device dev;
  queue_type q(dev, 0);
  dev.fail_next_record = true;
  EXPECT_THROW(q.record(1, 7), std::runtime_error);
  EXPECT_TRUE(q.empty());
  q.record(1, 8);
  EXPECT_EQ(dev.created, 1);  // the event of the failed record was kept and reused
  EXPECT_EQ(q.size(), 1u);
}

TEST(StreamEventQueue, AWaitThatThrowsLeavesTheRestQueuedAndRetiresEachOwnerOnce) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 1);
  q.record(1, 2);
  q.record(2, 3);
  retired_list r;
  bool armed = true;
  EXPECT_THROW(q.retire_all([&](int owner) {
    r(owner);
    if (armed) dev.fail_next_synchronize = true;
    armed = false;
  }),
               std::runtime_error);
  EXPECT_EQ(r.owners, (std::vector<int>{1}));
  EXPECT_EQ(q.size(), 2u);
  q.retire_all(std::ref(r));
  EXPECT_EQ(r.owners, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(q.empty());
}

TEST(StreamEventQueue, AnOwnerWhoseRetirementThrowsIsNotRetiredAgain) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 1);
  q.record(1, 2);
  dev.complete[1] = dev.complete[2] = true;
  retired_list r;
  const auto throw_for_one = [&](int owner) {
    r(owner);
    if (owner == 1) throw std::runtime_error("free failed");
  };
  EXPECT_THROW(q.retire_completed(throw_for_one), std::runtime_error);
  q.retire_completed(throw_for_one);
  EXPECT_EQ(r.owners, (std::vector<int>{1, 2}));
  EXPECT_TRUE(q.empty());
  q.record(2, 3);
  EXPECT_EQ(dev.created, 2);  // owner 1's event was recycled all the same
}

TEST(StreamEventQueue, AQueryThatThrowsKeepsTheQueueConsistent) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 1);
  q.record(2, 2);
  dev.complete[1] = dev.complete[2] = true;
  dev.fail_next_query = true;
  retired_list r;
  EXPECT_THROW(q.retire_completed(std::ref(r)), std::runtime_error);
  EXPECT_TRUE(r.owners.empty());
  EXPECT_EQ(q.size(), 2u);
  q.retire_completed(std::ref(r));
  EXPECT_EQ(r.owners, (std::vector<int>{1, 2}));
  EXPECT_TRUE(q.empty());
}

TEST(StreamEventQueue, UnrecordNewestTakesBackOnlyThatStreamsLastEvent) {
  fake_device dev;
  queue_type q(dev, 0);
  q.record(1, 1);
  q.record(1, 2);
  q.record(2, 3);
  q.unrecord_newest(1);
  std::vector<int> owners;
  q.for_each_owner([&](int owner) { owners.push_back(owner); });
  EXPECT_EQ(owners, (std::vector<int>{1, 3}));
  q.unrecord_newest(2);
  q.record(3, 4);
  EXPECT_EQ(dev.created, 3);  // stream 2's event went back for reuse
}

TEST(StreamEventQueue, DestroyAllDestroysEveryEventOnce) {
  fake_device dev;
  {
    queue_type q(dev, 0);
    q.record(1, 1);
    q.record(11, 2);
    q.record(2, 3);
    dev.complete[1] = true;
    retired_list r;
    q.retire_completed(std::ref(r));   // event 1 recycled, events 2 and 3 queued
    dev.fail_next_synchronize = true;  // a failed wait in a destructor is swallowed
    q.destroy_all(/*wait=*/true);
    EXPECT_TRUE(q.empty());
  }
  EXPECT_EQ(dev.destroyed, (std::set<int>{1, 2, 3}));
}

}  // namespace
