// A small JSON reader for config files and safetensors headers. Parses the whole document
// into a tree; numbers are doubles (integers up to 2^53 are exact, enough for byte offsets).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::json {

class Value {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Value() = default;
  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  bool as_bool() const { return bool_; }
  double as_number() const { return number_; }
  const std::string& as_string() const { return string_; }
  const std::vector<Value>& as_array() const { return array_; }
  // Keys in document order (safetensors headers are small; a linear find is fine).
  const std::vector<std::pair<std::string, Value>>& as_object() const { return object_; }

  // Object member or nullptr (also nullptr when this is not an object).
  const Value* find(std::string_view key) const;

 private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Value> array_;
  std::vector<std::pair<std::string, Value>> object_;
};

// Throws std::runtime_error with the byte offset on malformed input.
Value parse(std::string_view text);

}  // namespace sluice::json
