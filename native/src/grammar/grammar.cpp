// Reads grammar text into the element form the matcher walks (see grammar.h).

#include "grammar/grammar.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace sluice::grammar {
namespace {

constexpr int kUnbounded = -1;
/**
 * Counts in `{m,n}` above this are refused (JSON-schema counts are bounded at 100,000 before they
 * reach a grammar).
 */
constexpr int kMaxCount = 100000;
/**
 * Up to this many required copies are unrolled (each copy gets its own static context: the best
 * masks); more are built by halving (see exact_rule). Optional copies are always unrolled, so a
 * range wider than this is refused rather than blown up.
 */
constexpr int kMaxUnrolled = 1024;
/** Elements in a lowered grammar; past this it is refused (nested repetitions multiply). */
constexpr size_t kMaxElements = size_t(1) << 20;
/** A run of one class longer than this is not read as a counted element (it is lowered as written). */
constexpr int64_t kMaxRun = 10'000'000;
/** Runs up to this many characters stay unrolled, one element each (as they always were). */
constexpr int64_t kMinCounted = 4;
/** Rules followed when reading a run (a longer chain of rules is lowered as written). */
constexpr int kMaxRunDepth = 256;

struct Expr {
  enum class Kind { kAlt, kSeq, kLiteral, kClass, kRef, kRepeat } kind = Kind::kSeq;
  std::vector<Expr> kids;
  std::string literal;              // kLiteral: bytes
  std::array<uint64_t, 4> set{};    // kClass: ASCII bytes
  bool any_non_ascii = false;       // kClass
  std::string name;                 // kRef
  int min = 0, max = 0;             // kRepeat
};

void set_bit(std::array<uint64_t, 4>& set, unsigned b) { set[b >> 6] |= uint64_t(1) << (b & 63); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

class Reader {
 public:
  explicit Reader(const std::string& text) : s_(text) {}

  /** name -> body, in order of definition. */
  std::vector<std::pair<std::string, Expr>> rules() {
    std::vector<std::pair<std::string, Expr>> out;
    skip_space();
    while (i_ < s_.size()) {
      std::string name = ident();
      if (name.empty()) fail("a rule name");
      skip_space();
      if (s_.compare(i_, 3, "::=") != 0) fail("'::='");
      i_ += 3;
      out.emplace_back(name, alternatives());
      skip_space();
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw GrammarError("grammar text: expected " + expected + " at offset " + std::to_string(i_));
  }

  void skip_space() {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        i_++;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') i_++;
      } else {
        break;
      }
    }
  }

  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  }

  std::string ident() {
    size_t start = i_;
    while (i_ < s_.size() && ident_char(s_[i_])) i_++;
    return s_.substr(start, i_ - start);
  }

  /** Whether the next thing is `name ::=` (the start of the next rule). */
  bool at_rule_start() {
    size_t save = i_;
    std::string name = ident();
    skip_space();
    bool yes = !name.empty() && s_.compare(i_, 3, "::=") == 0;
    i_ = save;
    return yes;
  }

  Expr alternatives() {
    Expr alt;
    alt.kind = Expr::Kind::kAlt;
    alt.kids.push_back(sequence());
    while (true) {
      skip_space();
      if (i_ < s_.size() && s_[i_] == '|') {
        i_++;
        alt.kids.push_back(sequence());
      } else {
        break;
      }
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Expr sequence() {
    Expr seq;
    seq.kind = Expr::Kind::kSeq;
    while (true) {
      skip_space();
      if (i_ >= s_.size()) break;
      char c = s_[i_];
      if (c == '|' || c == ')') break;
      if (c == '(' && i_ + 1 < s_.size() && s_[i_ + 1] == '=') {
        // A lookahead assertion: read, then dropped (it restates what follows the rule).
        i_ += 2;
        alternatives();
        skip_space();
        if (i_ >= s_.size() || s_[i_] != ')') fail("')' closing a lookahead");
        i_++;
        continue;
      }
      if (ident_char(c) && at_rule_start()) break;
      Expr atom = this->atom();
      seq.kids.push_back(quantified(std::move(atom)));
    }
    return seq;
  }

  Expr atom() {
    char c = s_[i_];
    if (c == '"') return literal();
    if (c == '[') return char_class();
    if (c == '(') {
      i_++;
      Expr inner = alternatives();
      skip_space();
      if (i_ >= s_.size() || s_[i_] != ')') fail("')'");
      i_++;
      return inner;
    }
    if (ident_char(c)) {
      Expr ref;
      ref.kind = Expr::Kind::kRef;
      ref.name = ident();
      return ref;
    }
    fail("a string, a character class, a rule name or '('");
  }

  int number() {
    size_t start = i_;
    long v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_++] - '0');
      if (v > kMaxCount) throw GrammarError("grammar text: a repetition count above " + std::to_string(kMaxCount));
    }
    if (i_ == start) fail("a number");
    return int(v);
  }

  Expr quantified(Expr atom) {
    // A quantifier follows its atom directly (a space would start the next item).
    if (i_ >= s_.size()) return atom;
    char c = s_[i_];
    int min, max;
    if (c == '*') {
      min = 0, max = kUnbounded, i_++;
    } else if (c == '+') {
      min = 1, max = kUnbounded, i_++;
    } else if (c == '?') {
      min = 0, max = 1, i_++;
    } else if (c == '{') {
      i_++;
      skip_space();
      min = number();
      skip_space();
      max = min;
      if (i_ < s_.size() && s_[i_] == ',') {
        i_++;
        skip_space();
        max = (i_ < s_.size() && s_[i_] == '}') ? kUnbounded : number();
        skip_space();
      }
      if (i_ >= s_.size() || s_[i_] != '}') fail("'}'");
      i_++;
      if (max != kUnbounded && max < min) throw GrammarError("grammar text: a repetition {m,n} with n < m");
    } else {
      return atom;
    }
    Expr rep;
    rep.kind = Expr::Kind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.kids.push_back(std::move(atom));
    return quantified(std::move(rep));
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; k++) {
      if (i_ >= s_.size() || hex(s_[i_]) < 0) fail("a hex digit");
      v = v * 16 + uint32_t(hex(s_[i_++]));
    }
    return v;
  }

  /** One escape after its backslash, as a code point. */
  uint32_t escape() {
    if (i_ >= s_.size()) fail("an escaped character");
    char c = s_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'b': return '\b';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'a': return '\a';
      case 'e': return 0x1b;
      case '0': return 0;
      case 'x': return hex_digits(2);
      case 'u': return hex_digits(4);
      case 'U': return hex_digits(8);
      default: return uint8_t(c);
    }
  }

  Expr literal() {
    Expr lit;
    lit.kind = Expr::Kind::kLiteral;
    i_++;  // "
    while (true) {
      if (i_ >= s_.size()) fail("'\"' closing a string");
      char c = s_[i_++];
      if (c == '"') break;
      if (c == '\\') {
        append_utf8(lit.literal, escape());
      } else {
        lit.literal += c;  // raw UTF-8 bytes stay as they are
      }
    }
    return lit;
  }

  /** One member of a character class, as a code point. */
  uint32_t class_char() {
    if (i_ >= s_.size()) fail("']' closing a character class");
    char c = s_[i_++];
    if (c == '\\') return escape();
    if (uint8_t(c) >= 0x80) return 0x80;  // a raw non-ASCII character: refused by the caller
    return uint8_t(c);
  }

  Expr char_class() {
    Expr cls;
    cls.kind = Expr::Kind::kClass;
    i_++;  // [
    bool negated = i_ < s_.size() && s_[i_] == '^';
    if (negated) i_++;
    std::array<uint64_t, 4> set{};
    while (true) {
      if (i_ >= s_.size()) fail("']' closing a character class");
      if (s_[i_] == ']') {
        i_++;
        break;
      }
      uint32_t lo = class_char(), hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        i_++;
        hi = class_char();
      }
      if (hi < lo) throw GrammarError("grammar text: a character range with its ends reversed");
      if (hi >= 0x80) throw GrammarError("grammar text: a character class with non-ASCII characters (not supported natively)");
      for (uint32_t c = lo; c <= hi; c++) set_bit(set, c);
    }
    if (negated) {
      for (int w = 0; w < 2; w++) cls.set[w] = ~set[w];
      cls.any_non_ascii = true;
    } else {
      cls.set = set;
    }
    return cls;
  }

  const std::string& s_;
  size_t i_ = 0;
};

/** Turns read expressions into rules of elements. */
class Lowering {
 public:
  Grammar build(std::vector<std::pair<std::string, Expr>> rules, const std::string& root_rule) {
    for (auto& [name, body] : rules) exprs_.emplace(name, &body);
    // Runs read from the last rule up: chains (r1 ::= "" | C r2, ...) are printed first link
    // first, so each link then finds the next one read already (no deep recursion).
    for (size_t k = rules.size(); k-- > 0;) {
      Expr ref;
      ref.kind = Expr::Kind::kRef;
      ref.name = rules[k].first;
      run_of(ref, 0);
    }
    for (auto& [name, body] : rules) {
      int id = rule_id(name);
      if (defined_.size() <= size_t(id)) defined_.resize(id + 1, false);
      if (defined_[id]) throw GrammarError("grammar text: rule '" + name + "' is defined twice");
      defined_[id] = true;
    }
    for (auto& [name, body] : rules) define(rule_id(name), body);
    for (size_t r = 0; r < g_.names.size(); r++) {
      if (r >= defined_.size() || !defined_[r]) throw GrammarError("grammar text: rule '" + g_.names[r] + "' is used but not defined");
    }
    auto root = ids_.find(root_rule);
    if (root == ids_.end()) throw GrammarError("grammar text: no rule named '" + root_rule + "'");
    g_.root = root->second;
    for (size_t r = 0; r < bodies_.size(); r++) factor_prefixes(int(r));
    // Alternatives were built per rule; lay them out in `elems` now.
    g_.alts.assign(bodies_.size(), {});
    for (size_t r = 0; r < bodies_.size(); r++) {
      for (auto& alt : bodies_[r]) {
        g_.alts[r].push_back(uint32_t(g_.elems.size()));
        g_.elems.insert(g_.elems.end(), alt.begin(), alt.end());
        g_.elems.push_back(Element{});  // End
      }
    }
    return std::move(g_);
  }

 private:
  using Alt = std::vector<Element>;

  int rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    int id = int(g_.names.size());
    g_.names.push_back(name);
    ids_.emplace(name, id);
    if (bodies_.size() <= size_t(id)) bodies_.resize(id + 1);
    return id;
  }

  int aux_rule(const std::string& base) {
    int id = rule_id(base + "#" + std::to_string(++aux_count_));
    if (defined_.size() <= size_t(id)) defined_.resize(id + 1, false);
    defined_[id] = true;
    return id;
  }

  /**
   * A run of one class: `cls` repeated lo..hi times (hi = kUnbounded: no bound). `empty`: the
   * expression matches only "" (a run of any class, 0 times).
   */
  struct Run {
    bool empty = true;
    Element cls;
    int64_t lo = 0, hi = 0;
  };

  static bool same_class(const Element& a, const Element& b) {
    return a.kind == b.kind && a.set == b.set && a.any_non_ascii == b.any_non_ascii;
  }

  /** Joins `b` into `a` when both are runs of one class (or empty); false otherwise. */
  static bool adopt_class(Run& a, const Run& b) {
    if (b.empty) return true;
    if (a.empty) {
      a.empty = false;
      a.cls = b.cls;
      return true;
    }
    return same_class(a.cls, b.cls);
  }

  static int64_t add_counts(int64_t a, int64_t b) { return a == kUnbounded || b == kUnbounded ? kUnbounded : a + b; }

  /** What `e` matches, when that is one class repeated a contiguous range of times (see Run). */
  std::optional<Run> run_of(const Expr& e, int depth) {
    if (depth > kMaxRunDepth) return std::nullopt;
    switch (e.kind) {
      case Expr::Kind::kClass:
      case Expr::Kind::kLiteral: {
        Run r;
        if (e.kind == Expr::Kind::kLiteral && e.literal.empty()) return r;
        if (!single(e, r.cls)) return std::nullopt;
        r.empty = false;
        r.lo = r.hi = 1;
        return r;
      }
      case Expr::Kind::kRef: {
        auto memo = runs_.find(e.name);
        if (memo != runs_.end()) return memo->second;
        auto body = exprs_.find(e.name);
        if (body == exprs_.end()) return std::nullopt;
        runs_.emplace(e.name, std::nullopt);  // while in progress: a cycle is no run
        std::optional<Run> r = star_rule(e.name, *body->second);
        if (!r) r = run_of(*body->second, depth + 1);  // (only rules count towards the depth)
        runs_[e.name] = r;
        return r;
      }
      case Expr::Kind::kSeq: {
        Run acc;
        for (const Expr& kid : e.kids) {
          std::optional<Run> r = run_of(kid, depth);
          if (!r || !adopt_class(acc, *r)) return std::nullopt;
          acc.lo += r->lo;
          acc.hi = add_counts(acc.hi, r->hi);
          if (acc.lo > kMaxRun || acc.hi > kMaxRun) return std::nullopt;
        }
        return acc;
      }
      case Expr::Kind::kAlt: {
        // Alternatives of one class whose count ranges, sorted, leave no gap: their union.
        Run acc;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (const Expr& kid : e.kids) {
          std::optional<Run> r = run_of(kid, depth);
          if (!r || !adopt_class(acc, *r)) return std::nullopt;
          ranges.emplace_back(r->lo, r->hi == kUnbounded ? INT64_MAX : r->hi);
        }
        std::sort(ranges.begin(), ranges.end());
        int64_t lo = ranges[0].first, hi = ranges[0].second;
        for (auto [a, b] : ranges) {
          if (hi != INT64_MAX && a > hi + 1) return std::nullopt;
          hi = std::max(hi, b);
        }
        acc.lo = lo;
        acc.hi = hi == INT64_MAX ? kUnbounded : hi;
        return acc;
      }
      case Expr::Kind::kRepeat: {
        std::optional<Run> r = run_of(e.kids[0], depth);
        if (!r) return std::nullopt;
        if (r->empty) return r;
        Run out = *r;
        const int64_t m = e.min, n = e.max;
        if (r->lo == 1 && r->hi == 1) {
          out.lo = m, out.hi = n;
        } else if (r->lo == r->hi && m == n) {
          out.lo = out.hi = m * r->lo;
        } else if (r->lo == 0) {  // each copy may match nothing: 0 to n * hi
          out.lo = 0;
          out.hi = n == kUnbounded || r->hi == kUnbounded ? kUnbounded : n * r->hi;
        } else {
          return std::nullopt;  // (C C){1,3}: 2, 4 or 6, not a range
        }
        if (out.lo > kMaxRun || out.hi > kMaxRun) return std::nullopt;
        return out;
      }
    }
    return std::nullopt;
  }

  /**
   * `r ::= "" | C r` (as xgrammar prints `C*`): C repeated 0 or more times; `r ::= C r | C` (as it
   * prints `C+`): 1 or more.
   */
  std::optional<Run> star_rule(const std::string& name, const Expr& body) {
    const Expr* b = &body;
    while (b->kind == Expr::Kind::kSeq && b->kids.size() == 1) b = &b->kids[0];
    if (b->kind != Expr::Kind::kAlt || b->kids.size() != 2) return std::nullopt;
    auto unwrap = [](const Expr* x) {
      while (x->kind == Expr::Kind::kSeq && x->kids.size() == 1) x = &x->kids[0];
      return x;
    };
    for (int end = 0; end < 2; end++) {
      const Expr* stop = unwrap(&b->kids[size_t(end)]);
      const Expr* loop = unwrap(&b->kids[size_t(1 - end)]);
      const bool is_empty = (stop->kind == Expr::Kind::kLiteral && stop->literal.empty()) ||
                            (stop->kind == Expr::Kind::kSeq && stop->kids.empty());
      if (loop->kind != Expr::Kind::kSeq || loop->kids.size() != 2) continue;
      const Expr* self = unwrap(&loop->kids[1]);
      Run r;
      if (self->kind != Expr::Kind::kRef || self->name != name || !single(*unwrap(&loop->kids[0]), r.cls)) continue;
      Element last;
      if (!is_empty && !(single(*stop, last) && last.kind == r.cls.kind && last.set == r.cls.set && last.any_non_ascii == r.cls.any_non_ascii)) continue;
      r.empty = false;
      r.lo = is_empty ? 0 : 1;
      r.hi = kUnbounded;
      return r;
    }
    return std::nullopt;
  }

  /**
   * A run to write as elements of its own: long enough to be one counted element, or with no upper
   * bound (then a few copies of the class and a starred one). Shorter ones are lowered as written.
   * NOTE: `r ::= "" | C r` as written is a rule referenced from two places (its user and itself),
   * so the matcher knows nothing of what follows it when compiling; `C*` in place does.
   */
  static bool worth_counting(const Run& r) {
    return !r.empty && (r.hi == kUnbounded || r.hi >= kMinCounted);
  }

  /** Appends a run: nothing, the class, the class starred (after lo copies when lo is small), or counted. */
  static void append_run(const Run& r, Alt& out) {
    if (r.empty || r.hi == 0) return;
    Element el = r.cls;
    if (r.hi == kUnbounded && r.lo < kMinCounted) {
      for (int64_t k = 0; k < r.lo; k++) out.push_back(r.cls);
      el.star = true;
    } else if (!(r.lo == 1 && r.hi == 1)) {
      el.counted = true;
      el.min_count = uint32_t(r.lo);
      el.max_count = r.hi == kUnbounded ? kUnboundedCount : uint32_t(r.hi);
    }
    out.push_back(el);
  }

  void define(int id, const Expr& outer) {
    // `r ::= (a | b)`, as xgrammar prints every rule: the group is the body, not a rule of its own.
    const Expr* unwrapped = &outer;
    while (unwrapped->kind == Expr::Kind::kSeq && unwrapped->kids.size() == 1 &&
           (unwrapped->kids[0].kind == Expr::Kind::kAlt || unwrapped->kids[0].kind == Expr::Kind::kSeq)) {
      unwrapped = &unwrapped->kids[0];
    }
    const Expr& body = *unwrapped;
    std::vector<Alt> alts;
    if (body.kind == Expr::Kind::kAlt || body.kind == Expr::Kind::kSeq) {
      std::optional<Run> run = run_of(body, 0);
      if (run && worth_counting(*run)) {
        alts.emplace_back();
        append_run(*run, alts.back());
        bodies_[id] = std::move(alts);
        return;
      }
    }
    if (body.kind == Expr::Kind::kAlt) {
      for (auto& kid : body.kids) {
        alts.emplace_back();
        append(kid, alts.back(), id);
      }
    } else {
      alts.emplace_back();
      append(body, alts.back(), id);
    }
    bodies_[id] = std::move(alts);
  }

  static auto element_fields(const Element& e) {
    return std::make_tuple(e.kind, e.star, e.any_non_ascii, e.counted, e.rule, e.min_count, e.max_count, e.set);
  }
  static bool same_element(const Element& a, const Element& b) { return element_fields(a) == element_fields(b); }

  /**
   * Alternatives of a rule that begin alike share that beginning once: `r ::= A B | A C` becomes
   * `r ::= A r#k`, `r#k ::= B | C` (xgrammar prints `(X ".")+` as `r ::= X "." r | X "."`). Same
   * language; but the matcher no longer carries one parse stack per alternative through A, and the
   * rules inside A are referenced from one place, so their context is known when compiling (see
   * token_matcher.h): masks there are cheaper, several times over for an e-mail's domain. Linear
   * in the rule's elements (an enum of many values becomes a trie of rules).
   */
  void factor_prefixes(int id) {
    std::vector<int> todo{id};
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      std::vector<Alt> alts = std::move(bodies_[size_t(r)]);
      // Group the alternatives by their first element.
      std::vector<size_t> order;
      for (size_t i = 0; i < alts.size(); i++) {
        if (!alts[i].empty()) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return element_fields(alts[a][0]) < element_fields(alts[b][0]); });
      std::vector<size_t> group_of(alts.size(), SIZE_MAX);  // [i]: the first alternative of i's group
      std::vector<std::vector<size_t>> members(alts.size());
      for (size_t k = 0; k < order.size();) {
        size_t end = k + 1;
        while (end < order.size() && same_element(alts[order[k]][0], alts[order[end]][0])) end++;
        if (end - k >= 2) {
          for (size_t m = k; m < end; m++) group_of[order[m]] = order[k];  // stable: order[k] is the group's first
          members[order[k]].assign(order.begin() + std::ptrdiff_t(k), order.begin() + std::ptrdiff_t(end));
        }
        k = end;
      }
      std::vector<Alt> out;
      for (size_t i = 0; i < alts.size(); i++) {
        if (group_of[i] == SIZE_MAX) {
          out.push_back(std::move(alts[i]));
          continue;
        }
        if (group_of[i] != i) continue;  // taken into its group's rule
        size_t common = alts[i].size();
        for (size_t j : members[i]) {
          size_t k = 1;
          while (k < common && k < alts[j].size() && same_element(alts[i][k], alts[j][k])) k++;
          common = k;
        }
        std::vector<Alt> rests;
        for (size_t j : members[i]) rests.emplace_back(alts[j].begin() + std::ptrdiff_t(common), alts[j].end());
        Alt head(alts[i].begin(), alts[i].begin() + std::ptrdiff_t(common));
        const int aux = aux_rule(g_.names[size_t(r)]);  // NOTE: grows bodies_
        head.push_back(ref(aux));
        out.push_back(std::move(head));
        bodies_[size_t(aux)] = std::move(rests);
        todo.push_back(aux);
      }
      bodies_[size_t(r)] = std::move(out);
    }
  }

  static Element ref(int rule) {
    Element e;
    e.kind = ElemKind::kRef;
    e.rule = rule;
    return e;
  }

  /** The single element an expression is, when it matches exactly one byte or character. */
  static bool single(const Expr& e, Element& out) {
    if (e.kind == Expr::Kind::kClass) {
      out.kind = e.any_non_ascii ? ElemKind::kClass : ElemKind::kBytes;
      out.set = e.set;
      out.any_non_ascii = e.any_non_ascii;
      return true;
    }
    if (e.kind == Expr::Kind::kLiteral && e.literal.size() == 1) {
      out.kind = ElemKind::kBytes;
      set_bit(out.set, uint8_t(e.literal[0]));
      return true;
    }
    return false;
  }

  void append(const Expr& e, Alt& out, int owner) {
    // Every case below adds at most max(1, literal length) elements.
    elements_ += std::max<size_t>(1, e.literal.size());
    if (elements_ > kMaxElements) {
      throw GrammarError("grammar text: over " + std::to_string(kMaxElements) + " elements once repetitions are unrolled");
    }
    if (e.kind == Expr::Kind::kRef || e.kind == Expr::Kind::kAlt || e.kind == Expr::Kind::kRepeat) {
      std::optional<Run> run = run_of(e, 0);
      if (run && worth_counting(*run)) {
        append_run(*run, out);
        return;
      }
    }
    switch (e.kind) {
      case Expr::Kind::kSeq: {
        // Consecutive items that are runs of one class are one run (`C C{3} r` with r ::= C{0,5}).
        size_t k = 0;
        while (k < e.kids.size()) {
          Run acc;
          size_t end = k;
          while (end < e.kids.size()) {
            std::optional<Run> r = run_of(e.kids[end], 0);
            Run joined = acc;
            if (!r || !adopt_class(joined, *r)) break;
            joined.lo += r->lo;
            joined.hi = add_counts(joined.hi, r->hi);
            if (joined.lo > kMaxRun || joined.hi > kMaxRun) break;
            acc = joined;
            end++;
          }
          if (end > k + 1 && worth_counting(acc)) {
            append_run(acc, out);
            k = end;
          } else {
            append(e.kids[k], out, owner);
            k++;
          }
        }
        return;
      }
      case Expr::Kind::kLiteral:
        for (char c : e.literal) {
          Element el;
          el.kind = ElemKind::kBytes;
          set_bit(el.set, uint8_t(c));
          out.push_back(el);
        }
        return;
      case Expr::Kind::kClass: {
        Element el;
        single(e, el);
        out.push_back(el);
        return;
      }
      case Expr::Kind::kRef:
        out.push_back(ref(rule_id(e.name)));
        return;
      case Expr::Kind::kAlt: {
        int aux = aux_rule(g_.names[owner]);
        define(aux, e);
        out.push_back(ref(aux));
        return;
      }
      case Expr::Kind::kRepeat:
        append_repeat(e, out, owner);
        return;
    }
  }

  void append_repeat(const Expr& e, Alt& out, int owner) {
    const Expr& kid = e.kids[0];
    if (e.max != kUnbounded && e.max - e.min > kMaxUnrolled) {
      throw GrammarError("grammar text: a repetition {m,n} with n - m above " + std::to_string(kMaxUnrolled));
    }
    if (e.min <= kMaxUnrolled) {
      for (int k = 0; k < e.min; k++) append(kid, out, owner);
    } else {
      std::unordered_map<int, int> made;
      out.push_back(ref(exact_rule(kid, e.min, owner, made)));
    }
    Element one;
    if (e.max == kUnbounded) {
      if (single(kid, one)) {
        one.star = true;
        out.push_back(one);
        return;
      }
      // R ::= "" | kid R
      int r = aux_rule(g_.names[owner]);
      Alt loop;
      append(kid, loop, r);
      loop.push_back(ref(r));
      bodies_[r] = {Alt{}, std::move(loop)};
      out.push_back(ref(r));
      return;
    }
    // Up to (max - min) more: R_0 ::= "" | kid R_1, ..., R_last ::= "" | kid
    int optional = e.max - e.min;
    if (optional == 0) return;
    std::vector<int> chain;
    for (int k = 0; k < optional; k++) chain.push_back(aux_rule(g_.names[owner]));
    for (int k = 0; k < optional; k++) {
      Alt more;
      append(kid, more, chain[k]);
      if (k + 1 < optional) more.push_back(ref(chain[k + 1]));
      bodies_[chain[k]] = {Alt{}, std::move(more)};
    }
    out.push_back(ref(chain[0]));
  }

  /**
   * A rule matching `kid` exactly n times, by halving: E(2k) ::= E(k) E(k), E(2k+1) ::= E(k) E(k) E(1).
   * O(log n) rules and log2(n) frames of stack where unrolling makes n copies; still unambiguous
   * (every split is fixed), so it adds no parse stacks. `made`: the rules built so far, by count.
   */
  int exact_rule(const Expr& kid, int n, int owner, std::unordered_map<int, int>& made) {
    auto it = made.find(n);
    if (it != made.end()) return it->second;
    int r = aux_rule(g_.names[owner]);
    made.emplace(n, r);
    Alt body;
    if (n == 1) {
      append(kid, body, r);
    } else {
      int half = exact_rule(kid, n / 2, owner, made);
      body.push_back(ref(half));
      body.push_back(ref(half));
      if (n % 2 == 1) body.push_back(ref(exact_rule(kid, 1, owner, made)));
    }
    bodies_[r] = {std::move(body)};  // after the recursion: aux_rule may grow bodies_
    return r;
  }

  Grammar g_;
  std::unordered_map<std::string, const Expr*> exprs_;           // the rules as read, by name
  std::unordered_map<std::string, std::optional<Run>> runs_;     // run_of of each rule read so far
  std::unordered_map<std::string, int> ids_;
  std::vector<std::vector<Alt>> bodies_;
  std::vector<bool> defined_;
  int aux_count_ = 0;
  size_t elements_ = 0;  // elements appended so far (an upper bound), against kMaxElements
};

/** Refuses left recursion: a rule reaching itself through elements that can match nothing. */
void check_left_recursion(const Grammar& g) {
  size_t n = g.alts.size();
  std::vector<bool> nullable(n, false);
  auto elem_nullable = [&](const Element& e) {
    return e.kind == ElemKind::kEnd || (e.kind == ElemKind::kRef ? bool(nullable[e.rule]) : e.star || (e.counted && e.min_count == 0));
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; r++) {
      if (nullable[r]) continue;
      for (uint32_t start : g.alts[r]) {
        bool all = true;
        for (uint32_t i = start; g.elems[i].kind != ElemKind::kEnd; i++) {
          if (!elem_nullable(g.elems[i])) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int>> first(n);
  for (size_t r = 0; r < n; r++) {
    for (uint32_t start : g.alts[r]) {
      for (uint32_t i = start; g.elems[i].kind != ElemKind::kEnd; i++) {
        const Element& e = g.elems[i];
        if (e.kind == ElemKind::kRef) first[r].push_back(e.rule);
        if (!elem_nullable(e)) break;
      }
    }
  }
  std::vector<uint8_t> mark(n, 0);  // 0 new, 1 on the path, 2 done
  std::function<void(int)> visit = [&](int r) {
    mark[r] = 1;
    for (int s : first[r]) {
      if (mark[s] == 1) throw GrammarError("grammar text: rule '" + g.names[s] + "' is left-recursive");
      if (mark[s] == 0) visit(s);
    }
    mark[r] = 2;
  };
  for (size_t r = 0; r < n; r++) {
    if (mark[r] == 0) visit(int(r));
  }
}

}  // namespace

Grammar parse_grammar(const std::string& text, const std::string& root_rule) {
  Reader reader(text);
  Grammar g = Lowering().build(reader.rules(), root_rule);
  check_left_recursion(g);
  return g;
}

}  // namespace sluice::grammar
