// Strict, streaming JSON reader for the container's untrusted headers (the
// safetensors header and the .tzip header; doc/container.md sections 3, 4
// and 6).
//
// Why not a DOM: a DOM costs tens of bytes per value before anything is
// validated (a 100 MB header of small values became gigabytes), and the
// callback DOM parser of nlohmann::json re-scans an object's members at the
// end of every member object, which made headers quadratic in the tensor
// count. This reader is a pull parser: the caller walks the document in
// order and keeps only what it validates, so time is linear in the input and
// memory is what the caller stores plus one key set per open object.
//
// What it enforces, whatever the caller reads or skips: RFC 8259 syntax,
// UTF-8 strings (no overlong forms, no surrogates, at most U+10FFFF; \u
// escapes paired correctly), at most kMaxDepth nested containers, no
// duplicate key in any object, nothing but whitespace after the value.
// Every error throws Error(kBadInput) "<what>: <part> ...".
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace tz::container::detail {

class JsonReader {
 public:
  // Both formats nest 3 levels; the cap stops deep recursion in skip().
  static constexpr int kMaxDepth = 32;
  enum class Kind { kObject, kArray, kString, kNumber, kTrue, kFalse, kNull };

  JsonReader(const char* p, size_t n, std::string what, std::string part);

  // Kind of the next value (skips whitespace).
  Kind peek();
  // Calls f(key) for each member of the object that comes next; f must
  // consume the member's value (read it or skip() it). The key is valid
  // until f returns. Throws on a duplicate key.
  template <class F>
  void for_each_member(F&& f) {
    open('{');
    KeySet& ks = key_set();
    if (!close_if('}')) {
      do {
        const std::string_view k = read_key(ks);
        f(k);
      } while (next_or_close('}'));
    }
    --depth_;
  }
  // Calls f() for each element of the array that comes next; f must consume it.
  template <class F>
  void for_each_element(F&& f) {
    open('[');
    if (!close_if(']')) {
      do f();
      while (next_or_close(']'));
    }
    --depth_;
  }
  // A string value, unescaped (valid until the next read).
  std::string_view read_string();
  // A number: true and *v when it is an integer in [0, 2^64), false for any
  // other number (negative, fraction, exponent, too large). Not a number: false
  // too, and *is_number (if given) says which.
  bool read_u64(uint64_t* v, bool* is_number = nullptr);
  // The same read, saying what is wrong: nullptr and *v for an integer in
  // [0, 2^64), else "not a number", "not an integer" (a fraction or an
  // exponent), "negative" or "larger than 2^64 - 1".
  const char* read_u64_why(uint64_t* v);
  // An integer in [-2^63, 2^63) (no fraction or exponent); false otherwise.
  bool read_i64(int64_t* v);
  // Any value (checked as thoroughly as read values).
  void skip();
  // Nothing but whitespace is left.
  void finish();
  // Byte offset of the next unread character.
  size_t offset() const { return (size_t)(p_ - begin_); }
  // "<what>: <part> is not valid JSON (<msg> at byte N)".
  [[noreturn]] void syntax_error(const std::string& msg) const;
  // "<what>: <part> <msg>" (schema errors found by the caller).
  [[noreturn]] void fail_here(const std::string& msg) const;

 private:
  struct KeySet {
    std::vector<std::string_view> few;           // linear scan while small
    std::unordered_set<std::string_view> many;   // then hashed
  };
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  void open(char c);
  bool close_if(char c);
  bool next_or_close(char c);
  KeySet& key_set();
  std::string_view read_key(KeySet& ks);
  // Scans a string starting at p_ (the opening quote); with `keep`, the
  // unescaped text is in the returned view (input bytes when there is no
  // escape, else owned storage).
  std::string_view scan_string(bool keep, bool stable);
  void scan_number(bool* integer, bool* negative, uint64_t* magnitude, bool* fits);
  void expect_literal(const char* lit, size_t n);

  const char* begin_;
  const char* p_;
  const char* end_;
  std::string what_, part_;
  int depth_ = 0;
  std::vector<KeySet> keys_;     // one per open object depth
  std::string scratch_;          // unescaped string values
  std::deque<std::string> owned_keys_;  // unescaped keys (stable addresses)
};

// Writes JSON exactly as nlohmann::json::dump() does for the same document
// (no whitespace; strings escaped with \" \\ \b \f \n \r \t and \u00xx for
// other control characters, UTF-8 kept as is), so headers stay byte for
// byte what earlier writers produced; keys are written in the order given
// (callers give them sorted, as a std::map-backed DOM would). Invalid UTF-8
// in a string throws Error(kUsage).
class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : o_(out) {}
  void begin_object() { value_start(), o_->push_back('{'), first_.push_back(true); }
  void end_object() { o_->push_back('}'), first_.pop_back(); }
  void begin_array() { value_start(), o_->push_back('['), first_.push_back(true); }
  void end_array() { o_->push_back(']'), first_.pop_back(); }
  void key(std::string_view k) {
    separator();
    write_string(k);
    o_->push_back(':');
    after_key_ = true;
  }
  void string(std::string_view s) { value_start(), write_string(s); }
  void u64(uint64_t v);
  void i64(int64_t v);

 private:
  void separator() {
    if (!first_.empty()) {
      if (!first_.back()) o_->push_back(',');
      first_.back() = false;
    }
  }
  void value_start() {
    if (after_key_) after_key_ = false;
    else separator();
  }
  void write_string(std::string_view s);
  std::string* o_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

// Occurrences of `needle` in `text`, counting at most `limit` (a raw byte
// scan: used to reserve tables before a parse, never to validate).
size_t count_occurrences(std::string_view text, std::string_view needle, size_t limit);

// Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0: no
// overlong forms, no surrogates, at most U+10FFFF.
size_t utf8_sequence(const unsigned char* p, const unsigned char* end);

}  // namespace tz::container::detail
