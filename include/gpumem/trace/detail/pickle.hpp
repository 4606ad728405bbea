// gpumem — a strict unpickler and a small pickler for the data PyTorch's memory snapshots hold.
//
// torch.cuda.memory._dump_snapshot() writes plain Python data (dicts, lists, tuples, str, int,
// float, bool, None) with pickle protocol 2 or later. Reading it in C++ needs no Python: the
// unpickler below executes the opcodes of protocols 2-5 that such data uses and nothing else (no
// GLOBAL, REDUCE or BUILD, so a file can never name code to run). Whatever it does not understand
// is a trace_error naming the opcode (hex) and its byte offset: unknown opcodes, truncation, stack
// underflow, memo misses, unhashable or duplicate dict keys, data after STOP.
//
// It is built to meet hostile bytes: every length is checked against the bytes that remain before
// anything is allocated, so memory stays linear in the input; containers may be shared through
// the memo but never modified once inside another container, so values are acyclic and their
// nesting depth is exact and bounded (the recursive destructors stay shallow). Time stays linear
// too: lists and dicts grow geometrically, and dict keys are interned once per object, so a key
// that the memo shares (a tuple holding another twice, 64 deep) costs no more than its bytes.
//
// The pickler writes the same subset (protocol 2-5) in a form Python's pickle.load reads, with
// equal strings memoised so repeated dict keys cost two bytes.
//
// Nothing here is public API: read_pytorch_snapshot (trace/pytorch_snapshot.hpp) is.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "gpumem/error.hpp"

namespace gpumem::detail {

class pickle_value;

/// Python bytes (kept apart from str, which is UTF-8 text).
struct pickle_bytes {
  std::string data;
};

/// Containers remember the byte offset of the opcode that created them (0 when built in code),
/// so that readers can point at the place in the file a structural error comes from. `depth` is
/// 1 + the deepest container inside; `sealed` is set once the container is inside another one,
/// `shared` once it is inside others twice (the memo gave it again).
struct pickle_tuple {
  std::vector<pickle_value> items;
  std::size_t offset = 0;
  std::uint32_t depth = 1;
  bool hashable = true;
};

struct pickle_list {
  std::vector<pickle_value> items;
  std::size_t offset = 0;
  std::uint32_t depth = 1;
  bool sealed = false;
  bool shared = false;
};

/// A dict keeps Python's insertion order; keys are unique.
struct pickle_dict {
  std::vector<std::pair<pickle_value, pickle_value>> items;
  std::size_t offset = 0;
  std::uint32_t depth = 1;
  bool sealed = false;
  bool shared = false;
};

/// One Python value. Copies are cheap and share containers (as Python references do); strings
/// are immutable and shared too.
class pickle_value {
 public:
  enum class kind : std::uint8_t {
    none,
    boolean,
    integer,
    floating,
    string,
    bytes,
    tuple,
    list,
    dict
  };
  using sequence = std::vector<pickle_value>;
  using dict_items = std::vector<std::pair<pickle_value, pickle_value>>;

  pickle_value() noexcept = default;
  pickle_value(std::nullptr_t) noexcept {}
  pickle_value(bool b) noexcept : v_(b) {}
  /// Any integer type; throws std::out_of_range for an unsigned value above INT64_MAX.
  template <class Int,
            std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
  pickle_value(Int i) : v_(to_int64(i)) {}
  pickle_value(double d) noexcept : v_(d) {}
  pickle_value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  pickle_value(std::string_view s) : pickle_value(std::string(s)) {}
  pickle_value(const char* s) : pickle_value(std::string(s)) {}

  static pickle_value make_bytes(std::string data) {
    pickle_value v;
    v.v_ = std::make_shared<const pickle_bytes>(pickle_bytes{std::move(data)});
    return v;
  }
  static pickle_value make_tuple(sequence items = {}) {
    auto t = std::make_shared<pickle_tuple>();
    t->items = std::move(items);
    for (const pickle_value& x : t->items) {
      t->depth = std::max(t->depth, x.depth() + 1);
      t->hashable = t->hashable && x.hashable();
    }
    pickle_value v;
    v.v_ = std::shared_ptr<const pickle_tuple>(std::move(t));
    return v;
  }
  static pickle_value make_list(sequence items = {}) {
    auto l = std::make_shared<pickle_list>();
    l->items = std::move(items);
    for (const pickle_value& x : l->items) l->depth = std::max(l->depth, x.depth() + 1);
    pickle_value v;
    v.v_ = std::move(l);
    return v;
  }
  static pickle_value make_dict(dict_items items = {}) {
    auto d = std::make_shared<pickle_dict>();
    d->items = std::move(items);
    for (const auto& [k, x] : d->items) {
      d->depth = std::max({d->depth, k.depth() + 1, x.depth() + 1});
    }
    pickle_value v;
    v.v_ = std::move(d);
    return v;
  }

  kind type() const noexcept { return static_cast<kind>(v_.index()); }
  bool is_none() const noexcept { return type() == kind::none; }
  bool is_bool() const noexcept { return type() == kind::boolean; }
  bool is_int() const noexcept { return type() == kind::integer; }
  bool is_float() const noexcept { return type() == kind::floating; }
  bool is_str() const noexcept { return type() == kind::string; }
  bool is_tuple() const noexcept { return type() == kind::tuple; }
  bool is_list() const noexcept { return type() == kind::list; }
  bool is_dict() const noexcept { return type() == kind::dict; }

  // Accessors throw std::bad_variant_access when the value is of another kind.
  bool as_bool() const { return std::get<bool>(v_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_str() const { return *std::get<str_ptr>(v_); }
  const std::string& as_bytes() const { return std::get<bytes_ptr>(v_)->data; }
  const sequence& as_tuple() const { return std::get<tuple_ptr>(v_)->items; }
  /// The list's items; through the non-const overload every copy of this value sees the change.
  const sequence& as_list() const { return std::get<list_ptr>(v_)->items; }
  sequence& as_list() { return std::get<list_ptr>(v_)->items; }
  const dict_items& as_dict() const { return std::get<dict_ptr>(v_)->items; }
  /// The dict's items; the caller keeps keys unique and hashable.
  dict_items& as_dict() { return std::get<dict_ptr>(v_)->items; }

  /// The value under str key `key` of a dict; nullptr when absent or when this is not a dict.
  const pickle_value* find(std::string_view key) const noexcept {
    if (!is_dict()) return nullptr;
    for (const auto& [k, x] : std::get<dict_ptr>(v_)->items) {
      if (k.is_str() && k.as_str() == key) return &x;
    }
    return nullptr;
  }

  /// Byte offset of the opcode that created this container in the parsed input (0 otherwise).
  std::size_t offset() const noexcept {
    switch (type()) {
      case kind::tuple:
        return std::get<tuple_ptr>(v_)->offset;
      case kind::list:
        return std::get<list_ptr>(v_)->offset;
      case kind::dict:
        return std::get<dict_ptr>(v_)->offset;
      default:
        return 0;
    }
  }

  /// 0 for scalars, 1 + the deepest container inside for containers.
  std::uint32_t depth() const noexcept {
    switch (type()) {
      case kind::tuple:
        return std::get<tuple_ptr>(v_)->depth;
      case kind::list:
        return std::get<list_ptr>(v_)->depth;
      case kind::dict:
        return std::get<dict_ptr>(v_)->depth;
      default:
        return 0;
    }
  }

  /// Whether this list or dict was unpickled into two places in other containers (through the
  /// memo): walking a value visits it more than once. Values built in code say false.
  bool shared() const noexcept {
    switch (type()) {
      case kind::list:
        return std::get<list_ptr>(v_)->shared;
      case kind::dict:
        return std::get<dict_ptr>(v_)->shared;
      default:
        return false;
    }
  }

  /// Whether Python could use this value as a dict key.
  bool hashable() const noexcept {
    switch (type()) {
      case kind::list:
      case kind::dict:
        return false;
      case kind::tuple:
        return std::get<tuple_ptr>(v_)->hashable;
      default:
        return true;
    }
  }

  /// Whether both are the same container object (not merely equal).
  bool same_object(const pickle_value& o) const noexcept {
    if (type() != o.type()) return false;
    switch (type()) {
      case kind::list:
        return std::get<list_ptr>(v_) == std::get<list_ptr>(o.v_);
      case kind::dict:
        return std::get<dict_ptr>(v_) == std::get<dict_ptr>(o.v_);
      case kind::tuple:
        return std::get<tuple_ptr>(v_) == std::get<tuple_ptr>(o.v_);
      default:
        return false;
    }
  }

  /// Structural equality: same kind and equal contents (so 1 != 1.0 != True here, unlike Python;
  /// dicts compare in order).
  friend bool operator==(const pickle_value& a, const pickle_value& b) {
    if (a.type() != b.type()) return false;
    switch (a.type()) {
      case kind::none:
        return true;
      case kind::boolean:
        return a.as_bool() == b.as_bool();
      case kind::integer:
        return a.as_int() == b.as_int();
      case kind::floating: {
        const double x = a.as_float();
        const double y = b.as_float();
        return x == y || (x != x && y != y);
      }
      case kind::string:
        return a.as_str() == b.as_str();
      case kind::bytes:
        return a.as_bytes() == b.as_bytes();
      case kind::tuple:
        return a.as_tuple() == b.as_tuple();
      case kind::list:
        return a.as_list() == b.as_list();
      case kind::dict:
        return a.as_dict() == b.as_dict();
    }
    return false;
  }
  friend bool operator!=(const pickle_value& a, const pickle_value& b) { return !(a == b); }

 private:
  friend class unpickler;
  using str_ptr = std::shared_ptr<const std::string>;
  using bytes_ptr = std::shared_ptr<const pickle_bytes>;
  using tuple_ptr = std::shared_ptr<const pickle_tuple>;
  using list_ptr = std::shared_ptr<pickle_list>;
  using dict_ptr = std::shared_ptr<pickle_dict>;

  template <class Int>
  static std::int64_t to_int64(Int i) {
    if constexpr (std::is_unsigned_v<Int> && sizeof(Int) >= sizeof(std::int64_t)) {
      if (i > static_cast<Int>(std::numeric_limits<std::int64_t>::max())) {
        throw std::out_of_range("pickle_value: integer above INT64_MAX");
      }
    }
    return static_cast<std::int64_t>(i);
  }

  std::variant<std::monostate, bool, std::int64_t, double, str_ptr, bytes_ptr, tuple_ptr, list_ptr,
               dict_ptr>
      v_;
};

/// The kind's name as Python spells the type ("dict", "int", ...).
constexpr std::string_view kind_name(pickle_value::kind k) noexcept {
  switch (k) {
    case pickle_value::kind::none:
      return "None";
    case pickle_value::kind::boolean:
      return "bool";
    case pickle_value::kind::integer:
      return "int";
    case pickle_value::kind::floating:
      return "float";
    case pickle_value::kind::string:
      return "str";
    case pickle_value::kind::bytes:
      return "bytes";
    case pickle_value::kind::tuple:
      return "tuple";
    case pickle_value::kind::list:
      return "list";
    case pickle_value::kind::dict:
      return "dict";
  }
  return "?";
}

// The opcodes this file reads or writes (pickletools' names).
namespace pickle_op {
inline constexpr unsigned char mark = 0x28;            // (
inline constexpr unsigned char stop = 0x2e;            // .
inline constexpr unsigned char empty_tuple = 0x29;     // )
inline constexpr unsigned char binbytes = 0x42;        // B
inline constexpr unsigned char short_binbytes = 0x43;  // C
inline constexpr unsigned char binfloat = 0x47;        // G
inline constexpr unsigned char binint = 0x4a;          // J
inline constexpr unsigned char binint1 = 0x4b;         // K
inline constexpr unsigned char binint2 = 0x4d;         // M
inline constexpr unsigned char none = 0x4e;            // N
inline constexpr unsigned char binunicode = 0x58;      // X
inline constexpr unsigned char empty_list = 0x5d;      // ]
inline constexpr unsigned char append = 0x61;          // a
inline constexpr unsigned char appends = 0x65;         // e
inline constexpr unsigned char binget = 0x68;          // h
inline constexpr unsigned char long_binget = 0x6a;     // j
inline constexpr unsigned char binput = 0x71;          // q
inline constexpr unsigned char long_binput = 0x72;     // r
inline constexpr unsigned char setitem = 0x73;         // s
inline constexpr unsigned char tuple = 0x74;           // t
inline constexpr unsigned char setitems = 0x75;        // u
inline constexpr unsigned char empty_dict = 0x7d;      // }
inline constexpr unsigned char proto = 0x80;
inline constexpr unsigned char tuple1 = 0x85;
inline constexpr unsigned char tuple2 = 0x86;
inline constexpr unsigned char tuple3 = 0x87;
inline constexpr unsigned char newtrue = 0x88;
inline constexpr unsigned char newfalse = 0x89;
inline constexpr unsigned char long1 = 0x8a;
inline constexpr unsigned char long4 = 0x8b;
inline constexpr unsigned char short_binunicode = 0x8c;
inline constexpr unsigned char binunicode8 = 0x8d;
inline constexpr unsigned char binbytes8 = 0x8e;
inline constexpr unsigned char memoize = 0x94;
inline constexpr unsigned char frame = 0x95;
}  // namespace pickle_op

/// pickletools' name of a supported opcode; "unsupported" for any other byte.
constexpr std::string_view pickle_opcode_name(unsigned char op) noexcept {
  namespace o = pickle_op;
  switch (op) {
    case o::mark:
      return "MARK";
    case o::stop:
      return "STOP";
    case o::empty_tuple:
      return "EMPTY_TUPLE";
    case o::binbytes:
      return "BINBYTES";
    case o::short_binbytes:
      return "SHORT_BINBYTES";
    case o::binfloat:
      return "BINFLOAT";
    case o::binint:
      return "BININT";
    case o::binint1:
      return "BININT1";
    case o::binint2:
      return "BININT2";
    case o::none:
      return "NONE";
    case o::binunicode:
      return "BINUNICODE";
    case o::empty_list:
      return "EMPTY_LIST";
    case o::append:
      return "APPEND";
    case o::appends:
      return "APPENDS";
    case o::binget:
      return "BINGET";
    case o::long_binget:
      return "LONG_BINGET";
    case o::binput:
      return "BINPUT";
    case o::long_binput:
      return "LONG_BINPUT";
    case o::setitem:
      return "SETITEM";
    case o::tuple:
      return "TUPLE";
    case o::setitems:
      return "SETITEMS";
    case o::empty_dict:
      return "EMPTY_DICT";
    case o::proto:
      return "PROTO";
    case o::tuple1:
      return "TUPLE1";
    case o::tuple2:
      return "TUPLE2";
    case o::tuple3:
      return "TUPLE3";
    case o::newtrue:
      return "NEWTRUE";
    case o::newfalse:
      return "NEWFALSE";
    case o::long1:
      return "LONG1";
    case o::long4:
      return "LONG4";
    case o::short_binunicode:
      return "SHORT_BINUNICODE";
    case o::binunicode8:
      return "BINUNICODE8";
    case o::binbytes8:
      return "BINBYTES8";
    case o::memoize:
      return "MEMOIZE";
    case o::frame:
      return "FRAME";
    default:
      return "unsupported";
  }
}

/// Whether `s` is UTF-8 as Python's pickle accepts it (lone surrogates allowed, as with
/// 'surrogatepass'; overlong forms and values above U+10FFFF rejected). Never throws.
inline bool pickle_utf8_valid(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    if (n - i >= 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (n - i < len) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

/// Reads one pickle. Use unpickle() below.
class unpickler {
 public:
  /// Containers nested deeper than this are an error (PyTorch snapshots nest about 6 deep).
  static constexpr std::uint32_t default_max_depth = 256;

  explicit unpickler(std::string_view data, std::uint32_t max_depth = default_max_depth)
      : data_(data), max_depth_(max_depth) {}

  pickle_value load() {
    namespace o = pickle_op;
    const std::size_t n = data_.size();
    while (pos_ < n) {
      op_pos_ = pos_;
      op_ = static_cast<unsigned char>(data_[pos_++]);
      switch (op_) {
        case o::proto: {
          const unsigned v = u8();
          if (v < 2 || v > 5) fail(fmt::format("unsupported protocol {}", v));
          break;
        }
        case o::frame: {
          const std::uint64_t len = uint_le(8);
          if (len > n - pos_) truncated(len);
          break;
        }
        case o::stop: {
          if (!marks_.empty()) fail("STOP inside an unclosed MARK");
          if (stack_.size() != 1) {
            fail(fmt::format("STOP with {} values on the stack instead of 1", stack_.size()));
          }
          if (pos_ != n) {
            throw trace_error(
                fmt::format("pickle: {} bytes of data after STOP at byte {}", n - pos_, op_pos_),
                pos_);
          }
          pickle_value result = std::move(stack_.back());
          stack_.clear();
          return result;
        }
        case o::mark:
          marks_.push_back(stack_.size());
          break;
        case o::none:
          push(pickle_value());
          break;
        case o::newtrue:
          push(pickle_value(true));
          break;
        case o::newfalse:
          push(pickle_value(false));
          break;
        case o::binint1:
          push(pickle_value(static_cast<std::int64_t>(u8())));
          break;
        case o::binint2:
          push(pickle_value(static_cast<std::int64_t>(uint_le(2))));
          break;
        case o::binint: {
          const auto u = static_cast<std::uint32_t>(uint_le(4));
          push(pickle_value(static_cast<std::int64_t>(static_cast<std::int32_t>(u))));
          break;
        }
        case o::long1:
          push(pickle_value(long_value(u8())));
          break;
        case o::long4: {
          const auto len = static_cast<std::int32_t>(static_cast<std::uint32_t>(uint_le(4)));
          if (len < 0) fail(fmt::format("negative length {}", len));
          push(pickle_value(long_value(static_cast<std::uint64_t>(len))));
          break;
        }
        case o::binfloat: {
          need(8);
          std::uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | byte_at(pos_ + k);
          pos_ += 8;
          double d;
          std::memcpy(&d, &bits, sizeof d);
          push(pickle_value(d));
          break;
        }
        case o::short_binunicode:
          push_str(u8());
          break;
        case o::binunicode:
          push_str(uint_le(4));
          break;
        case o::binunicode8:
          push_str(uint_le(8));
          break;
        case o::short_binbytes:
          push_bytes(u8());
          break;
        case o::binbytes:
          push_bytes(uint_le(4));
          break;
        case o::binbytes8:
          push_bytes(uint_le(8));
          break;
        case o::empty_tuple:
          push(new_tuple({}));
          break;
        case o::tuple1:
        case o::tuple2:
        case o::tuple3: {
          const std::size_t k = static_cast<std::size_t>(op_ - o::tuple1) + 1;
          if (stack_.size() < base() + k) underflow();
          std::vector<pickle_value> items(std::make_move_iterator(stack_.end() - k),
                                          std::make_move_iterator(stack_.end()));
          stack_.resize(stack_.size() - k);
          push(new_tuple(std::move(items)));
          break;
        }
        case o::tuple: {
          const std::size_t m = pop_mark();
          std::vector<pickle_value> items(std::make_move_iterator(stack_.begin() + m),
                                          std::make_move_iterator(stack_.end()));
          stack_.resize(m);
          push(new_tuple(std::move(items)));
          break;
        }
        case o::empty_list: {
          auto l = std::make_shared<pickle_list>();
          l->offset = op_pos_;
          pickle_value v;
          v.v_ = std::move(l);
          push(std::move(v));
          break;
        }
        case o::empty_dict: {
          auto d = std::make_shared<pickle_dict>();
          d->offset = op_pos_;
          pickle_value v;
          v.v_ = std::move(d);
          push(std::move(v));
          break;
        }
        case o::append: {
          if (stack_.size() < base() + 2) underflow();
          append_items(stack_.size() - 2, stack_.size() - 1);
          break;
        }
        case o::appends: {
          const std::size_t m = pop_mark();
          if (m == 0 || m - 1 < base()) underflow();
          append_items(m - 1, m);
          break;
        }
        case o::setitem: {
          if (stack_.size() < base() + 3) underflow();
          set_items(stack_.size() - 3, stack_.size() - 2);
          break;
        }
        case o::setitems: {
          const std::size_t m = pop_mark();
          if (m == 0 || m - 1 < base()) underflow();
          if ((stack_.size() - m) % 2 != 0) fail("odd number of values for SETITEMS");
          set_items(m - 1, m);
          break;
        }
        case o::memoize: {
          if (stack_.size() <= base()) underflow();
          memo_put(memo_.size() + sparse_memo_.size(), stack_.back());
          break;
        }
        case o::binput:
        case o::long_binput: {
          const std::uint64_t idx = op_ == o::binput ? u8() : uint_le(4);
          if (stack_.size() <= base()) underflow();
          memo_put(idx, stack_.back());
          break;
        }
        case o::binget:
        case o::long_binget: {
          const std::uint64_t idx = op_ == o::binget ? u8() : uint_le(4);
          if (idx < memo_.size()) {
            stack_.push_back(memo_[static_cast<std::size_t>(idx)]);
          } else {
            const auto it = sparse_memo_.find(idx);
            if (it == sparse_memo_.end()) fail(fmt::format("memo index {} was never stored", idx));
            stack_.push_back(it->second);
          }
          break;
        }
        default:
          fail("unsupported opcode");
      }
    }
    throw trace_error(fmt::format("pickle: input ends at byte {} before STOP", n), n);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw trace_error(fmt::format("pickle: opcode 0x{:02x} ({}) at byte {}: {}", op_,
                                  pickle_opcode_name(op_), op_pos_, what),
                      op_pos_);
  }
  [[noreturn]] void truncated(std::uint64_t wanted) const {
    fail(fmt::format("truncated input ({} bytes needed, {} left)", wanted, data_.size() - pos_));
  }
  [[noreturn]] void underflow() const { fail("stack underflow"); }

  std::uint64_t byte_at(std::size_t i) const noexcept {
    return static_cast<unsigned char>(data_[i]);
  }
  void need(std::uint64_t len) const {
    if (len > data_.size() - pos_) truncated(len);
  }
  unsigned u8() {
    need(1);
    return static_cast<unsigned char>(data_[pos_++]);
  }
  std::uint64_t uint_le(int bytes) {
    need(static_cast<std::uint64_t>(bytes));
    std::uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | byte_at(pos_ + static_cast<std::size_t>(k));
    pos_ += static_cast<std::size_t>(bytes);
    return v;
  }

  // LONG1 / LONG4 payload: little-endian two's complement, which must fit in 64 bits.
  std::int64_t long_value(std::uint64_t len) {
    need(len);
    const std::size_t n = static_cast<std::size_t>(len);
    if (n == 0) return 0;
    const std::size_t low = n < 8 ? n : 8;
    std::uint64_t v = 0;
    for (std::size_t k = low; k-- > 0;) v = (v << 8) | byte_at(pos_ + k);
    const bool negative = (byte_at(pos_ + low - 1) & 0x80) != 0;
    if (low < 8 && negative) v |= ~std::uint64_t{0} << (8 * low);
    const std::uint64_t fill = negative ? 0xff : 0x00;
    for (std::size_t k = 8; k < n; ++k) {
      if (byte_at(pos_ + k) != fill) fail("integer does not fit in 64 bits");
    }
    pos_ += n;
    return static_cast<std::int64_t>(v);
  }

  void push_str(std::uint64_t len) {
    need(len);
    const std::string_view s = data_.substr(pos_, static_cast<std::size_t>(len));
    if (!pickle_utf8_valid(s)) fail("string is not valid UTF-8");
    pos_ += s.size();
    push(pickle_value(std::string(s)));
  }
  void push_bytes(std::uint64_t len) {
    need(len);
    push(pickle_value::make_bytes(std::string(data_.substr(pos_, static_cast<std::size_t>(len)))));
    pos_ += static_cast<std::size_t>(len);
  }

  void push(pickle_value v) { stack_.push_back(std::move(v)); }
  std::size_t base() const noexcept { return marks_.empty() ? 0 : marks_.back(); }
  std::size_t pop_mark() {
    if (marks_.empty()) fail("no MARK to pop");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }

  void memo_put(std::uint64_t idx, const pickle_value& v) {
    if (idx < memo_.size()) {
      memo_[static_cast<std::size_t>(idx)] = v;
    } else if (idx == memo_.size()) {
      memo_.push_back(v);
      // Keep every sparse key above the dense prefix.
      for (auto it = sparse_memo_.find(memo_.size()); it != sparse_memo_.end();
           it = sparse_memo_.find(memo_.size())) {
        memo_.push_back(std::move(it->second));
        sparse_memo_.erase(it);
      }
    } else {
      sparse_memo_[idx] = v;
    }
  }

  pickle_value new_tuple(std::vector<pickle_value> items) {
    auto t = std::make_shared<pickle_tuple>();
    t->offset = op_pos_;
    for (const pickle_value& x : items) {
      t->depth = child_depth(t->depth, x);
      t->hashable = t->hashable && x.hashable();
      seal(x);
    }
    t->items = std::move(items);
    pickle_value v;
    v.v_ = std::shared_ptr<const pickle_tuple>(std::move(t));
    return v;
  }

  // The depth of a container that gains `child`; fails past the limit.
  std::uint32_t child_depth(std::uint32_t depth, const pickle_value& child) const {
    const std::uint32_t d = std::max(depth, child.depth() + 1);
    if (d > max_depth_) fail(fmt::format("containers nested deeper than {}", max_depth_));
    return d;
  }
  // A container inside another is frozen: later changes would be invisible to the depth bound
  // and could close a cycle.
  static void seal(const pickle_value& v) noexcept {
    if (v.is_list()) {
      pickle_list& l = *std::get<pickle_value::list_ptr>(v.v_);
      l.shared = l.shared || l.sealed;
      l.sealed = true;
    }
    if (v.is_dict()) {
      pickle_dict& d = *std::get<pickle_value::dict_ptr>(v.v_);
      d.shared = d.shared || d.sealed;
      d.sealed = true;
    }
  }

  // Grows geometrically: reserving the exact size batch after batch (APPENDS of 1000 items, or
  // one APPEND each) copied the whole list each time.
  template <class T>
  static void reserve_more(std::vector<T>& v, std::size_t extra) {
    const std::size_t need = v.size() + extra;
    if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
  }

  // stack_[target].extend(stack_[first:]); the items leave the stack.
  void append_items(std::size_t target, std::size_t first) {
    pickle_value& t = stack_[target];
    if (!t.is_list()) {
      fail(fmt::format("appending to a {}, not a list", kind_name(t.type())));
    }
    pickle_list& l = *std::get<pickle_value::list_ptr>(t.v_);
    if (l.sealed) fail("appending to a list that is already inside another container");
    reserve_more(l.items, stack_.size() - first);
    for (std::size_t i = first; i < stack_.size(); ++i) {
      pickle_value& x = stack_[i];
      if (x.same_object(t)) fail("a list cannot contain itself");
      l.depth = child_depth(l.depth, x);
      seal(x);
      l.items.push_back(std::move(x));
    }
    stack_.resize(first);
  }

  // stack_[target].update(pairs from stack_[first:]); the pairs leave the stack.
  void set_items(std::size_t target, std::size_t first) {
    pickle_value& t = stack_[target];
    if (!t.is_dict()) {
      fail(fmt::format("setting an item of a {}, not a dict", kind_name(t.type())));
    }
    const auto& dp = std::get<pickle_value::dict_ptr>(t.v_);
    pickle_dict& d = *dp;
    if (d.sealed) fail("setting an item of a dict that is already inside another container");
    reserve_more(d.items, (stack_.size() - first) / 2);
    for (std::size_t i = first; i < stack_.size(); i += 2) {
      pickle_value& k = stack_[i];
      pickle_value& x = stack_[i + 1];
      if (!k.hashable()) fail(fmt::format("unhashable dict key of type {}", kind_name(k.type())));
      if (x.same_object(t)) fail("a dict cannot contain itself");
      add_key(dp, k);
      d.depth = child_depth(child_depth(d.depth, k), x);
      seal(x);
      d.items.emplace_back(std::move(k), std::move(x));
    }
    stack_.resize(first);
  }

  // Numbers compare as Python compares them: True == 1 == 1.0.
  static bool number_as_int(const pickle_value& v, std::int64_t& out) noexcept {
    if (v.is_bool()) {
      out = v.as_bool() ? 1 : 0;
      return true;
    }
    if (v.is_int()) {
      out = v.as_int();
      return true;
    }
    if (v.is_float()) {
      const double d = v.as_float();
      if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 &&
          static_cast<double>(static_cast<std::int64_t>(d)) == d) {
        out = static_cast<std::int64_t>(d);
        return true;
      }
    }
    return false;
  }

  // A dict key's identity: keys Python finds equal (1 == True == 1.0, equal str, equal tuples)
  // get equal refs. Each str, bytes and tuple object is interned once and remembered, so a key
  // costs time linear in its own size however often the memo repeats it: compared or encoded as
  // a tree, a tuple holding another twice, 64 deep, has 2^64 leaves.
  struct key_ref {
    char tag = 'N';
    std::uint64_t value = 0;
    friend bool operator==(const key_ref& a, const key_ref& b) noexcept {
      return a.tag == b.tag && a.value == b.value;
    }
  };
  // The keys of one big dict: open addressing, so that a key costs no allocation of its own.
  class key_set {
   public:
    // False when `k` was there already.
    bool insert(const key_ref& k) {
      if (2 * (size_ + 1) > slots_.size()) grow();
      if (!place(slots_, k)) return false;
      ++size_;
      return true;
    }

   private:
    static bool place(std::vector<key_ref>& slots, const key_ref& k) {
      const std::size_t mask = slots.size() - 1;
      std::uint64_t h =
          k.value ^ (static_cast<std::uint64_t>(static_cast<unsigned char>(k.tag)) << 56);
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64's finaliser
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
      for (std::size_t i = static_cast<std::size_t>(h ^ (h >> 31)) & mask;; i = (i + 1) & mask) {
        if (slots[i].tag == empty) {
          slots[i] = k;
          return true;
        }
        if (slots[i] == k) return false;
      }
    }
    void grow() {
      std::vector<key_ref> bigger(std::max<std::size_t>(64, 2 * slots_.size()), key_ref{empty, 0});
      for (const key_ref& k : slots_) {
        if (k.tag != empty) place(bigger, k);
      }
      slots_.swap(bigger);
    }
    static constexpr char empty = '\0';  // no key_ref has this tag
    std::vector<key_ref> slots_;
    std::size_t size_ = 0;
  };

  // Short str keys (the common case, often one memoised object) compare directly.
  bool key_equal(const pickle_value& a, const pickle_value& b) {
    static constexpr std::size_t short_str = 64;
    if (a.is_str() && b.is_str()) {
      const auto& p = std::get<pickle_value::str_ptr>(a.v_);
      const auto& q = std::get<pickle_value::str_ptr>(b.v_);
      if (p == q) return true;
      if (p->size() != q->size()) return false;
      if (p->size() <= short_str) return *p == *q;
    }
    return key_of(a) == key_of(b);
  }

  key_ref key_of(const pickle_value& k) {
    std::int64_t i = 0;
    if (number_as_int(k, i)) return {'I', static_cast<std::uint64_t>(i)};
    switch (k.type()) {
      case pickle_value::kind::floating: {
        std::uint64_t bits;
        const double d = k.as_float();
        std::memcpy(&bits, &d, 8);
        return {'F', bits};
      }
      case pickle_value::kind::string: {
        const auto& p = std::get<pickle_value::str_ptr>(k.v_);
        return {'S', intern_text(p, *p, str_ids_)};
      }
      case pickle_value::kind::bytes: {
        const auto& p = std::get<pickle_value::bytes_ptr>(k.v_);
        return {'B', intern_text(p, p->data, bytes_ids_)};
      }
      case pickle_value::kind::tuple:
        return {'T', intern_tuple(std::get<pickle_value::tuple_ptr>(k.v_))};
      default:
        return {'N', 0};  // None; unhashable kinds are refused before
    }
  }

  // The id of a str or bytes object's contents, hashed once per object.
  std::uint64_t intern_text(const std::shared_ptr<const void>& object, std::string_view text,
                            std::unordered_map<std::string_view, std::uint64_t>& ids) {
    const auto known = object_ids_.find(object.get());
    if (known != object_ids_.end()) return known->second;
    id_owners_.push_back(object);  // keeps `text` alive and the address from being reused
    const std::uint64_t id = ids.emplace(text, ids.size()).first->second;
    object_ids_.emplace(object.get(), id);
    return id;
  }

  // The id of a tuple's contents: the refs of its items, each interned already.
  std::uint64_t intern_tuple(const std::shared_ptr<const pickle_tuple>& t) {
    const auto known = object_ids_.find(t.get());
    if (known != object_ids_.end()) return known->second;
    std::string items;
    items.reserve(9 * t->items.size());
    for (const pickle_value& x : t->items) {
      const key_ref r = key_of(x);  // recursion is bounded by max_depth_
      char b[9];
      b[0] = r.tag;
      std::memcpy(b + 1, &r.value, 8);
      items.append(b, 9);
    }
    id_owners_.push_back(t);
    const std::uint64_t id = tuple_ids_.emplace(std::move(items), tuple_ids_.size()).first->second;
    object_ids_.emplace(t.get(), id);
    return id;
  }

  // Refuses a key the dict already has. Small dicts are scanned; big ones get a hash index.
  void add_key(const std::shared_ptr<pickle_dict>& dp, const pickle_value& k) {
    static constexpr std::size_t scan_limit = 16;
    pickle_dict& d = *dp;
    if (d.items.size() < scan_limit) {
      for (const auto& item : d.items) {
        if (key_equal(item.first, k)) fail("duplicate dict key");
      }
      return;
    }
    auto it = key_index_.find(dp.get());
    if (it == key_index_.end()) {
      key_index_owners_.push_back(dp);  // keeps the address from being reused while indexed
      it = key_index_.emplace(dp.get(), key_set{}).first;
      for (const auto& item : d.items) it->second.insert(key_of(item.first));
    }
    if (!it->second.insert(key_of(k))) fail("duplicate dict key");
  }

  std::string_view data_;
  std::uint32_t max_depth_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  unsigned char op_ = 0;
  std::vector<pickle_value> stack_;
  std::vector<std::size_t> marks_;
  std::vector<pickle_value> memo_;                               // indices 0 .. size-1
  std::unordered_map<std::uint64_t, pickle_value> sparse_memo_;  // indices above that
  std::unordered_map<const pickle_dict*, key_set> key_index_;
  std::vector<std::shared_ptr<pickle_dict>> key_index_owners_;
  std::unordered_map<const void*, std::uint64_t> object_ids_;  // interned str, bytes, tuples
  std::vector<std::shared_ptr<const void>> id_owners_;
  std::unordered_map<std::string_view, std::uint64_t> str_ids_;
  std::unordered_map<std::string_view, std::uint64_t> bytes_ids_;
  std::unordered_map<std::string, std::uint64_t> tuple_ids_;
};

/// The value pickled in `data` (the whole of it: bytes after STOP are an error). Throws
/// trace_error, with the byte offset of the failing opcode, for anything outside the supported
/// subset or malformed; std::bad_alloc only when memory runs out (use is linear in data.size()).
inline pickle_value unpickle(std::string_view data,
                             std::uint32_t max_depth = unpickler::default_max_depth) {
  return unpickler(data, max_depth).load();
}

/// Writes values as Python's pickle.dump would read them back.
class pickler {
 public:
  /// Throws std::invalid_argument for a protocol outside 2..5.
  explicit pickler(int protocol = 4) : protocol_(protocol) {
    if (protocol < 2 || protocol > 5) {
      throw std::invalid_argument(
          fmt::format("pickler: protocol {} not supported (2-5)", protocol));
    }
  }

  /// The pickle of `v` (PROTO to STOP). `v` must be acyclic. Throws std::invalid_argument for a
  /// str that is not UTF-8, bytes under protocol 2, or a dict key that is not hashable.
  std::string dumps(const pickle_value& v) {
    out_.clear();
    memo_.clear();
    op(pickle_op::proto);
    out_ += static_cast<char>(protocol_);
    write(v);
    op(pickle_op::stop);
    std::string result;
    result.swap(out_);
    memo_.clear();
    return result;
  }

 private:
  static constexpr std::size_t batch = 1000;  // as Python's pickler batches APPENDS / SETITEMS

  void op(unsigned char c) { out_ += static_cast<char>(c); }
  void le(std::uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xff);
  }

  void write_int(std::int64_t i) {
    namespace o = pickle_op;
    if (i >= 0 && i <= 0xff) {
      op(o::binint1);
      le(static_cast<std::uint64_t>(i), 1);
    } else if (i >= 0 && i <= 0xffff) {
      op(o::binint2);
      le(static_cast<std::uint64_t>(i), 2);
    } else if (i >= std::numeric_limits<std::int32_t>::min() &&
               i <= std::numeric_limits<std::int32_t>::max()) {
      op(o::binint);
      le(static_cast<std::uint32_t>(static_cast<std::int32_t>(i)), 4);
    } else {
      // Shortest little-endian two's complement.
      const auto u = static_cast<std::uint64_t>(i);
      int n = 8;
      while (n > 1) {
        const unsigned top = static_cast<unsigned>((u >> (8 * (n - 1))) & 0xff);
        const unsigned next_sign = static_cast<unsigned>((u >> (8 * (n - 2) + 7)) & 1);
        if ((top == 0x00 && next_sign == 0) || (top == 0xff && next_sign == 1)) {
          --n;
        } else {
          break;
        }
      }
      op(o::long1);
      le(static_cast<std::uint64_t>(n), 1);
      le(u, n);
    }
  }

  void write_str(const std::string& s) {
    namespace o = pickle_op;
    const auto it = memo_.find(s);
    if (it != memo_.end()) {
      if (it->second < 256) {
        op(o::binget);
        le(it->second, 1);
      } else {
        op(o::long_binget);
        le(it->second, 4);
      }
      return;
    }
    if (!pickle_utf8_valid(s)) {
      throw std::invalid_argument("pickler: a str is not valid UTF-8 (use bytes)");
    }
    const std::uint64_t n = s.size();
    if (protocol_ >= 4 && n < 256) {
      op(o::short_binunicode);
      le(n, 1);
    } else if (n <= 0xffffffffULL) {
      op(o::binunicode);
      le(n, 4);
    } else if (protocol_ >= 4) {
      op(o::binunicode8);
      le(n, 8);
    } else {
      throw std::invalid_argument("pickler: str over 4 GiB needs protocol 4");
    }
    out_ += s;
    // Memoise (the memo has at most 2^32 entries under LONG_BINGET).
    const auto idx = static_cast<std::uint64_t>(memo_.size());
    if (idx > 0xffffffffULL) return;
    if (protocol_ >= 4) {
      op(o::memoize);
    } else if (idx < 256) {
      op(o::binput);
      le(idx, 1);
    } else {
      op(o::long_binput);
      le(idx, 4);
    }
    memo_.emplace(s, idx);
  }

  void write_bytes(const std::string& b) {
    namespace o = pickle_op;
    if (protocol_ < 3) throw std::invalid_argument("pickler: bytes need protocol 3 or later");
    const std::uint64_t n = b.size();
    if (n < 256) {
      op(o::short_binbytes);
      le(n, 1);
    } else if (n <= 0xffffffffULL) {
      op(o::binbytes);
      le(n, 4);
    } else if (protocol_ >= 4) {
      op(o::binbytes8);
      le(n, 8);
    } else {
      throw std::invalid_argument("pickler: bytes over 4 GiB need protocol 4");
    }
    out_ += b;
  }

  void write(const pickle_value& v) {
    namespace o = pickle_op;
    using k = pickle_value::kind;
    switch (v.type()) {
      case k::none:
        op(o::none);
        break;
      case k::boolean:
        op(v.as_bool() ? o::newtrue : o::newfalse);
        break;
      case k::integer:
        write_int(v.as_int());
        break;
      case k::floating: {
        const double d = v.as_float();
        std::uint64_t bits;
        std::memcpy(&bits, &d, 8);
        op(o::binfloat);
        for (int s = 56; s >= 0; s -= 8) out_ += static_cast<char>((bits >> s) & 0xff);
        break;
      }
      case k::string:
        write_str(v.as_str());
        break;
      case k::bytes:
        write_bytes(v.as_bytes());
        break;
      case k::tuple: {
        const auto& items = v.as_tuple();
        if (items.empty()) {
          op(o::empty_tuple);
          break;
        }
        if (items.size() > 3) op(o::mark);
        for (const pickle_value& x : items) write(x);
        switch (items.size()) {
          case 1:
            op(o::tuple1);
            break;
          case 2:
            op(o::tuple2);
            break;
          case 3:
            op(o::tuple3);
            break;
          default:
            op(o::tuple);
            break;
        }
        break;
      }
      case k::list: {
        op(o::empty_list);
        const auto& items = v.as_list();
        if (items.size() == 1) {
          write(items[0]);
          op(o::append);
          break;
        }
        for (std::size_t i = 0; i < items.size(); i += batch) {
          const std::size_t end = std::min(items.size(), i + batch);
          op(o::mark);
          for (std::size_t j = i; j < end; ++j) write(items[j]);
          op(o::appends);
        }
        break;
      }
      case k::dict: {
        op(o::empty_dict);
        const auto& items = v.as_dict();
        for (const auto& item : items) {
          if (!item.first.hashable()) {
            throw std::invalid_argument("pickler: a dict key is not hashable");
          }
        }
        if (items.size() == 1) {
          write(items[0].first);
          write(items[0].second);
          op(o::setitem);
          break;
        }
        for (std::size_t i = 0; i < items.size(); i += batch) {
          const std::size_t end = std::min(items.size(), i + batch);
          op(o::mark);
          for (std::size_t j = i; j < end; ++j) {
            write(items[j].first);
            write(items[j].second);
          }
          op(o::setitems);
        }
        break;
      }
    }
  }

  int protocol_;
  std::string out_;
  std::unordered_map<std::string, std::uint64_t> memo_;  // str -> memo index
};

/// The pickle of `v` under `protocol` (2-5); see pickler::dumps for what it throws.
inline std::string pickle_dumps(const pickle_value& v, int protocol = 4) {
  return pickler(protocol).dumps(v);
}

/// Writes the pickle of `v` to `out`; stream failures show in out's state, as for any write.
inline void pickle_dump(std::ostream& out, const pickle_value& v, int protocol = 4) {
  const std::string bytes = pickle_dumps(v, protocol);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace gpumem::detail
