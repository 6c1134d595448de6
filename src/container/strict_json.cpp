#include "strict_json.hpp"

#include <cstring>

#include "file_io.hpp"

namespace tz::container::detail {

namespace {
// Keys compared by scanning while an object has at most this many.
constexpr size_t kFewKeys = 16;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string* s, uint32_t cp) {
  if (cp < 0x80) {
    s->push_back((char)cp);
  } else if (cp < 0x800) {
    s->push_back((char)(0xC0 | (cp >> 6)));
    s->push_back((char)(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s->push_back((char)(0xE0 | (cp >> 12)));
    s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back((char)(0x80 | (cp & 0x3F)));
  } else {
    s->push_back((char)(0xF0 | (cp >> 18)));
    s->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
    s->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back((char)(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned c = p[0];
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) n = 3;
  else if (c == 0xED) n = 3, hi = 0x9F;  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) n = 3;
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) n = 4, hi = 0x8F;  // at most U+10FFFF
  else return 0;
  if ((size_t)(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if ((p[i] & 0xC0) != 0x80) return 0;
  return n;
}

JsonReader::JsonReader(const char* p, size_t n, std::string what, std::string part)
    : begin_(p), p_(p), end_(p + n), what_(std::move(what)), part_(std::move(part)), keys_(kMaxDepth + 1) {}

void JsonReader::syntax_error(const std::string& msg) const {
  fail(ErrorKind::kBadInput,
       what_ + ": " + part_ + " is not valid JSON (" + msg + " at byte " + std::to_string(offset()) + ")");
}

void JsonReader::fail_here(const std::string& msg) const { fail(ErrorKind::kBadInput, what_ + ": " + part_ + " " + msg); }

JsonReader::Kind JsonReader::peek() {
  ws();
  if (p_ == end_) syntax_error("unexpected end of input");
  switch (*p_) {
    case '{': return Kind::kObject;
    case '[': return Kind::kArray;
    case '"': return Kind::kString;
    case 't': return Kind::kTrue;
    case 'f': return Kind::kFalse;
    case 'n': return Kind::kNull;
    default:
      if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return Kind::kNumber;
      syntax_error(std::string("unexpected character '") + (*p_ >= 0x20 && *p_ < 0x7F ? std::string(1, *p_) : "?") + "'");
  }
}

void JsonReader::open(char c) {
  ws();
  if (p_ == end_ || *p_ != c) syntax_error(std::string("expected '") + c + "'");
  if (depth_ >= kMaxDepth) fail_here("nests deeper than " + std::to_string(kMaxDepth) + " levels");
  ++depth_;
  ++p_;
}

bool JsonReader::close_if(char c) {
  ws();
  if (p_ < end_ && *p_ == c) {
    ++p_;
    return true;
  }
  return false;
}

bool JsonReader::next_or_close(char c) {
  ws();
  if (p_ == end_) syntax_error(std::string("unexpected end of input; expected ',' or '") + c + "'");
  if (*p_ == ',') {
    ++p_;
    return true;
  }
  if (*p_ == c) {
    ++p_;
    return false;
  }
  syntax_error(std::string("expected ',' or '") + c + "'");
}

JsonReader::KeySet& JsonReader::key_set() {
  KeySet& ks = keys_[(size_t)depth_ - 1];
  ks.few.clear();
  ks.many.clear();
  return ks;
}

std::string_view JsonReader::read_key(KeySet& ks) {
  ws();
  if (p_ == end_ || *p_ != '"') syntax_error("expected a string key");
  const std::string_view k = scan_string(true, true);
  bool dup;
  if (ks.many.empty() && ks.few.size() < kFewKeys) {
    dup = false;
    for (const auto& e : ks.few)
      if (e == k) dup = true;
    if (!dup) ks.few.push_back(k);
  } else {
    if (ks.many.empty()) ks.many.insert(ks.few.begin(), ks.few.end());
    dup = !ks.many.insert(k).second;
  }
  if (dup) fail_here("has duplicate key '" + std::string(k) + "'");
  ws();
  if (p_ == end_ || *p_ != ':') syntax_error("expected ':' after a key");
  ++p_;
  return k;
}

std::string_view JsonReader::scan_string(bool keep, bool stable) {
  ++p_;  // opening quote
  const char* const start = p_;
  bool escaped = false;
  std::string* out = nullptr;
  while (true) {
    // Fast path: plain ASCII (copied in one piece once there is an escape).
    const char* const run = p_;
    while (p_ < end_) {
      const unsigned char c = (unsigned char)*p_;
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
      ++p_;
    }
    if (out) out->append(run, (size_t)(p_ - run));
    if (p_ == end_) syntax_error("unterminated string");
    const unsigned char c = (unsigned char)*p_;
    if (c == '"') break;
    if (c < 0x20) syntax_error("control character in a string");
    if (c >= 0x80) {
      const size_t n = utf8_sequence((const unsigned char*)p_, (const unsigned char*)end_);
      if (n == 0) syntax_error("invalid UTF-8 in a string");
      if (out) out->append(p_, n);
      p_ += n;
      continue;
    }
    // Backslash: switch to building the unescaped text.
    if (!escaped && keep) {
      escaped = true;
      if (stable) {
        owned_keys_.emplace_back();
        out = &owned_keys_.back();
      } else {
        scratch_.clear();
        out = &scratch_;
      }
      out->assign(start, (size_t)(p_ - start));
    }
    escaped = true;
    if (end_ - p_ < 2) syntax_error("unterminated string");
    const char e = p_[1];
    p_ += 2;
    char simple = 0;
    switch (e) {
      case '"': simple = '"'; break;
      case '\\': simple = '\\'; break;
      case '/': simple = '/'; break;
      case 'b': simple = '\b'; break;
      case 'f': simple = '\f'; break;
      case 'n': simple = '\n'; break;
      case 'r': simple = '\r'; break;
      case 't': simple = '\t'; break;
      case 'u': break;
      default: syntax_error("invalid escape in a string");
    }
    if (simple) {
      if (out) out->push_back(simple);
      continue;
    }
    auto hex4 = [&]() -> uint32_t {
      if (end_ - p_ < 4) syntax_error("truncated \\u escape");
      uint32_t v = 0;
      for (int i = 0; i < 4; ++i) {
        const int d = hex_digit(p_[i]);
        if (d < 0) syntax_error("invalid \\u escape");
        v = (v << 4) | (uint32_t)d;
      }
      p_ += 4;
      return v;
    };
    uint32_t cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) syntax_error("lone low surrogate in a \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') syntax_error("high surrogate not followed by a low one");
      p_ += 2;
      const uint32_t lo = hex4();
      if (lo < 0xDC00 || lo > 0xDFFF) syntax_error("high surrogate not followed by a low one");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (out) append_utf8(out, cp);
  }
  const char* const stop = p_;
  ++p_;  // closing quote
  if (out) return *out;
  return std::string_view(start, (size_t)(stop - start));
}

std::string_view JsonReader::read_string() {
  ws();
  if (p_ == end_ || *p_ != '"') syntax_error("expected a string");
  return scan_string(true, false);
}

void JsonReader::scan_number(bool* integer, bool* negative, uint64_t* magnitude, bool* fits) {
  ws();
  *integer = true;
  *negative = false;
  *magnitude = 0;
  *fits = true;
  if (p_ < end_ && *p_ == '-') *negative = true, ++p_;
  if (p_ == end_ || *p_ < '0' || *p_ > '9') syntax_error("invalid number");
  if (*p_ == '0') {
    ++p_;
  } else {
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const uint64_t d = (uint64_t)(*p_ - '0');
      if (*magnitude > (UINT64_MAX - d) / 10) *fits = false;
      else *magnitude = *magnitude * 10 + d;
      ++p_;
    }
  }
  if (p_ < end_ && *p_ == '.') {
    *integer = false;
    ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') syntax_error("invalid number");
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    *integer = false;
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') syntax_error("invalid number");
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
  }
}

bool JsonReader::read_u64(uint64_t* v, bool* is_number) {
  if (is_number) *is_number = peek() == Kind::kNumber;
  return read_u64_why(v) == nullptr;
}

const char* JsonReader::read_u64_why(uint64_t* v) {
  if (peek() != Kind::kNumber) {
    skip();
    return "not a number";
  }
  bool integer, negative, fits;
  uint64_t m;
  scan_number(&integer, &negative, &m, &fits);
  if (!integer) return "not an integer";
  if (negative && (m != 0 || !fits)) return "negative";
  if (!fits) return "larger than 2^64 - 1";
  *v = m;
  return nullptr;
}

bool JsonReader::read_i64(int64_t* v) {
  if (peek() != Kind::kNumber) {
    skip();
    return false;
  }
  bool integer, negative, fits;
  uint64_t m;
  scan_number(&integer, &negative, &m, &fits);
  if (!integer || !fits) return false;
  if (negative) {
    if (m > (uint64_t)INT64_MAX + 1) return false;
    *v = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
  } else {
    if (m > (uint64_t)INT64_MAX) return false;
    *v = (int64_t)m;
  }
  return true;
}

void JsonReader::expect_literal(const char* lit, size_t n) {
  if ((size_t)(end_ - p_) < n || std::memcmp(p_, lit, n) != 0) syntax_error("invalid literal");
  p_ += n;
}

void JsonReader::skip() {
  switch (peek()) {
    case Kind::kObject: for_each_member([&](std::string_view) { skip(); }); break;
    case Kind::kArray: for_each_element([&] { skip(); }); break;
    case Kind::kString: scan_string(false, false); break;
    case Kind::kTrue: expect_literal("true", 4); break;
    case Kind::kFalse: expect_literal("false", 5); break;
    case Kind::kNull: expect_literal("null", 4); break;
    case Kind::kNumber: {
      bool a, b, c;
      uint64_t m;
      scan_number(&a, &b, &m, &c);
      break;
    }
  }
}

size_t count_occurrences(std::string_view text, std::string_view needle, size_t limit) {
  // memmem, not string_view::find: find stops at every occurrence of the
  // needle's first character, and JSON is full of '"'.
  if (needle.empty()) return 0;
  size_t n = 0;
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  while (n < limit && (size_t)(end - p) >= needle.size()) {
    const void* hit = ::memmem(p, (size_t)(end - p), needle.data(), needle.size());
    if (!hit) break;
    ++n;
    p = static_cast<const char*>(hit) + 1;
  }
  return n;
}

void JsonWriter::u64(uint64_t v) {
  value_start();
  char b[24];
  int i = 24;
  do b[--i] = (char)('0' + v % 10), v /= 10;
  while (v);
  o_->append(b + i, (size_t)(24 - i));
}

void JsonWriter::i64(int64_t v) {
  if (v >= 0) return u64((uint64_t)v);
  value_start();
  o_->push_back('-');
  const uint64_t m = (uint64_t)(-(v + 1)) + 1;
  after_key_ = true;  // the sign is already written
  u64(m);
}

void JsonWriter::write_string(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  o_->push_back('"');
  const unsigned char* p = (const unsigned char*)s.data();
  const unsigned char* const end = p + s.size();
  while (p < end) {
    const unsigned char* run = p;
    while (p < end && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) ++p;
    o_->append((const char*)run, (size_t)(p - run));
    if (p == end) break;
    const unsigned char c = *p;
    if (c >= 0x80) {
      const size_t n = utf8_sequence(p, end);
      if (n == 0) fail(ErrorKind::kUsage, "metadata and tensor names must be valid UTF-8");
      o_->append((const char*)p, n);
      p += n;
      continue;
    }
    ++p;
    switch (c) {
      case '"': o_->append("\\\""); break;
      case '\\': o_->append("\\\\"); break;
      case '\b': o_->append("\\b"); break;
      case '\f': o_->append("\\f"); break;
      case '\n': o_->append("\\n"); break;
      case '\r': o_->append("\\r"); break;
      case '\t': o_->append("\\t"); break;
      default: {
        const char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        o_->append(u, 6);
      }
    }
  }
  o_->push_back('"');
}

void JsonReader::finish() {
  ws();
  if (p_ != end_) syntax_error("trailing characters after the value");
}

}  // namespace tz::container::detail
