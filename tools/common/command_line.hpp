// gpumem's command-line tools and benchmarks: one scanner of their arguments. Flags are
// `--name VALUE` or `--name=VALUE` (single-dash short flags such as `-h` take no `=`); anything
// else is positional. A bad command line is a usage error: "TOOL: message (see --help)" on
// stderr, exit status 2. What the user typed is echoed through printable_excerpt (no control
// characters, bounded length).
//
//   gpumem_tools::command_line cl(argc, argv, "gpumem-replay");
//   while (cl.next()) {
//     if (cl.is("--help")) { cl.no_value(); ... }
//     else if (cl.is("--steps")) steps = cl.unsigned_value();
//     else if (cl.positional()) paths.push_back(cl.arg());
//     else cl.unknown();
//   }
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/detail/size_units.hpp"
#include "gpumem/detail/utf8.hpp"

namespace gpumem_tools {

/// "TOOL: message (see --help)" on stderr, exit status 2: a bad command line.
[[noreturn]] inline void usage_error(const std::string& tool, const std::string& message) {
  std::fprintf(stderr, "%s: %s (see --help)\n", tool.c_str(), message.c_str());
  std::exit(2);
}

class command_line {
 public:
  command_line(int argc, char** argv, std::string tool)
      : argc_(argc), argv_(argv), tool_(std::move(tool)) {}

  /// Moves to the next argument; false when there is none left.
  bool next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    inline_value_.reset();
    if (arg_.rfind("--", 0) == 0) {
      const auto eq = arg_.find('=');
      if (eq != std::string::npos) {
        inline_value_ = arg_.substr(eq + 1);
        arg_.resize(eq);
      }
    }
    return true;
  }

  /// The current argument (a flag without its `=VALUE`).
  const std::string& arg() const noexcept { return arg_; }

  /// The current argument is flag `name`.
  bool is(std::string_view name) const noexcept { return arg_ == name; }

  /// The current argument is not a flag ("-" alone counts as positional: standard input).
  bool positional() const noexcept { return arg_.empty() || arg_[0] != '-' || arg_ == "-"; }

  /// The current flag's value: after `=`, else the next argument. A usage error when none.
  std::string value() {
    if (inline_value_) return *std::exchange(inline_value_, std::nullopt);
    if (i_ + 1 >= argc_) fail(fmt::format("{} needs a value", shown(arg_)));
    return argv_[++i_];
  }

  /// The current flag's list of values: its `=VALUE` if it has one, then every following
  /// argument up to the next one that starts with `--` (`--compare A B --json`); maybe none.
  std::vector<std::string> values() {
    std::vector<std::string> list;
    if (inline_value_) list.push_back(*std::exchange(inline_value_, std::nullopt));
    while (i_ + 1 < argc_ && std::string_view(argv_[i_ + 1]).rfind("--", 0) != 0) {
      list.emplace_back(argv_[++i_]);
    }
    return list;
  }

  /// A usage error when the current flag was given a value (`--flag=VALUE`).
  void no_value() {
    if (inline_value_) fail(fmt::format("{} takes no value", shown(arg_)));
  }

  /// The value as a non-negative decimal integer no larger than `max`.
  std::uint64_t unsigned_value(std::uint64_t max = UINT64_MAX) {
    const std::string flag = arg_;
    const std::string text = value();
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
      fail(fmt::format("{} needs a non-negative integer, got \"{}\"", flag, shown(text)));
    }
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
    if (errno == ERANGE || v > max) {
      fail(fmt::format("{} {} is out of range (at most {})", flag, shown(text), max));
    }
    return static_cast<std::uint64_t>(v);
  }

  /// The value as a size with a unit ("24GiB", "1536MiB", "4096B"); a number without one is
  /// refused ("24", "1.5", "24 ": parse_size would read them as bytes).
  std::uint64_t size_value() {
    const std::string flag = arg_;
    const std::string text = value();
    std::string_view number = text;
    while (!number.empty() && (number.back() == ' ' || number.back() == '\t')) {
      number.remove_suffix(1);
    }
    if (!number.empty() &&
        ((number.back() >= '0' && number.back() <= '9') || number.back() == '.')) {
      const std::string suggested = shown(std::string(number));
      fail(fmt::format("{} \"{}\" has no unit: write e.g. {}GiB or {}MiB (B for bytes)", flag,
                       shown(text), suggested, suggested));
    }
    try {
      return gpumem::parse_size(text);
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("{}: {}", flag, gpumem::detail::printable_excerpt(e.what(), 300)));
    }
  }

  /// A usage error for the current argument, unknown to the tool.
  [[noreturn]] void unknown() const {
    fail(fmt::format("unknown {} \"{}\"", positional() ? "argument" : "option", shown(arg_)));
  }

  /// "TOOL: message (see --help)" on stderr, exit status 2.
  [[noreturn]] void fail(const std::string& message) const { usage_error(tool_, message); }

 private:
  static std::string shown(const std::string& text) {
    return gpumem::detail::printable_excerpt(text);
  }

  int argc_;
  char** argv_;
  std::string tool_;
  int i_ = 0;
  std::string arg_;
  std::optional<std::string> inline_value_;
};

}  // namespace gpumem_tools
