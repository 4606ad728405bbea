// Two threads on one allocator: the `mixed` request stream (as in gpumem_bench_compare), a
// million allocate+free pairs per thread, timed until both threads have finished. Google
// Benchmark's multi-threaded figure averages each thread's own time, which rewards a lock that
// lets one thread finish first; this one counts the pairs of both threads against the time the
// last one took. Prints a Markdown table.
//
//   gpumem_bench_two_threads [--pairs=N] [--runs=N]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gpumem/gpumem.hpp"
// clang-format off
#include "gpumem/device/simulated_device.hpp"
// clang-format on
#include "mixed_sizes.hpp"

namespace {

using allocator = gpumem::caching_allocator<gpumem::simulated_device>;
using clock_type = std::chrono::steady_clock;

void run_pairs(allocator& a, std::size_t first, std::size_t pairs) {
  const auto& sizes = gpumem_bench::mixed_sizes();
  std::size_t i = first;
  for (std::size_t k = 0; k < pairs; ++k) {
    a.deallocate(a.allocate(sizes[i++ & (gpumem_bench::mixed_count - 1)]));
  }
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct result {
  double one_thread_ns = 0;   // per pair
  double two_threads_ns = 0;  // per pair, both threads' pairs over the last one's finish
  double first_done = 0;      // the first thread's finish, as a fraction of the last one's
};

result measure(const char* config, std::size_t pairs) {
  gpumem::simulated_device dev{std::size_t{80} << 30};
  allocator a(dev, gpumem::allocator_config::parse(config));
  run_pairs(a, 0, gpumem_bench::mixed_count);  // warm: every size cached
  result r;
  auto t0 = clock_type::now();
  run_pairs(a, 0, pairs);
  r.one_thread_ns = seconds_since(t0) / static_cast<double>(pairs) * 1e9;
  std::array<double, 2> done{};
  t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      run_pairs(a, t * 977, pairs);
      done[t] = seconds_since(t0);
    });
  }
  for (auto& t : threads) t.join();
  const double last = std::max(done[0], done[1]);
  r.two_threads_ns = last / static_cast<double>(2 * pairs) * 1e9;
  r.first_done = std::min(done[0], done[1]) / last;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t pairs = 1000000;
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--pairs=", 8) == 0) {
      pairs = std::strtoull(argv[i] + 8, nullptr, 10);
    } else if (std::strncmp(argv[i], "--runs=", 7) == 0) {
      runs = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(stderr, "usage: gpumem_bench_two_threads [--pairs=N] [--runs=N]\n");
      return 2;
    }
  }
  if (pairs == 0 || runs < 1) {
    std::fprintf(stderr, "gpumem_bench_two_threads: --pairs and --runs must be positive\n");
    return 2;
  }
  std::printf(
      "| policy | 1 thread, ns per pair | 2 threads, ns per pair (both threads, until the last "
      "finished) | 2 threads ÷ 1 thread | first thread finished at (fraction of the last) |\n"
      "| --- | --- | --- | --- | --- |\n");
  for (const char* config : {"policy:classic", "policy:stitch"}) {
    std::vector<result> rs;
    for (int k = 0; k < runs; ++k) rs.push_back(measure(config, pairs));
    auto median = [&](double result::*field) {
      std::vector<double> v;
      for (const auto& r : rs) v.push_back(r.*field);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      return v[v.size() / 2];
    };
    const double one = median(&result::one_thread_ns);
    const double two = median(&result::two_threads_ns);
    std::printf("| %s | %.1f | %.1f | %.2f | %.2f |\n", config + 7, one, two, two / one,
                median(&result::first_done));
  }
  std::printf("\nMedians of %d runs of %zu pairs per thread.\n", runs, pairs);
  return 0;
}
