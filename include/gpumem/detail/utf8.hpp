// gpumem — UTF-8 decoding and escaping of text that came from input (trace files, command lines),
// shared by the reports and the tools. Nothing here is part of the public API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace gpumem::detail {

/// The length of the well-formed UTF-8 sequence of a non-ASCII character at s[i] (2 to 4), or 0 if
/// there is none: a stray continuation byte, a truncated or overlong form, a surrogate, a code
/// point above U+10FFFF. Thread-safe; never throws.
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range the second byte must be in
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return length;
}

/// `text` safe to print on a terminal: control characters (C0, DEL and the C1 controls U+0080 to
/// U+009F, which terminals read as escape sequences) and bytes that are not UTF-8 become `\xNN`
/// escapes, and a backslash becomes `\\`, so the output names every byte of the input. Everything
/// a tool echoes from a file or a command line goes through here. Thread-safe; may throw
/// std::bad_alloc.
inline std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F) {
        escape(c);
      } else if (c == '\\') {
        out += "\\\\";
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text, i);
    const bool c1_control =
        length == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0;
    if (length == 0 || c1_control) {
      escape(c);
      ++i;
      continue;
    }
    out += text.substr(i, length);
    i += length;
  }
  return out;
}

/// printable(text), cut to about `limit` bytes of input with the total length said, for values
/// echoed in error messages (a 1 MB bad value is not worth printing). Thread-safe.
inline std::string printable_excerpt(std::string_view text, std::size_t limit = 80) {
  if (text.size() <= limit) return printable(text);
  std::size_t cut = limit;
  // Do not cut a UTF-8 sequence in two.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return printable(text.substr(0, cut)) + fmt::format("... ({} bytes)", text.size());
}

}  // namespace gpumem::detail
