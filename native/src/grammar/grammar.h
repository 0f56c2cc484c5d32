// A context-free grammar over bytes, as the token matcher (token_matcher.h) walks it, and the
// reader of its text form: the EBNF that xgrammar prints for a compiled JSON schema
// (`Grammar.toString()`), which is also what the native tests write by hand.
//
// Every rule is a list of alternatives; every alternative a run of elements ending in End. An
// element matches one byte (Bytes: a set of bytes), one character (Class: ASCII bytes from a set,
// or any valid multi-byte UTF-8 character when `any_non_ascii`), or a rule (Ref). Bytes and Class
// elements may repeat zero or more times (`star`), or a counted number of times (`counted`:
// min_count to max_count characters, the count kept in the matcher's state, so a length of 1,000
// costs what a length of 40 does). Runs of one class, however written (`C{m,n}`, `C C C`, a rule
// that is one class repeated, xgrammar's chains `r1 ::= "" | C r2`, ..., alternatives of such runs
// with adjoining ranges, `r ::= C r | C`), are read as one counted or starred element. Other
// groups, `?`, `+`, `{m,n}` and repeated groups are lowered to auxiliary rules; alternatives that
// begin alike are factored (`A B | A C` -> `A (B | C)`); lookahead assertions `(= ...)` are read
// and dropped (they only restate what the grammar already implies).
#pragma once
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sluice::grammar {

/** The text is not a grammar this reader understands (or not a grammar at all). */
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ElemKind : uint8_t { kBytes, kClass, kRef, kEnd };

/** max_count of a counted element with no upper bound. */
constexpr uint32_t kUnboundedCount = UINT32_MAX;

struct Element {
  ElemKind kind = ElemKind::kEnd;
  bool star = false;           // Bytes / Class: zero or more times
  bool any_non_ascii = false;  // Class: any valid multi-byte UTF-8 character also matches
  bool counted = false;        // Bytes / Class: min_count to max_count times (never with star)
  int32_t rule = -1;           // Ref: the rule referenced
  uint32_t min_count = 0;      // counted: at least this many (characters, or bytes for Bytes)
  uint32_t max_count = 0;      // counted: at most this many (>= 1; kUnboundedCount: no bound, then min_count >= 1)
  std::array<uint64_t, 4> set{};  // Bytes: the bytes matched; Class: the ASCII bytes matched

  bool has(uint8_t b) const { return (set[b >> 6] >> (b & 63)) & 1; }
};

struct Grammar {
  /** All alternatives, each a contiguous run of elements closed by an End element. */
  std::vector<Element> elems;
  /** Per rule, the index in `elems` where each of its alternatives starts. */
  std::vector<std::vector<uint32_t>> alts;
  std::vector<std::string> names;
  int32_t root = -1;
};

/**
 * Reads grammar text (`name ::= body`, one rule per line or more). Throws GrammarError for text it
 * cannot read, a rule used but never defined, a character class holding non-ASCII code points, a
 * missing root rule, and left recursion (a rule that can reach itself before consuming a byte).
 */
Grammar parse_grammar(const std::string& text, const std::string& root_rule = "root");

}  // namespace sluice::grammar
