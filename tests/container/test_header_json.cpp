// The container's streaming JSON reader and writer (src/container/strict_json.hpp):
// strict RFC 8259 + UTF-8 checks whatever the caller reads or skips, and a
// writer whose output is byte for byte nlohmann::json::dump() of the same
// document (headers keep the bytes earlier writers produced).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "container/strict_json.hpp"
#include "tensorzip/container.hpp"

namespace tc = tz::container;
using tz::container::detail::JsonReader;
using tz::container::detail::JsonWriter;

namespace {

// Skips the whole document; "" when it is accepted, else the error message.
std::string check(const std::string& s) {
  try {
    JsonReader r(s.data(), s.size(), "f", "doc");
    r.skip();
    r.finish();
    return "";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput);
    return e.what();
  }
}

}  // namespace

TEST(HeaderJson, AcceptsWhatRfc8259Allows) {
  for (const char* ok : {"{}", "[]", " {\"a\" : [1, -2, 3.5e-3, 0, -0, true, false, null, \"x\"]} ",
                         "\"\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "18446744073709551615",
                         "{\"a\":{\"a\":{}}}", "[{\"k\":1},{\"k\":2}]", "\"caf\xc3\xa9 \xf0\x9f\x98\x80\""})
    EXPECT_EQ(check(ok), "") << ok;
}

TEST(HeaderJson, RefusesWhatItDoesNot) {
  struct Case {
    std::string doc, expect;
  } cases[] = {
      {"{\"a\":1,\"a\":2}", "duplicate key 'a'"},
      {"{\"a\\u0062\":1,\"ab\":2}", "duplicate key 'ab'"},  // equal once unescaped
      {"[{\"x\":{\"k\":1,\"k\":1}}]", "duplicate key 'k'"},  // inside skipped values too
      {"{\"a\":1,}", "expected a string key"},
      {"[1,]", "unexpected character"},
      {"[01]", "expected ','"},
      {"[1.]", "invalid number"},
      {"[-]", "invalid number"},
      {"[1e]", "invalid number"},
      {"\"a", "unterminated string"},
      {"\"a\x01\"", "control character"},
      {"\"\\x\"", "invalid escape"},
      {"\"\\u12g4\"", "invalid \\u escape"},
      {"\"\\ud800\"", "high surrogate"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\xc0\xaf\"", "invalid UTF-8"},              // overlong
      {"\"\xed\xa0\x80\"", "invalid UTF-8"},          // surrogate
      {"\"\xf4\x90\x80\x80\"", "invalid UTF-8"},      // above U+10FFFF
      {"\"\xe2\x82\"", "invalid UTF-8"},              // truncated
      {"[tru]", "invalid literal"},
      {"{} x", "trailing characters"},
      {"", "unexpected end of input"},
      {std::string(33, '[') + std::string(33, ']'), "nests deeper than 32 levels"},
  };
  for (const auto& c : cases) {
    const std::string m = check(c.doc);
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.doc << " -> " << m;
    EXPECT_EQ(m.rfind("f: doc ", 0), 0u) << m;  // names the file and the part
  }
  EXPECT_EQ(check(std::string(32, '[') + std::string(32, ']')), "");
}

TEST(HeaderJson, NumbersAndStringsAsRead) {
  const std::string s = R"({"u":18446744073709551615,"big":18446744073709551616,"neg":-5,"f":1.5,"s":"a\"b","t":"x"})";
  JsonReader r(s.data(), s.size(), "f", "doc");
  r.for_each_member([&](std::string_view k) {
    uint64_t u = 0;
    int64_t i = 0;
    if (k == "u") {
      EXPECT_TRUE(r.read_u64(&u));
      EXPECT_EQ(u, UINT64_MAX);
    } else if (k == "big") {
      EXPECT_FALSE(r.read_u64(&u));
    } else if (k == "neg") {
      EXPECT_TRUE(r.read_i64(&i));
      EXPECT_EQ(i, -5);
    } else if (k == "f") {
      EXPECT_FALSE(r.read_u64(&u));
    } else if (k == "s") {
      EXPECT_EQ(r.read_string(), "a\"b");
    } else {
      EXPECT_EQ(r.read_string(), "x");
    }
  });
  r.finish();
}

// Random documents of the shapes headers hold: the writer's bytes equal
// nlohmann's dump of the same document (keys given in sorted order, as a
// std::map-backed object holds them).
TEST(HeaderJson, WriterEqualsNlohmannDump) {
  std::mt19937 rng(7);
  auto rnd_string = [&] {
    static const std::vector<std::string> pieces = {"a", "Z", "0", " ", "\"", "\\", "/", "\b", "\f", "\n", "\r", "\t",
                                                    std::string(1, '\x01'), std::string(1, '\x1f'), "\x7f",
                                                    "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    std::string s;
    const int n = (int)(rng() % 12);
    for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
    return s;
  };
  for (int round = 0; round < 300; ++round) {
    nlohmann::json j = nlohmann::json::object();
    std::string out;
    JsonWriter w(&out);
    std::map<std::string, int> keys;
    const int nk = 1 + (int)(rng() % 6);
    for (int k = 0; k < nk; ++k) keys[rnd_string()] = (int)(rng() % 4);
    w.begin_object();
    for (const auto& [k, kind] : keys) {
      w.key(k);
      if (kind == 0) {
        const std::string v = rnd_string();
        w.string(v), j[k] = v;
      } else if (kind == 1) {
        const uint64_t v = (uint64_t)rng() << 32 | rng();
        w.u64(v), j[k] = v;
      } else if (kind == 2) {
        const int64_t v = -(int64_t)(rng() % 100000) - 1;
        w.i64(v), j[k] = v;
      } else {
        nlohmann::json a = nlohmann::json::array();
        w.begin_array();
        for (int e = 0; e < (int)(rng() % 4); ++e) {
          const std::string v = rnd_string();
          w.begin_object(), w.key("x"), w.string(v), w.end_object();
          a.push_back({{"x", v}});
        }
        w.end_array();
        j[k] = a;
      }
    }
    w.end_object();
    ASSERT_EQ(out, j.dump()) << round;
    EXPECT_EQ(check(out), "");
  }
  std::string out;
  JsonWriter w(&out);
  EXPECT_THROW(w.string("bad \xff utf-8"), tc::Error);
}
