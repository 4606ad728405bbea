// The command-line scanner of gpumem's tools and benchmarks (tools/common/command_line.hpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "command_line.hpp"

namespace {

// argv for `args` (kept alive by the returned vectors).
struct args {
  explicit args(std::vector<std::string> a) : text(std::move(a)) {
    text.insert(text.begin(), "tool");
    for (std::string& s : text) ptrs.push_back(s.data());
  }
  gpumem_tools::command_line scanner() {
    return {static_cast<int>(ptrs.size()), ptrs.data(), "tool"};
  }
  std::vector<std::string> text;
  std::vector<char*> ptrs;
};

TEST(CommandLine, FlagsTakeValuesAfterASpaceOrAnEqualsSign) {
  args a({"--steps", "12", "--config=policy:stitch,max_split_size_mb:64", "trace.pickle", "-",
          "--markdown", "--device-memory=24GiB"});
  auto cl = a.scanner();
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.is("--steps"));
  EXPECT_EQ(cl.unsigned_value(), 12u);
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.is("--config"));
  EXPECT_EQ(cl.value(), "policy:stitch,max_split_size_mb:64");  // only the first '=' splits
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.positional());
  EXPECT_EQ(cl.arg(), "trace.pickle");
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.positional());  // "-": standard input
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.is("--markdown"));
  EXPECT_FALSE(cl.positional());
  cl.no_value();
  ASSERT_TRUE(cl.next());
  EXPECT_EQ(cl.size_value(), 24ull << 30);
  EXPECT_FALSE(cl.next());
}

TEST(CommandLine, SizesTakeFractionsAndBlanksBeforeTheUnit) {
  args a({"--device-memory", "1.5GiB", "--overhead=512 MiB"});
  auto cl = a.scanner();
  ASSERT_TRUE(cl.next());
  EXPECT_EQ(cl.size_value(), 3ull << 29);
  ASSERT_TRUE(cl.next());
  EXPECT_EQ(cl.size_value(), 512ull << 20);
}

TEST(CommandLine, AListFlagTakesEveryArgumentUpToTheNextDoubleDashFlag) {
  // Single-dash arguments, "-" and empty ones are values of the list, as are positionals.
  args a({"--compare=policy:classic", "", "-h", "-", "trace.pickle", "--json", "--compare",
          "--compare", "last"});
  auto cl = a.scanner();
  ASSERT_TRUE(cl.next());
  EXPECT_EQ(cl.values(),
            (std::vector<std::string>{"policy:classic", "", "-h", "-", "trace.pickle"}));
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.is("--json"));
  ASSERT_TRUE(cl.next());
  EXPECT_TRUE(cl.values().empty());  // none before the next flag
  ASSERT_TRUE(cl.next());
  EXPECT_EQ(cl.values(), std::vector<std::string>{"last"});
  EXPECT_FALSE(cl.next());
}

TEST(CommandLine, BadCommandLinesExitWithStatusTwoAndSayWhy) {
  const auto run = [](std::vector<std::string> argv, void (*use)(gpumem_tools::command_line&)) {
    args a(std::move(argv));
    auto cl = a.scanner();
    cl.next();
    use(cl);
  };
  EXPECT_EXIT(run({"--steps"}, [](auto& cl) { cl.value(); }), testing::ExitedWithCode(2),
              "tool: --steps needs a value \\(see --help\\)");
  EXPECT_EXIT(run({"--markdown=yes"}, [](auto& cl) { cl.no_value(); }), testing::ExitedWithCode(2),
              "--markdown takes no value");
  EXPECT_EXIT(run({"--seed", "-1"}, [](auto& cl) { cl.unsigned_value(); }),
              testing::ExitedWithCode(2), "--seed needs a non-negative integer, got \"-1\"");
  EXPECT_EXIT(run({"--seed", "99999999999999999999"}, [](auto& cl) { cl.unsigned_value(); }),
              testing::ExitedWithCode(2), "out of range");
  EXPECT_EXIT(run({"--steps", "13"}, [](auto& cl) { cl.unsigned_value(12); }),
              testing::ExitedWithCode(2), "--steps 13 is out of range \\(at most 12\\)");
  EXPECT_EXIT(run({"--device-memory", "24"}, [](auto& cl) { cl.size_value(); }),
              testing::ExitedWithCode(2), "\"24\" has no unit: write e.g. 24GiB");
  // A fraction or trailing blanks are no unit either: parse_size would read bytes.
  EXPECT_EXIT(run({"--device-memory", "1.5"}, [](auto& cl) { cl.size_value(); }),
              testing::ExitedWithCode(2), "\"1.5\" has no unit: write e.g. 1.5GiB or 1.5MiB");
  EXPECT_EXIT(run({"--overhead", "24 "}, [](auto& cl) { cl.size_value(); }),
              testing::ExitedWithCode(2), "--overhead \"24 \" has no unit: write e.g. 24GiB ");
  EXPECT_EXIT(run({"--device-memory", "24GB"}, [](auto& cl) { cl.size_value(); }),
              testing::ExitedWithCode(2), "--device-memory: ");
  EXPECT_EXIT(run({"--bogus\x01"}, [](auto& cl) { cl.unknown(); }), testing::ExitedWithCode(2),
              "unknown option \"--bogus\\\\x01\"");
  EXPECT_EXIT(run({"stray"}, [](auto& cl) { cl.unknown(); }), testing::ExitedWithCode(2),
              "unknown argument \"stray\"");
}

}  // namespace
