// The strict unpickler and the pickler behind the PyTorch snapshot reader: pickles written by
// Python read back exactly, round trips through every opcode, and hostile bytes (truncation,
// corruption, deep nesting, memo abuse) end in trace_error, never in a crash or a hang.
#include "gpumem/trace/detail/pickle.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/error.hpp"
#include "support/timing.hpp"

namespace {

using gpumem::trace_error;
using gpumem::detail::pickle_dumps;
using gpumem::detail::pickle_value;
using gpumem::detail::unpickle;
using dict = pickle_value::dict_items;
using seq = pickle_value::sequence;

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  }
  return out;
}

// pickle.dumps(v, protocol=p) from CPython 3 for the value built by python_value(p >= 3).
const char* const python_pickles[] = {
    // protocol 2 (no bytes)
    "80027d71002858010000006171015d7102284b014afeffffff4bff4d00014dffff4a000001004a000000808a050000"
    "00"
    "80008a060000000000018a0800000000000000808a08ffffffffffffff7f473ff80000000000004e88896558010000"
    "00"
    "7471034b0158010000007871044740000000000000008571058771065801000000737107580f00000068c3a96c6c6f"
    "20"
    "e2988320f09f9880710858010000006571092958010000006c710a5d710b580100000064710c7d710d58010000006b"
    "71"
    "0e7d710f284b01680186711058090000007475706c65206b657971114b075807000000696e74206b6579711275752"
    "e",
    // protocol 3
    "80037d71002858010000006171015d7102284b014afeffffff4bff4d00014dffff4a000001004a000000808a050000"
    "00"
    "80008a060000000000018a0800000000000000808a08ffffffffffffff7f473ff80000000000004e88896558010000"
    "00"
    "7471034b0158010000007871044740000000000000008571058771065801000000737107580f00000068c3a96c6c6f"
    "20"
    "e2988320f09f9880710858010000006571092958010000006c710a5d710b580100000064710c7d710d58010000006b"
    "71"
    "0e7d710f284b01680186711058090000007475706c65206b657971114b075807000000696e74206b65797112755801"
    "00"
    "0000627113430200ff7114752e",
    // protocol 4
    "800495c2000000000000007d94288c0161945d94284b014afeffffff4bff4d00014dffff4a000001004a000000808a"
    "05"
    "00000080008a060000000000018a0800000000000000808a08ffffffffffffff7f473ff80000000000004e8889658c"
    "01"
    "74944b018c017894474000000000000000859487948c0173948c0f68c3a96c6c6f20e2988320f09f9880948c016594"
    "29"
    "8c016c945d948c0164947d948c016b947d94284b01680186948c097475706c65206b6579944b078c07696e74206b65"
    "79"
    "94758c016294430200ff94752e",
    // protocol 5
    "800595c2000000000000007d94288c0161945d94284b014afeffffff4bff4d00014dffff4a000001004a000000808a"
    "05"
    "00000080008a060000000000018a0800000000000000808a08ffffffffffffff7f473ff80000000000004e8889658c"
    "01"
    "74944b018c017894474000000000000000859487948c0173948c0f68c3a96c6c6f20e2988320f09f9880948c016594"
    "29"
    "8c016c945d948c0164947d948c016b947d94284b01680186948c097475706c65206b6579944b078c07696e74206b65"
    "79"
    "94758c016294430200ff94752e",
};

const std::string snowman_text = "h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80";

pickle_value python_value(bool with_bytes) {
  const std::int64_t min64 = std::numeric_limits<std::int64_t>::min();
  const std::int64_t max64 = std::numeric_limits<std::int64_t>::max();
  dict d{
      {"a", pickle_value::make_list(seq{1, -2, 255, 256, 65535, 65536, -2147483648LL, 2147483648LL,
                                        std::int64_t{1} << 40, min64, max64, 1.5, nullptr, true,
                                        false})},
      {"t", pickle_value::make_tuple(seq{1, "x", pickle_value::make_tuple(seq{2.0})})},
      {"s", snowman_text},
      {"e", pickle_value::make_tuple()},
      {"l", pickle_value::make_list()},
      {"d", pickle_value::make_dict()},
      {"k", pickle_value::make_dict(
                dict{{pickle_value::make_tuple(seq{1, "a"}), "tuple key"}, {7, "int key"}})},
  };
  if (with_bytes) d.emplace_back("b", pickle_value::make_bytes(std::string("\x00\xff", 2)));
  return pickle_value::make_dict(std::move(d));
}

// Expects trace_error whose message names `fragment`; returns its offset.
std::size_t expect_error(const std::string& bytes, const std::string& fragment) {
  try {
    unpickle(bytes);
  } catch (const trace_error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << fragment;
    return e.offset();
  }
  ADD_FAILURE() << "no trace_error; expected one containing " << fragment;
  return 0;
}

std::string b(std::initializer_list<int> bytes) {
  std::string s;
  for (int x : bytes) s += static_cast<char>(x);
  return s;
}

const std::string p4 = b({0x80, 0x04});  // PROTO 4

TEST(Unpickle, ReadsWhatPythonWrites) {
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE("protocol " + std::to_string(i + 2));
    const pickle_value v = unpickle(from_hex(python_pickles[i]));
    EXPECT_EQ(v, python_value(i >= 1));
    ASSERT_TRUE(v.is_dict());
    ASSERT_NE(v.find("s"), nullptr);
    EXPECT_EQ(v.find("s")->as_str(), snowman_text);
    EXPECT_EQ(v.find("missing"), nullptr);
    EXPECT_EQ(v.offset(), i >= 2 ? 11u : 2u);  // the EMPTY_DICT opcode, after PROTO (and FRAME)
    EXPECT_EQ(v.depth(), 3u);
  }
}

TEST(Unpickle, EveryOpcodePath) {
  // BINUNICODE8, BINBYTES, BINBYTES8, LONG4, LONG1 of 0 and of 9 redundant bytes, TUPLE, NONE,
  // SETITEM, APPEND, BINPUT / LONG_BINPUT / LONG_BINGET (sparse memo), FRAME.
  std::string s = p4 + b({0x95, 0, 0, 0, 0, 0, 0, 0, 0});    // FRAME 0
  s += b({0x5d});                                            // EMPTY_LIST
  s += b({0x8d, 2, 0, 0, 0, 0, 0, 0, 0}) + "hi";             // BINUNICODE8 'hi'
  s += b({0x72, 0xe8, 0x03, 0, 0});                          // LONG_BINPUT 1000
  s += b({0x61});                                            // APPEND
  s += b({0x42, 3, 0, 0, 0}) + "abc" + b({0x61});            // BINBYTES
  s += b({0x8e, 1, 0, 0, 0, 0, 0, 0, 0}) + "z" + b({0x61});  // BINBYTES8
  s += b({0x8b, 2, 0, 0, 0, 0x00, 0x80, 0x61});              // LONG4 -32768
  s += b({0x8a, 0, 0x61});                                   // LONG1 0
  s += b({0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x61});  // LONG1 -1
  s += b({0x28, 0x4e, 0x88, 0x4b, 5, 0x29, 0x74, 0x61});  // MARK None True 5 () TUPLE
  s += b({0x7d, 0x71, 7, 0x6a, 0xe8, 0x03, 0, 0, 0x4b, 1, 0x73, 0x61});  // {} 'hi': 1 via memo
  s += b({0x68, 7, 0x61});                                      // BINGET 7: the same dict again
  s += b({0x4d, 0x34, 0x12, 0x85, 0x61});                       // (0x1234,)
  s += b({0x4a, 0xff, 0xff, 0xff, 0xff, 0x4b, 2, 0x86, 0x61});  // (-1, 2)
  s += b({0x4e, 0x4e, 0x4e, 0x87, 0x61});                       // (None, None, None)
  s += b({0x2e});

  const pickle_value v = unpickle(s);
  const pickle_value inner = pickle_value::make_dict(dict{{"hi", 1}});
  const pickle_value expected = pickle_value::make_list(seq{
      "hi",
      pickle_value::make_bytes("abc"),
      pickle_value::make_bytes("z"),
      -32768,
      0,
      -1,
      pickle_value::make_tuple(seq{nullptr, true, 5, pickle_value::make_tuple()}),
      inner,
      inner,
      pickle_value::make_tuple(seq{0x1234}),
      pickle_value::make_tuple(seq{-1, 2}),
      pickle_value::make_tuple(seq{nullptr, nullptr, nullptr}),
  });
  EXPECT_EQ(v, expected);
  // The memo shares: both dict entries are one object.
  EXPECT_TRUE(v.as_list()[7].same_object(v.as_list()[8]));
}

TEST(Unpickle, LongsFitSixtyFourBits) {
  EXPECT_EQ(unpickle(p4 + b({0x8a, 1, 0x80, 0x2e})).as_int(), -128);
  EXPECT_EQ(unpickle(p4 + b({0x8a, 2, 0x80, 0x00, 0x2e})).as_int(), 128);
  // 2^63 needs 9 bytes: out of range.
  expect_error(p4 + b({0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x00, 0x2e}), "does not fit in 64 bits");
  expect_error(p4 + b({0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x2e}), "does not fit in 64 bits");
  expect_error(p4 + b({0x8b, 0xff, 0xff, 0xff, 0xff, 0x2e}), "negative length");
  expect_error(p4 + b({0x8b, 0xff, 0xff, 0xff, 0x7f, 0x2e}), "truncated");
}

TEST(Unpickle, HugeLengthsAreTruncationNotAllocation) {
  for (int op : {0x8d, 0x8e}) {  // BINUNICODE8, BINBYTES8 with 2^63 and 2^64-1 bytes
    expect_error(p4 + b({op, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x2e}), "truncated");
    expect_error(p4 + b({op, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x2e}), "truncated");
  }
  expect_error(p4 + b({0x58, 0xff, 0xff, 0xff, 0xff}) + "abc", "truncated");
  expect_error(p4 + b({0x95, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x4e, 0x2e}),
               "truncated");
}

TEST(Unpickle, ErrorsNameOpcodeAndOffset) {
  // GLOBAL ('c') is refused: a pickle never gets to name code.
  const std::size_t at = expect_error(p4 + "cos\nsystem\n", "opcode 0x63");
  EXPECT_EQ(at, 2u);
  expect_error(p4 + "cos\nsystem\n", "at byte 2");
  expect_error(p4 + b({0x52}), "0x52 (unsupported)");  // REDUCE
  expect_error("", "before STOP");
  expect_error(p4 + b({0x4e}), "before STOP");
  EXPECT_EQ(expect_error(p4 + b({0x4e, 0x2e, 0x4e}), "after STOP"), 4u);
  expect_error(p4 + b({0x4e, 0x4e, 0x2e}), "2 values on the stack");
  expect_error(p4 + b({0x2e}), "0 values on the stack");
  expect_error(p4 + b({0x28, 0x4e, 0x2e}), "unclosed MARK");
  expect_error(b({0x80, 0x01, 0x4e, 0x2e}), "unsupported protocol 1");
  expect_error(b({0x80, 0x06, 0x4e, 0x2e}), "unsupported protocol 6");
  expect_error(b({0x80}), "truncated");
}

TEST(Unpickle, StackUnderflow) {
  expect_error(p4 + b({0x4e, 0x61, 0x2e}), "stack underflow");              // APPEND
  expect_error(p4 + b({0x7d, 0x4e, 0x73, 0x2e}), "stack underflow");        // SETITEM
  expect_error(p4 + b({0x85, 0x2e}), "stack underflow");                    // TUPLE1
  expect_error(p4 + b({0x4e, 0x87, 0x2e}), "stack underflow");              // TUPLE3
  expect_error(p4 + b({0x94, 0x2e}), "stack underflow");                    // MEMOIZE
  expect_error(p4 + b({0x71, 0x00, 0x2e}), "stack underflow");              // BINPUT
  expect_error(p4 + b({0x5d, 0x4e, 0x65, 0x2e}), "no MARK");                // APPENDS
  expect_error(p4 + b({0x4e, 0x74, 0x2e}), "no MARK");                      // TUPLE
  expect_error(p4 + b({0x28, 0x4e, 0x65, 0x2e}), "stack underflow");        // APPENDS, no list
  expect_error(p4 + b({0x5d, 0x28, 0x4e, 0x61, 0x2e}), "stack underflow");  // below the MARK
  expect_error(p4 + b({0x7d, 0x28, 0x4e, 0x75, 0x2e}), "odd number");       // SETITEMS
}

TEST(Unpickle, MemoErrors) {
  expect_error(p4 + b({0x68, 0x00, 0x2e}), "memo index 0 was never stored");
  expect_error(p4 + b({0x6a, 0xff, 0xff, 0xff, 0xff, 0x2e}), "memo index 4294967295");
  expect_error(p4 + b({0x4e, 0x94, 0x68, 0x01, 0x2e}), "memo index 1");
  // Python's memo semantics: MEMOIZE stores at len(memo), even past a sparse BINPUT index.
  const pickle_value v = unpickle(
      p4 + b({0x28, 0x4b, 9, 0x71, 2, 0x4b, 1, 0x94, 0x4b, 2, 0x94, 0x68, 2, 0x68, 1, 0x74, 0x2e}));
  EXPECT_EQ(v, pickle_value::make_tuple(seq{9, 1, 2, 2, 1}));
  expect_error(p4 + b({0x4b, 9, 0x71, 2, 0x68, 0, 0x2e}), "memo index 0");
}

TEST(Unpickle, ContainerRules) {
  expect_error(p4 + b({0x7d, 0x61, 0x2e}), "stack underflow");
  expect_error(p4 + b({0x7d, 0x4e, 0x61, 0x2e}), "appending to a dict");
  expect_error(p4 + b({0x5d, 0x4e, 0x4e, 0x73, 0x2e}), "setting an item of a list");
  expect_error(p4 + b({0x7d, 0x5d, 0x4e, 0x73, 0x2e}), "unhashable dict key of type list");
  expect_error(p4 + b({0x7d, 0x5d, 0x85, 0x4e, 0x73, 0x2e}), "unhashable dict key of type tuple");
  // Self-reference: l.append(l), d['x'] = d.
  expect_error(p4 + b({0x5d, 0x94, 0x68, 0x00, 0x61, 0x2e}), "cannot contain itself");
  expect_error(p4 + b({0x7d, 0x94, 0x4e, 0x68, 0x00, 0x73, 0x2e}), "cannot contain itself");
  // l0 = [l1]; then l1.append(1) through the memo: refused, so values stay acyclic.
  expect_error(p4 + b({0x5d, 0x94, 0x5d, 0x94, 0x61, 0x68, 0x01, 0x4b, 0x01, 0x61, 0x2e}),
               "already inside another container");
  // Duplicate keys, as Python compares them (1 == True == 1.0), in small and indexed dicts.
  expect_error(p4 + b({0x7d, 0x28, 0x8c, 1, 'a', 0x4e, 0x8c, 1, 'a', 0x4e, 0x75, 0x2e}),
               "duplicate dict key");
  expect_error(p4 + b({0x7d, 0x28, 0x4b, 1, 0x4e, 0x88, 0x4e, 0x75, 0x2e}), "duplicate dict key");
  expect_error(
      p4 + b({0x7d, 0x28, 0x4b, 1, 0x4e, 0x47, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x4e, 0x75, 0x2e}),
      "duplicate dict key");
  std::string big = p4 + b({0x7d, 0x28});
  for (int i = 0; i < 40; ++i) big += b({0x4b, i, 0x4e});
  std::string ok = big + b({0x75, 0x2e});
  EXPECT_EQ(unpickle(ok).as_dict().size(), 40u);
  expect_error(big + b({0x4b, 17, 0x4e, 0x75, 0x2e}), "duplicate dict key");
  expect_error(big + b({0x75, 0x28, 0x88, 0x4e, 0x75, 0x2e}), "duplicate dict key");  // True == 1
  // A tuple key equal to one already there, in an indexed dict.
  std::string tuples = p4 + b({0x7d, 0x28});
  for (int i = 0; i < 20; ++i) tuples += b({0x4b, i, 0x8c, 1, 'k', 0x86, 0x4e});
  expect_error(tuples + b({0x4b, 3, 0x8c, 1, 'k', 0x86, 0x4e, 0x75, 0x2e}), "duplicate dict key");
}

// A tuple holding the same tuple twice (through the memo), `levels` deep: 2^levels leaves when
// walked as a tree, a few bytes per level as a pickle. `leaf` tells chains apart.
std::string shared_tuple_chain(int levels, int leaf, std::uint32_t& memo_size) {
  std::string s = b({0x4b, leaf});  // BININT1
  for (int i = 0; i < levels; ++i) {
    s += b({0x94});  // MEMOIZE: memo[memo_size] = x
    s += b({0x6a});  // LONG_BINGET memo_size: x again
    for (int k = 0; k < 4; ++k) s += static_cast<char>((memo_size >> (8 * k)) & 0xff);
    s += b({0x86});  // TUPLE2: (x, x)
    ++memo_size;
  }
  return s;
}

TEST(Unpickle, KeysSharedThroughTheMemoCostTheirBytes) {
  // Two chains built apart but equal: comparing them as trees visits 2^64 leaves.
  std::uint32_t memo = 0;
  std::string twice = p4 + b({0x7d, 0x28});  // EMPTY_DICT MARK
  for (int k = 0; k < 2; ++k) twice += shared_tuple_chain(64, 7, memo) + b({0x4e});
  twice += b({0x75, 0x2e});  // SETITEMS STOP
  EXPECT_LT(twice.size(), 1000u);
  expect_error(twice, "duplicate dict key");

  // Twenty distinct chains: past 16 keys the dict is indexed, and a key is encoded as a whole.
  memo = 0;
  std::string many = p4 + b({0x7d, 0x28});
  for (int k = 0; k < 20; ++k) many += shared_tuple_chain(64, k, memo) + b({0x4e});
  const pickle_value v = unpickle(many + b({0x75, 0x2e}));
  ASSERT_EQ(v.as_dict().size(), 20u);
  EXPECT_EQ(v.as_dict()[19].first.depth(), 64u);
  // One more equal to the 4th is a duplicate, found by the index.
  expect_error(many + shared_tuple_chain(64, 3, memo) + b({0x4e, 0x75, 0x2e}),
               "duplicate dict key");
  // Python's equality still holds inside tuples ((1,) == (True,)) and for long strings, in small
  // and in indexed dicts; keys that differ in their last byte stay apart.
  const std::string small = p4 + b({0x7d, 0x28});
  const std::string end = b({0x4e, 0x75, 0x2e});
  const std::string one = b({0x4b, 1, 0x85, 0x4e});
  const std::string yes = b({0x88, 0x85});
  const std::string long_x = b({0x8c, 100}) + std::string(100, 'x');
  const std::string long_y = b({0x8c, 100}) + std::string(99, 'x') + "y";
  for (const std::string& head : {small, many}) {
    expect_error(head + one + yes + end, "duplicate dict key");
    expect_error(head + long_x + b({0x4e}) + long_x + end, "duplicate dict key");
    EXPECT_NO_THROW(unpickle(head + long_x + b({0x4e}) + long_y + end));
  }
}

TEST(Unpickle, Utf8) {
  const auto str = [](const std::string& bytes) {
    return p4 + b({0x8c, static_cast<int>(bytes.size())}) + bytes + b({0x2e});
  };
  EXPECT_EQ(unpickle(str("\xed\xa0\x80")).as_str(), "\xed\xa0\x80");  // lone surrogate: accepted
  EXPECT_EQ(unpickle(str("\xf4\x8f\xbf\xbf")).as_str(), "\xf4\x8f\xbf\xbf");
  for (const char* bad : {"\xff", "\xc0\x80", "\xe0\x80\x80", "\xf4\x90\x80\x80", "\xc3", "a\x80",
                          "abcdefgh\xe2\x98"}) {
    SCOPED_TRACE(bad);
    expect_error(str(bad), "not valid UTF-8");
  }
}

TEST(Unpickle, NestingIsBounded) {
  // 100000 nested lists built on the stack.
  std::string deep = p4;
  const int n = 100000;
  for (int i = 0; i < n; ++i) deep += b({0x5d});
  for (int i = 1; i < n; ++i) deep += b({0x61});
  deep += b({0x2e});
  expect_error(deep, "nested deeper than 256");
  // Tuples too.
  std::string tuples = p4 + b({0x4e});
  for (int i = 0; i < n; ++i) tuples += b({0x85});
  tuples += b({0x2e});
  expect_error(tuples, "nested deeper than 256");
  // Exactly at the limit is fine; one more is not.
  const auto nest = [](int levels) {
    std::string s = p4;
    for (int i = 0; i < levels; ++i) s += b({0x5d});
    for (int i = 1; i < levels; ++i) s += b({0x61});
    return s + b({0x2e});
  };
  EXPECT_EQ(unpickle(nest(256)).depth(), 256u);
  expect_error(nest(257), "nested deeper than 256");
  EXPECT_EQ(unpickle(nest(10), 10).depth(), 10u);
  EXPECT_THROW(unpickle(nest(11), 10), trace_error);
  // A million MARKs: memory stays linear, the error is clean.
  expect_error(p4 + std::string(1000000, '\x28') + b({0x4e, 0x2e}), "unclosed MARK");
}

using gpumem_test::best_seconds;

TEST(Unpickle, LongListsReadInLinearTime) {
  // Reading 4x the items may take about 4x the time, not 16x: reserving the exact size at each
  // APPENDS batch (Python writes 1000 items a batch) or APPEND copied the whole list. Both sizes
  // are past the caches, so that memory costs the same per item; the bound is 6x, as the page
  // faults of the larger list made it up to 5.2x on a loaded machine.
  const std::size_t n = 2000000;
  const auto batched = [](std::size_t items) {
    return pickle_dumps(pickle_value::make_list(seq(items)));
  };
  const auto one_by_one = [](std::size_t items) {
    std::string s = p4 + b({0x5d});
    for (std::size_t i = 0; i < items; ++i) s += b({0x4e, 0x61});  // None APPEND
    return s + b({0x2e});
  };
  const std::pair<const char*, std::function<std::string(std::size_t)>> cases[] = {
      {"APPENDS", batched}, {"APPEND", one_by_one}};
  for (const auto& [name, make] : cases) {
    const std::string small = make(n);
    const std::string large = make(4 * n);
    std::size_t small_items = 0;
    std::size_t large_items = 0;
    const auto [t1, t4] = best_seconds(
        5, [&] { small_items = unpickle(small).as_list().size(); },
        [&] { large_items = unpickle(large).as_list().size(); });
    EXPECT_EQ(small_items, n);
    EXPECT_EQ(large_items, 4 * n);
    std::cout << name << ": " << n << " items " << t1 * 1e3 << " ms, " << 4 * n << " items "
              << t4 * 1e3 << " ms\n";
    ASSERT_LT(t4, 6 * t1) << name << ": the time grows faster than the number of items";
  }
}

TEST(Unpickle, EveryTruncationThrows) {
  for (const char* hex : python_pickles) {
    const std::string whole = from_hex(hex);
    for (std::size_t n = 0; n < whole.size(); ++n) {
      EXPECT_THROW(unpickle(whole.substr(0, n)), trace_error) << "prefix of " << n << " bytes";
    }
  }
}

TEST(Unpickle, CorruptedBytesParseOrThrowTraceError) {
  std::mt19937_64 rng(20240531);
  int parsed = 0;
  int refused = 0;
  for (const char* hex : python_pickles) {
    const std::string whole = from_hex(hex);
    for (int round = 0; round < 5000; ++round) {
      std::string s = whole;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        s[rng() % s.size()] = static_cast<char>(rng() & 0xff);
      }
      if (rng() % 8 == 0) s.resize(rng() % s.size());
      try {
        (void)unpickle(s);
        ++parsed;
      } catch (const trace_error&) {
        ++refused;
      }
    }
  }
  EXPECT_EQ(parsed + refused, 20000);
  EXPECT_GT(refused, 0);
  EXPECT_GT(parsed, 0);
}

pickle_value round_trip(const pickle_value& v, int protocol) {
  return unpickle(pickle_dumps(v, protocol));
}

TEST(Pickler, RoundTrips) {
  seq ints;
  for (std::int64_t x :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{256}, std::int64_t{65535},
        std::int64_t{65536}, std::int64_t{-1}, std::int64_t{-128}, std::int64_t{-129},
        std::int64_t{2147483647}, std::int64_t{2147483648}, std::int64_t{-2147483648LL},
        std::int64_t{-2147483649LL}, std::int64_t{1} << 40, -(std::int64_t{1} << 40),
        std::int64_t{0x7fffffffffff}, std::int64_t{0x800000000000},
        std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()}) {
    ints.emplace_back(x);
  }
  seq floats{0.0,
             -0.0,
             1.5,
             -2.25e-300,
             1e308,
             std::numeric_limits<double>::infinity(),
             -std::numeric_limits<double>::infinity(),
             std::nan("")};
  seq strs{
      "",           std::string(255, 'a'),         std::string(256, 'b'), std::string(70000, 'c'),
      snowman_text, std::string("nul\0inside", 10)};
  seq many;  // > 256 distinct strings (LONG_BINGET / LONG_BINPUT) and > 1000 items (batches)
  for (int i = 0; i < 2500; ++i) many.emplace_back("s" + std::to_string(i % 700));
  dict big;
  for (int i = 0; i < 2100; ++i) big.emplace_back(i, pickle_value::make_list(seq{i, "v"}));
  seq tuples;
  for (int n = 0; n <= 5; ++n) tuples.push_back(pickle_value::make_tuple(seq(n, pickle_value(n))));

  const pickle_value value = pickle_value::make_dict(dict{
      {"ints", pickle_value::make_list(ints)},
      {"floats", pickle_value::make_list(floats)},
      {"strs", pickle_value::make_list(strs)},
      {"many", pickle_value::make_list(many)},
      {"big", pickle_value::make_dict(big)},
      {"tuples", pickle_value::make_list(tuples)},
      {"one", pickle_value::make_list(seq{pickle_value::make_dict(dict{{"k", nullptr}})})},
      {pickle_value::make_tuple(seq{1, "t", pickle_value::make_tuple(seq{2.5})}), true},
      {false, nullptr},
      {-7, 3.0},
  });
  for (int protocol = 2; protocol <= 5; ++protocol) {
    SCOPED_TRACE("protocol " + std::to_string(protocol));
    EXPECT_EQ(round_trip(value, protocol), value);
    const pickle_value bytes = pickle_value::make_bytes(std::string(300, '\x01'));
    if (protocol >= 3) {
      EXPECT_EQ(round_trip(bytes, protocol), bytes);
      EXPECT_EQ(round_trip(pickle_value::make_bytes("x"), protocol), pickle_value::make_bytes("x"));
    } else {
      EXPECT_THROW(pickle_dumps(bytes, protocol), std::invalid_argument);
    }
  }
  // Scalars alone, and -0.0 keeps its sign.
  EXPECT_TRUE(std::signbit(round_trip(-0.0, 4).as_float()));
  EXPECT_EQ(round_trip(nullptr, 2), pickle_value());
  EXPECT_EQ(round_trip(true, 2).as_bool(), true);
}

TEST(Pickler, RefusesWhatPythonCouldNotRead) {
  EXPECT_THROW(gpumem::detail::pickler(1), std::invalid_argument);
  EXPECT_THROW(gpumem::detail::pickler(6), std::invalid_argument);
  EXPECT_THROW(pickle_dumps("\xff"), std::invalid_argument);
  EXPECT_THROW(pickle_dumps(pickle_value::make_dict(dict{{pickle_value::make_list(), 1}})),
               std::invalid_argument);
  EXPECT_THROW(static_cast<void>(pickle_value{std::numeric_limits<std::uint64_t>::max()}),
               std::out_of_range);
  EXPECT_EQ(pickle_value(std::uint64_t{5}).as_int(), 5);
}

TEST(Pickler, PythonReadsIt) {
  if (std::system("python3 -c pass > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 is not on PATH";
  }
  seq many;
  for (int i = 0; i < 1500; ++i) many.emplace_back("k" + std::to_string(i % 400));
  const pickle_value v = pickle_value::make_dict(dict{
      {"a", pickle_value::make_list(seq{1, -2, 70000, -70000, std::int64_t{1} << 40,
                                        std::numeric_limits<std::int64_t>::min(), 1.5, nullptr,
                                        true, false})},
      {"t", pickle_value::make_tuple(seq{1, "x", pickle_value::make_tuple(seq{2.0})})},
      {"s", snowman_text},
      {"k", pickle_value::make_dict(dict{{pickle_value::make_tuple(seq{1, "a"}), "tuple key"}})},
      {"b", pickle_value::make_bytes(std::string("\x00\xff", 2))},
      {"many", pickle_value::make_list(many)},
  });
  for (int protocol : {3, 4, 5}) {
    const std::string path = ::testing::TempDir() + "gpumem_pickle_python_check.pickle";
    {
      std::ofstream out(path, std::ios::binary);
      out << pickle_dumps(v, protocol);
    }
    const std::string script =
        "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
        "assert d['a']==[1,-2,70000,-70000,2**40,-2**63,1.5,None,True,False], d['a']; "
        "assert d['t']==(1,'x',(2.0,)); "
        "assert d['s']=='h\\u00e9llo \\u2603 \\U0001F600'; "
        "assert d['k']=={(1,'a'):'tuple key'}; "
        "assert d['b']==b'\\x00\\xff'; "
        "assert d['many']==['k%d'%(i%400) for i in range(1500)]; "
        "assert list(d)==['a','t','s','k','b','many']";
    const std::string command = "python3 -c \"" + script + "\" " + path;
    EXPECT_EQ(std::system(command.c_str()), 0) << "protocol " << protocol;
    std::remove(path.c_str());
  }
}

}  // namespace
