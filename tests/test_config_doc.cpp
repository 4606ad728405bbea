// Tests of gpumem::detail::config_keys, the table of allocator_config's keys: docs/configuration.md
// shows exactly its rows, its documented defaults are allocator_config's defaults, every spelling
// is known, and parse() and validate() enforce its limits at both ends.
#include "gpumem/config.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using gpumem::allocator_config;
using gpumem::config_error;
using gpumem::detail::config_key;
using gpumem::detail::config_key_origin;
using gpumem::detail::config_keys;

// The "Keys" table row that docs/configuration.md must hold for `key`.
std::string doc_row(const config_key& key) {
  std::string name = "`" + std::string(key.name) + "`";
  if (!key.alias.empty()) name += " (alias `" + std::string(key.alias) + "`)";
  if (key.origin == config_key_origin::gpumem) name += " (gpumem)";
  std::string row = "| " + name;
  for (std::string_view cell :
       {key.doc.default_value, key.doc.accepted_values, key.doc.meaning, key.doc.honoured}) {
    row += " | " + std::string(cell);
  }
  return row + " |";
}

// The rows of the table under "## Keys" (lines starting with "| `"), up to the next heading.
std::vector<std::string> documented_rows(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<std::string> rows;
  bool in_keys = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) {
      in_keys = line == "## Keys";
      continue;
    }
    if (in_keys && line.rfind("| `", 0) == 0) rows.push_back(line);
  }
  return rows;
}

TEST(config_doc, keys_table_is_the_table_of_keys) {
  const std::string path = std::string(GPUMEM_SOURCE_DIR) + "/docs/configuration.md";
  const std::vector<std::string> documented = documented_rows(path);
  ASSERT_FALSE(documented.empty()) << path << " has no '## Keys' table";
  std::ostringstream expected_table;
  for (const config_key& key : config_keys) expected_table << doc_row(key) << '\n';
  const std::string hint =
      "\nThe rows detail::config_keys gives, in its order:\n" + expected_table.str();

  for (const config_key& key : config_keys) {
    const std::string expected = doc_row(key);
    const std::string prefix = "| `" + std::string(key.name) + "`";
    std::vector<std::string> found;
    for (const std::string& row : documented) {
      if (row.compare(0, prefix.size(), prefix) == 0) found.push_back(row);
    }
    if (found.empty()) {
      ADD_FAILURE() << path << ": the key " << key.name << " is missing from the Keys table";
    } else if (found.size() > 1) {
      ADD_FAILURE() << path << ": the key " << key.name << " has " << found.size() << " rows";
    } else {
      EXPECT_EQ(found.front(), expected)
          << path << ": the row of " << key.name << " differs from detail::config_keys";
    }
  }
  EXPECT_EQ(documented.size(), config_keys.size())
      << path << ": the Keys table has " << documented.size() << " rows, detail::config_keys "
      << config_keys.size() << hint;
  for (std::size_t i = 0; i < documented.size() && i < config_keys.size(); ++i) {
    if (documented[i] != doc_row(config_keys[i])) {
      ADD_FAILURE() << path << ": row " << i + 1 << " of the Keys table is not "
                    << config_keys[i].name << "'s (the doc keeps the table's order)" << hint;
      break;
    }
  }
}

bool has_number(std::string_view text, const std::string& number) {
  for (std::size_t at = text.find(number); at != std::string_view::npos;
       at = text.find(number, at + 1)) {
    const auto digit = [&](std::size_t i) { return text[i] >= '0' && text[i] <= '9'; };
    const std::size_t end = at + number.size();
    if ((at == 0 || !digit(at - 1)) && (end == text.size() || !digit(end))) return true;
  }
  return false;
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<std::int64_t>(v));
  }
  return gpumem::detail::config_double_text(v);
}

// The documented accepted values name the table's limits: a fraction's range (at most 1) in
// interval notation, an integer's finite limits as numbers (the lower one implied for a power
// of two).
TEST(config_doc, accepted_values_name_the_limits) {
  int checked = 0;
  for (const config_key& key : config_keys) {
    const auto& r = key.limits.range;
    const std::string_view doc = key.doc.accepted_values;
    if (!std::isfinite(r.hi) && r.lo == 0.0) continue;  // no limit of its own
    ++checked;
    if (r.hi == 1.0) {
      const std::string interval = (r.lo_open ? "(" : "[") + number_text(r.lo) + ", " +
                                   number_text(r.hi) + (r.hi_open ? ")" : "]");
      EXPECT_NE(doc.find(interval), std::string_view::npos)
          << key.name << ": '" << doc << "' does not say " << interval;
      continue;
    }
    if (!key.limits.power_of_two) {
      EXPECT_TRUE(has_number(doc, number_text(r.lo))) << key.name << ": '" << doc << "'";
    }
    if (std::isfinite(r.hi)) {
      EXPECT_TRUE(has_number(doc, number_text(r.hi))) << key.name << ": '" << doc << "'";
    }
  }
  EXPECT_GE(checked, 10);
}

// A documented default written as one literal (`20`, `False`, `native`) is what allocator_config
// holds by default: parsing it changes nothing. Every key is left out of a default to_string().
TEST(config_keys, documented_defaults_are_the_defaults) {
  const allocator_config defaults;
  int literals = 0;
  for (const config_key& key : config_keys) {
    EXPECT_FALSE(key.handlers.text(key, defaults).has_value()) << key.name;
    const std::string_view doc = key.doc.default_value;
    if (doc.size() < 3 || doc.front() != '`' || doc.back() != '`') continue;
    const std::string value(doc.substr(1, doc.size() - 2));
    if (value.find('`') != std::string::npos) continue;
    ++literals;
    const allocator_config parsed = allocator_config::parse(std::string(key.name) + ":" + value);
    EXPECT_TRUE(parsed == defaults)
        << key.name << ": the documented default " << value << " is not the default (it reads as "
        << parsed.to_string() << ")";
  }
  EXPECT_GE(literals, 10);
}

// Every spelling of every key is found, and an unknown key's error lists them all.
TEST(config_keys, every_spelling_is_known) {
  std::string message;
  try {
    allocator_config::parse("no_such_key:1");
  } catch (const config_error& e) {
    message = e.what();
  }
  for (const config_key& key : config_keys) {
    EXPECT_EQ(gpumem::detail::find_config_key(key.name), &key);
    EXPECT_NE(message.find(" " + std::string(key.name)), std::string::npos) << key.name;
    if (key.alias.empty()) continue;
    EXPECT_EQ(gpumem::detail::find_config_key(key.alias), &key);
    EXPECT_NE(message.find(" " + std::string(key.alias)), std::string::npos) << key.alias;
  }
  EXPECT_EQ(gpumem::detail::find_config_key("no_such_key"), nullptr);
}

bool parses(const config_key& key, double v) {
  try {
    allocator_config::parse(std::string(key.name) + ":" + number_text(v)).validate();
    return true;
  } catch (const config_error&) {
    return false;
  }
}

// parse() (and validate() on what it returns) accepts a key's value exactly within the limits.
TEST(config_keys, parse_enforces_the_limits_at_both_ends) {
  int checked = 0;
  for (const config_key& key : config_keys) {
    const auto& r = key.limits.range;
    if (r.lo > 0.0 || std::isfinite(r.hi)) {
      ++checked;
      EXPECT_EQ(parses(key, r.lo), !r.lo_open) << key.name << " at " << r.lo;
      if (r.lo >= 1.0) {
        EXPECT_FALSE(parses(key, r.lo - 1.0)) << key.name;
      }
    }
    if (std::isfinite(r.hi)) {
      ++checked;
      EXPECT_EQ(parses(key, r.hi), !r.hi_open) << key.name << " at " << r.hi;
      EXPECT_FALSE(parses(key, r.hi + 1.0)) << key.name;
    }
    if (r.lo == 0.0 && r.hi == 1.0) {
      EXPECT_TRUE(parses(key, 0.5)) << key.name;
    }
  }
  EXPECT_GE(checked, 15);
}

}  // namespace
