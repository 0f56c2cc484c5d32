#include "util/json.h"

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace sluice::json {

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::Object) return nullptr;
  for (const auto& kv : object_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Value parse_document() {
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 256;
  std::string_view s_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) pos_++;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    pos_++;
  }
  bool consume_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) == lit) {
      pos_ += lit.size();
      return true;
    }
    return false;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    Value v;
    char c = peek();
    if (c == '{') {
      pos_++;
      v.kind_ = Value::Kind::Object;
      if (peek() == '}') {
        pos_++;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a string key");
        std::string key = parse_string();
        expect(':');
        v.object_.emplace_back(std::move(key), parse_value(depth + 1));
        char d = peek();
        pos_++;
        if (d == '}') break;
        if (d != ',') fail("expected ',' or '}'");
      }
    } else if (c == '[') {
      pos_++;
      v.kind_ = Value::Kind::Array;
      if (peek() == ']') {
        pos_++;
        return v;
      }
      for (;;) {
        v.array_.push_back(parse_value(depth + 1));
        char d = peek();
        pos_++;
        if (d == ']') break;
        if (d != ',') fail("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind_ = Value::Kind::String;
      v.string_ = parse_string();
    } else if (consume_literal("true")) {
      v.kind_ = Value::Kind::Bool;
      v.bool_ = true;
    } else if (consume_literal("false")) {
      v.kind_ = Value::Kind::Bool;
    } else if (consume_literal("null")) {
      v.kind_ = Value::Kind::Null;
    } else if (consume_literal("NaN")) {  // Python's json.dump writes these
      v.kind_ = Value::Kind::Number;
      v.number_ = NAN;
    } else if (consume_literal("Infinity")) {
      v.kind_ = Value::Kind::Number;
      v.number_ = INFINITY;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      if (consume_literal("-Infinity")) {
        v.kind_ = Value::Kind::Number;
        v.number_ = -INFINITY;
        return v;
      }
      size_t start = pos_;
      if (s_[pos_] == '-') pos_++;
      while (pos_ < s_.size() && ((s_[pos_] >= '0' && s_[pos_] <= '9') || s_[pos_] == '.' || s_[pos_] == 'e' ||
                                  s_[pos_] == 'E' || s_[pos_] == '+' || s_[pos_] == '-'))
        pos_++;
      std::string num(s_.substr(start, pos_ - start));
      char* end = nullptr;
      v.kind_ = Value::Kind::Number;
      v.number_ = std::strtod(num.c_str(), &end);
      if (end != num.c_str() + num.size()) fail("malformed number");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    pos_++;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t lo = parse_hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("unknown escape");
      }
    }
    return out;
  }
};

Value parse(std::string_view text) { return Parser(text).parse_document(); }

}  // namespace sluice::json
