// gpumem-replay — JSON string literals, for the tool's --json output and its peer's (the two must
// escape the same way: gpumem-replay reads back what the peer writes).
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace gpumem_replay {

/// `s` as a JSON string literal, quotes included.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace gpumem_replay
