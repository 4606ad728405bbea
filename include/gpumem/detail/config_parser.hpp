// gpumem — the tokenizer, syntax and number readers behind allocator_config::parse.
//
// Nobody should call this directly: use gpumem/config.hpp. Everything here is pure (no globals) and
// therefore safe to call from any thread; errors are thrown as gpumem::config_error.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gpumem/detail/bits.hpp"
#include "gpumem/detail/utf8.hpp"
#include "gpumem/error.hpp"

namespace gpumem::detail {

inline constexpr std::size_t config_mib = std::size_t{1} << 20;

enum class config_token_kind { word, colon, comma, open, close };

struct config_token {
  config_token_kind kind = config_token_kind::word;
  std::string text;          // whitespace removed, as PyTorch's tokenizer does
  std::size_t position = 0;  // 0-based offset of the token's first character in the string
};

// One `a:b` item of a `[a:b,c:d]` list.
struct config_item {
  config_token key;
  config_token value;
};

// One `key:value` entry. A missing value reads as an empty word placed right after the ':'.
struct config_entry {
  config_token key;
  bool is_list = false;
  config_token value;              // the value when !is_list; the '[' token when is_list
  std::vector<config_item> items;  // when is_list
  std::string value_text;          // the value as written, whitespace removed (for error messages)
};

// Where the string came from: empty for code, else the environment variable's name. Only used to
// say where an error is.
struct config_source {
  std::string_view name;
};

inline std::string config_location(std::size_t position, config_source source) {
  std::string where = "at position " + std::to_string(position);
  if (!source.name.empty()) where += " of " + std::string(source.name);
  return where;
}

[[noreturn]] inline void throw_invalid_value(config_source source, const std::string& key,
                                             const std::string& value, std::size_t position,
                                             std::string_view reason) {
  throw config_error("gpumem config: invalid value '" + printable_excerpt(value) + "' for key '" +
                         printable_excerpt(key) + "' " + config_location(position, source) + ": " +
                         std::string(reason),
                     key, value, position);
}

[[noreturn]] inline void throw_syntax_error(config_source source, const std::string& key,
                                            const std::string& found, std::size_t position,
                                            std::string_view reason) {
  std::string subject = key.empty()
                            ? std::string("syntax error")
                            : "syntax error in the entry for key '" + printable_excerpt(key) + "'";
  throw config_error("gpumem config: " + subject + " " + config_location(position, source) + ": " +
                         std::string(reason) + ", found '" + printable_excerpt(found) + "'",
                     key, found, position);
}

inline bool is_config_space(char c) noexcept {
  // The C locale's isspace set, spelled out so that the program's locale cannot change parsing.
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Splits like PyTorch's ConfigTokenizer: ':' ',' '[' ']' are tokens of their own and whitespace is
// dropped everywhere — even inside a word, so "1 00" reads as "100", exactly as PyTorch reads it.
inline std::vector<config_token> tokenize_config(std::string_view text) {
  std::vector<config_token> tokens;
  config_token word;
  bool in_word = false;
  auto flush = [&] {
    if (in_word) tokens.push_back(std::move(word));
    word = config_token{};
    in_word = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    config_token_kind kind = config_token_kind::word;
    switch (c) {
      case ':':
        kind = config_token_kind::colon;
        break;
      case ',':
        kind = config_token_kind::comma;
        break;
      case '[':
        kind = config_token_kind::open;
        break;
      case ']':
        kind = config_token_kind::close;
        break;
      default:
        break;
    }
    if (kind != config_token_kind::word) {
      flush();
      tokens.push_back(config_token{kind, std::string(1, c), i});
    } else if (!is_config_space(c)) {
      if (!in_word) word.position = i;
      in_word = true;
      word.text += c;
    }
  }
  flush();
  return tokens;
}

// Reads `key:value(,key:value)*` with at most one trailing comma (PyTorch accepts one, and rejects
// an empty entry such as ",," or a leading ","). PyTorch 2.11 does not check its separators at all
// (it reads "a,True" like "a:True" and ignores a final stray "]"); gpumem rejects every malformed
// string instead, as its design requires.
class config_syntax_reader {
 public:
  config_syntax_reader(std::string_view text, config_source source)
      : text_size_(text.size()), tokens_(tokenize_config(text)), source_(source) {}

  std::vector<config_entry> read() {
    std::vector<config_entry> entries;
    while (next_ < tokens_.size()) {
      entries.push_back(read_entry());
      if (next_ == tokens_.size()) break;
      const config_token& sep = tokens_[next_];
      if (sep.kind == config_token_kind::comma) {
        ++next_;  // a comma at the very end is accepted, as in PyTorch
        continue;
      }
      const std::string& key = entries.back().key.text;
      if (sep.kind == config_token_kind::close) {
        throw_syntax_error(source_, key, sep.text, sep.position, "']' without a matching '['");
      }
      throw_syntax_error(source_, key, sep.text, sep.position,
                         "expected ',' between entries or the end of the string");
    }
    return entries;
  }

 private:
  bool at(config_token_kind kind) const {
    return next_ < tokens_.size() && tokens_[next_].kind == kind;
  }
  std::string found() const { return next_ < tokens_.size() ? tokens_[next_].text : "end"; }
  std::size_t found_position() const {
    return next_ < tokens_.size() ? tokens_[next_].position : text_size_;
  }

  // The word at the cursor; an absent value becomes an empty word at `missing_at`.
  config_token read_word_or_empty(std::size_t missing_at) {
    if (at(config_token_kind::word)) return tokens_[next_++];
    return config_token{config_token_kind::word, std::string(), missing_at};
  }

  config_entry read_entry() {
    config_entry entry;
    if (!at(config_token_kind::word)) {
      throw_syntax_error(source_, "", found(), found_position(), "expected a key");
    }
    entry.key = tokens_[next_++];
    if (!at(config_token_kind::colon)) {
      throw_syntax_error(source_, entry.key.text, found(), found_position(),
                         "expected ':' after the key");
    }
    const std::size_t after_colon = tokens_[next_++].position + 1;
    if (at(config_token_kind::open)) {
      read_list(entry);
    } else {
      entry.value = read_word_or_empty(after_colon);
      entry.value_text = entry.value.text;
    }
    return entry;
  }

  void read_list(config_entry& entry) {
    entry.is_list = true;
    entry.value = tokens_[next_++];
    entry.value_text = "[";
    auto unclosed = [&] {
      throw_syntax_error(source_, entry.key.text, entry.value_text, entry.value.position,
                         "'[' is never closed: expected ']' before the end of the string");
    };
    while (true) {
      if (next_ == tokens_.size()) unclosed();
      if (at(config_token_kind::close)) break;  // "[]" and "[a:b,]" are accepted, as in PyTorch
      if (!at(config_token_kind::word)) {
        throw_syntax_error(source_, entry.key.text, found(), found_position(),
                           "expected an 'interval:value' item inside '[...]'");
      }
      config_item item;
      item.key = tokens_[next_++];
      entry.value_text += item.key.text;
      if (!at(config_token_kind::colon)) {
        if (next_ == tokens_.size()) unclosed();
        throw_syntax_error(source_, entry.key.text, found(), found_position(),
                           "expected ':' inside an 'interval:value' item");
      }
      const std::size_t after_colon = tokens_[next_++].position + 1;
      entry.value_text += ':';
      item.value = read_word_or_empty(after_colon);
      entry.value_text += item.value.text;
      entry.items.push_back(std::move(item));
      if (at(config_token_kind::comma)) {
        ++next_;
        entry.value_text += ',';
      } else if (!at(config_token_kind::close)) {
        if (next_ == tokens_.size()) unclosed();
        throw_syntax_error(source_, entry.key.text, found(), found_position(),
                           "expected ',' or ']' after an 'interval:value' item");
      }
    }
    ++next_;  // the ']'
    entry.value_text += ']';
  }

  std::size_t text_size_;
  std::vector<config_token> tokens_;
  config_source source_;
  std::size_t next_ = 0;
};

inline std::vector<config_entry> read_config_entries(std::string_view text, config_source source) {
  return config_syntax_reader(text, source).read();
}

// A non-negative decimal integer that fits in 64 bits. PyTorch's std::stoull would also take "+5",
// wrap "-1" to 2^64-1 and read "100abc" as 100; gpumem rejects all three.
inline std::uint64_t read_config_uint(const config_token& value, const std::string& key,
                                      config_source source) {
  const std::string& s = value.text;
  if (s.empty()) {
    throw_invalid_value(source, key, s, value.position,
                        "missing value: expected a non-negative integer");
  }
  if (s[0] == '-') {
    throw_invalid_value(source, key, s, value.position,
                        "negative numbers are not allowed: expected a non-negative integer");
  }
  for (char c : s) {
    if (c < '0' || c > '9') {
      throw_invalid_value(source, key, s, value.position,
                          "expected a non-negative decimal integer (digits only)");
    }
  }
  std::uint64_t result = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), result);
  if (ec == std::errc::result_out_of_range) {
    throw_invalid_value(source, key, s, value.position, "too large: does not fit in 64 bits");
  }
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw_invalid_value(source, key, s, value.position, "expected a non-negative integer");
  }
  return result;
}

// A decimal number (from_chars, so the program's locale cannot change the decimal point). "nan"
// and "inf" read as numbers here; every caller range-checks, which rejects them.
inline double read_config_double(const config_token& value, const std::string& key,
                                 config_source source) {
  const std::string& s = value.text;
  if (s.empty()) {
    throw_invalid_value(source, key, s, value.position, "missing value: expected a number");
  }
  double result = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), result);
  if (ec == std::errc::result_out_of_range) {
    throw_invalid_value(source, key, s, value.position, "out of range for a double");
  }
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw_invalid_value(source, key, s, value.position, "expected a decimal number");
  }
  return result;
}

// Exactly "True" or "False", as PyTorch requires ("true", "1", "Yes" are errors there too).
inline bool read_config_bool(const config_token& value, const std::string& key,
                             config_source source) {
  if (value.text == "True") return true;
  if (value.text == "False") return false;
  throw_invalid_value(source, key, value.text, value.position, "expected True or False");
}

}  // namespace gpumem::detail
