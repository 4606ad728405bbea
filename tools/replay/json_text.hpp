// gpumem-replay — JSON as the tool and its peer write it: nlohmann-json objects that keep their
// keys in the order they were added, printed one record per line.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gpumem_replay {

/// A JSON value whose objects keep insertion order (the records' keys read in a fixed order).
using json = nlohmann::ordered_json;

namespace detail {

inline void append_json_line(std::string& out, const json& j) {
  // Bytes that are not UTF-8 (a trace path, an allocator's message) become U+FFFD instead of
  // making the whole output unwritable.
  const auto scalar = [](const json& v) {
    return v.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  if (j.is_object()) {
    out += '{';
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it != j.begin()) out += ", ";
      out += scalar(json(it.key()));
      out += ": ";
      append_json_line(out, it.value());
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it != j.begin()) out += ", ";
      append_json_line(out, *it);
    }
    out += ']';
  } else {
    out += scalar(j);
  }
}

}  // namespace detail

/// `j` on one line with the separators of Python's json.dumps (", " and ": "): a record stays one
/// line that grep and the shell tests can search.
inline std::string json_line(const json& j) {
  std::string out;
  detail::append_json_line(out, j);
  return out;
}

}  // namespace gpumem_replay
