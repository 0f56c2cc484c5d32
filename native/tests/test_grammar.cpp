// The grammar reader and the token matcher. The masks the per-position caches give are checked
// against the definition of an allowed token (a copy of the matcher accepts it) on every step of
// seeded random walks, over a vocabulary built to cross every boundary the caches reason about:
// tokens that end a string and go on, that end inside a multi-byte character, that hold several
// characters of whitespace, that close the root.
#include <algorithm>
#include <cstring>
#include <random>

#include "grammar/grammar.h"
#include "grammar/token_matcher.h"
#include "test_util.h"

using namespace sluice::grammar;

namespace {

// A JSON grammar written the way xgrammar prints one (groups, classes, stars, a lookahead),
// plus bounded repetition and `+`/`?`, which the reader lowers itself.
const char* kJson = R"(
root ::= ws value ws
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ( ws "," ws value ){0,3} )? ws "]"
string ::= "\"" chars (= [ \n\t]* [,}\]:])
chars ::= "\"" | [^\0-\x1f\"\\] chars | "\\" escape chars
escape ::= [\"\\/bfnrt] | "u" [0-9a-fA-F]{4}
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [+\-]? [0-9]+ )?
ws ::= [ \n\t]{0,3}
)";

std::string utf8(const char* s) { return std::string(s); }

/** Appends `count` random strings of `lo`..`hi` characters drawn from `alphabet`. */
void add_random_strings(std::vector<std::string>& v, std::mt19937& rng, const std::string& alphabet, int lo, int hi, int count) {
  std::uniform_int_distribution<int> len(lo, hi);
  std::uniform_int_distribution<int> pick(0, int(alphabet.size()) - 1);
  for (int k = 0; k < count; k++) {
    std::string s;
    for (int n = len(rng); n > 0; n--) s += alphabet[pick(rng)];
    v.push_back(s);
  }
}

/** A vocabulary of single bytes, JSON fragments and UTF-8 pieces; the last id is the stop token. */
std::vector<std::string> test_vocabulary(std::mt19937& rng) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; b++) v.push_back(std::string(1, char(b)));  // id = the byte
  for (const char* s : {"{\"", "\":", "\",", "\"}", "\"]", "\"\"", "\", \"", "\"}}", "\"]}", "}]", "]}", "},{", "true",
                        "null", "false", "fal", "se", "  ", "   ", "    ", " \"", "\\\"", "\\u", "00e9", "12", "3.5", "e+10", "-0",
                        "01", "\",\n", "\"\n}", "ab\"", "x\": ", "\": \"", "\": [", "\": {", "[]", "{}", "\"a", "a\"", "\\n"}) {
    v.push_back(s);
  }
  for (const char* s : {"\xc3\xa9", "\xc3", "\xa9", "\xe4\xb8\xad", "\xe4\xb8", "\xad", "\xe0", "\xe0\xa0", "\xa0\x80", "\x80",
                        "\xed", "\xed\x9f", "\xed\xa0", "\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80", "\xf4\x90", "\xf4\x8f",
                        "\xbf", "\xc0\x80", "\xe9\"", "\xa9\":"}) {
    v.push_back(utf8(s));
  }
  add_random_strings(v, rng, "ab\"{}[],: 0123-.eE\\u\n", 2, 6, 400);
  v.push_back("");  // the stop token
  return v;
}

bool bit(const std::vector<uint32_t>& mask, size_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/** Feeds text one byte token at a time (the vocabulary's first 256 ids are the bytes). */
bool accepts_text(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  TokenMatcher m(g);
  for (unsigned char c : text) {
    if (!m.accept(int32_t(c))) return false;
  }
  return m.can_end();
}

}  // namespace

TEST_CASE(grammar_reader_refuses_what_it_cannot_match) {
  auto throws = [](const char* text) {
    try {
      parse_grammar(text);
    } catch (const GrammarError&) {
      return true;
    }
    return false;
  };
  CHECK(!throws(kJson));
  CHECK(throws("root ::= missing"));               // undefined rule
  CHECK(throws("root ::= root \"a\" | \"b\""));    // left recursion
  CHECK(throws("root ::= x \"a\"\nx ::= \"\" | root"));  // left recursion through a nullable rule
  CHECK(throws("root ::= [\xc3\xa9]"));            // a class with a non-ASCII character
  CHECK(throws("root ::= \"a"));                   // unterminated string
  CHECK(throws("other ::= \"a\""));                // no root
  CHECK(throws("root ::= \"a\"{3,2}"));            // reversed bounds
  CHECK(throws("root ::= (\"ab\"){0,2000}"));      // an optional range wider than is unrolled
  CHECK(!throws("root ::= \"a\"{0,2000}"));        // ... unless one class: counted, not unrolled
  CHECK(throws("root ::= \"a\"{100001}"));         // a count past the bound
  CHECK(throws("root ::= (\"ab\"{1024}){1024}"));  // nested repetitions past the element bound
  CHECK(!throws("root ::= (\"a\"{1024}){1024}"));  // ... unless one class: a run of 1,048,576
  CHECK(!throws("root ::= (\"ab\"){50000}"));      // a large count is built by halving, not unrolled
}

TEST_CASE(grammar_large_repetition_counts_match_exactly) {
  // Counts past the unrolling bound are built by halving (E(2k) ::= E(k) E(k), ...); the language
  // must be exactly the same as unrolling would give.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; b++) tokens.push_back(std::string(1, char(b)));
  for (const char* t : {"ab", "abab", "aba", "ba", "bc", "abc", "ababab"}) tokens.push_back(t);
  tokens.push_back("");  // stop
  const int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int k = 0; k < n; k++) out += s;
    return out;
  };
  auto exact = std::make_shared<CompiledGrammar>(parse_grammar("root ::= (\"ab\"){3001} \"c\""), vocab);
  CHECK(accepts_text(exact, repeat("ab", 3001) + "c"));
  CHECK(!accepts_text(exact, repeat("ab", 3000) + "c"));
  CHECK(!accepts_text(exact, repeat("ab", 3002) + "c"));
  auto ranged = std::make_shared<CompiledGrammar>(parse_grammar("root ::= \"x\"{2000,2100}"), vocab);
  for (int n : {1999, 2000, 2050, 2100, 2101}) CHECK(accepts_text(ranged, repeat("x", n)) == (n >= 2000 && n <= 2100));
  // Masks over multi-copy tokens agree with token-by-token acceptance on seeded walks to the end.
  std::mt19937 rng(3);
  std::vector<uint32_t> mask(vocab->words());
  int mismatches = 0, ended = 0;
  for (int walk = 0; walk < 3; walk++) {
    TokenMatcher m(exact);
    for (int step = 0; step < 4000 && !m.ended(); step++) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < tokens.size(); id++) {
        TokenMatcher copy = m;
        bool ok = copy.accept(int32_t(id));
        if (ok != bit(mask, id)) mismatches++;
        if (ok) allowed.push_back(int32_t(id));
      }
      CHECK(!allowed.empty());
      if (allowed.empty()) break;
      CHECK(m.accept(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]));
    }
    ended += m.ended();
  }
  CHECK(mismatches == 0);
  CHECK(ended == 3);
}

TEST_CASE(grammar_matcher_accepts_exactly_the_language) {
  std::mt19937 rng(7);
  auto tokens = test_vocabulary(rng);
  int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(kJson), vocab);
  for (const char* ok : {"{}", " [1, 2.5e+3, -0, \"x\"] ", "{\"a\": {\"b\": [true, false, null]}}", "\"\\u00e9\\n\"",
                         "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\"", "[[[[]]]]", "[1,2,3,4]", "0", "-12.5E10"}) {
    CHECK(accepts_text(g, ok));
  }
  for (const char* bad : {"{", "[1,2,3,4,5]", "01", "\"\\x\"", "{\"a\" 1}", "[1,]", "\"\xed\xa0\x80\"", "\"\xe0\x80\x80\"",
                          "\"\xc0\x80\"", "    1", "tru", "\"a\"b", "1 2"}) {
    CHECK(!accepts_text(g, bad));
  }
}

TEST_CASE(grammar_masks_match_token_by_token_checks_on_random_walks) {
  std::mt19937 rng(11);
  auto tokens = test_vocabulary(rng);
  int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(kJson), vocab);
  std::vector<uint32_t> mask(vocab->words());
  int steps = 0, mismatches = 0, walks_ended = 0;
  for (int walk = 0; walk < 60; walk++) {
    TokenMatcher m(g);
    for (int step = 0; step < 80; step++) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < tokens.size(); id++) {
        TokenMatcher copy = m;
        bool ok = copy.accept(int32_t(id));
        if (ok != bit(mask, id)) {
          if (mismatches++ < 5) {
            std::printf("    walk %d step %d token %zu '%s': mask %d, accept %d\n", walk, step, id, tokens[id].c_str(),
                        int(bit(mask, id)), int(ok));
          }
        }
        if (ok) allowed.push_back(int32_t(id));
      }
      for (size_t id = tokens.size(); id < mask.size() * 32; id++) CHECK(!bit(mask, id));
      steps++;
      CHECK(!allowed.empty());  // the grammar never leaves a walk stranded
      if (allowed.empty()) break;
      // Lean towards the stop token once allowed, so that walks end as well as run long.
      int32_t next = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (m.can_end() && step > 20) next = stop;
      CHECK(m.accept(next));
      if (next == stop) {
        walks_ended++;
        CHECK(m.ended());
        m.fill_mask(mask.data());
        for (uint32_t w : mask) CHECK(w == 0);  // nothing after the stop token
        break;
      }
    }
  }
  std::printf("    %d steps, %d walks ended, %d mismatches\n", steps, walks_ended, mismatches);
  CHECK(mismatches == 0);
  CHECK(walks_ended > 0);
}

TEST_CASE(grammar_matcher_refuses_a_token_and_keeps_its_state) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"{", "}", "x", "{}", ""}, std::vector<int32_t>{4});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar("root ::= \"{\" \"}\""), vocab);
  TokenMatcher m(g);
  CHECK(!m.accept(2));  // x
  CHECK(!m.accept(4));  // stop before the end
  CHECK(m.accept(0));   // {
  CHECK(!m.accept(3));  // {} cannot follow {
  CHECK(m.accept(1));   // }
  CHECK(m.can_end());
  CHECK(!m.accept(1));
  CHECK(m.accept(4));
  CHECK(m.ended());
}

// Speculative decoding: the masks after each prefix of some drafts, and how many of them the
// grammar accepts, equal what accepting them one by one gives; the matcher's state is unchanged
// (its next mask and accepts are those of a matcher that never looked ahead), on random walks.
TEST_CASE(grammar_lookahead_masks_equal_accepting_one_by_one) {
  std::mt19937 rng(23);
  auto tokens = test_vocabulary(rng);
  const int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(kJson), vocab);
  const size_t words = vocab->words();
  int checked = 0, refused_midway = 0, stopped = 0;
  for (int walk = 0; walk < 30; walk++) {
    TokenMatcher m(g), twin(g);  // twin never looks ahead
    std::vector<uint32_t> mask(words), twin_mask(words);
    for (int step = 0; step < 40; step++) {
      // Drafts: allowed tokens mostly, a refused one now and then, the stop token when allowed.
      std::vector<int32_t> drafts;
      {
        TokenMatcher probe = m;
        for (int j = 0; j < 5; j++) {
          std::vector<uint32_t> pm(words);
          probe.fill_mask(pm.data());
          std::vector<int32_t> ok;
          for (size_t id = 0; id < tokens.size(); id++)
            if (bit(pm, id)) ok.push_back(int32_t(id));
          int32_t t = ok.empty() || rng() % 6 == 0 ? int32_t(rng() % tokens.size())
                                                   : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
          drafts.push_back(t);
          if (!probe.accept(t)) break;
        }
      }
      const int64_t n = int64_t(drafts.size());
      // Expected: one by one on a copy.
      TokenMatcher copy = m;
      int64_t accepted = 0;
      std::vector<uint32_t> expect(size_t(n + 1) * words, 0xffffffffu);
      bool live = true;
      for (int64_t j = 0; j <= n; j++) {
        if (live && !copy.ended()) copy.fill_mask(expect.data() + size_t(j) * words);
        if (j < n && live && !copy.ended()) {
          live = copy.accept(drafts[size_t(j)]);
          if (live) accepted++;
        }
      }
      if (accepted < n && !copy.ended()) refused_midway++;
      if (copy.ended()) stopped++;
      CHECK(m.count_ahead(drafts.data(), n) == accepted);
      std::vector<uint32_t> got(size_t(n + 1) * words, 0);
      m.fill_masks_ahead(drafts.data(), n, got.data());
      CHECK(got == expect);
      checked++;
      // Unchanged: the same mask as the twin, then advance both with one allowed token.
      m.fill_mask(mask.data());
      twin.fill_mask(twin_mask.data());
      CHECK(mask == twin_mask);
      std::vector<int32_t> ok;
      for (size_t id = 0; id < tokens.size(); id++)
        if (bit(mask, id) && int32_t(id) != stop) ok.push_back(int32_t(id));
      if (ok.empty()) break;
      const int32_t next = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      CHECK(m.accept(next));
      CHECK(twin.accept(next));
    }
  }
  std::printf("    %d lookaheads, %d refused midway, %d through a stop token\n", checked, refused_midway, stopped);
  CHECK(refused_midway > 0);
  CHECK(stopped > 0);
}

TEST_CASE(grammar_deep_nesting_keeps_the_arena_bounded) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"[", "]", ""}, std::vector<int32_t>{2});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar("root ::= \"[\" root? \"]\""), vocab);
  TokenMatcher m(g);
  for (int k = 0; k < 20000; k++) CHECK(m.accept(0));
  for (int k = 0; k < 20000; k++) CHECK(m.accept(1));
  CHECK(m.can_end());
  CHECK(!m.accept(1));
}

TEST_CASE(grammar_mask_is_reused_while_the_stacks_stay_and_recomputed_when_they_move) {
  std::mt19937 rng(5);
  auto tokens = test_vocabulary(rng);
  int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(kJson), vocab);
  // Into a string of an array: five plain characters bring the stacks back to the same state each
  // time, so one mask serves all five steps; a character split over two tokens passes through a
  // state of its own (a mask computed) and comes back (computed again: one mask is kept). Every
  // mask equals a fresh matcher's at the same point.
  TokenMatcher m(g);
  std::vector<int32_t> walk;
  std::vector<uint32_t> mask(vocab->words()), fresh_mask(vocab->words());
  auto step = [&](int32_t t) {
    CHECK(m.accept(t));
    walk.push_back(t);
  };
  auto fill_and_compare = [&] {
    m.fill_mask(mask.data());
    TokenMatcher fresh(g);
    for (int32_t t : walk) CHECK(fresh.accept(t));
    fresh.fill_mask(fresh_mask.data());
    CHECK(mask == fresh_mask);
  };
  step('[');
  step('"');
  const size_t before = m.masks_computed();
  for (int k = 0; k < 5; k++) {
    fill_and_compare();
    step('a');
  }
  CHECK(m.masks_computed() - before == 1);
  step(0xc3);  // the byte token: half of U+00E9
  fill_and_compare();
  CHECK(!bit(mask, '"') && bit(mask, 0xa9) && !bit(mask, 'a'));
  step(0xa9);
  fill_and_compare();
  CHECK(m.masks_computed() - before == 3);
  // Leaving the string moves the stacks: the next mask is computed and allows what follows a value.
  step('"');
  fill_and_compare();
  CHECK(m.masks_computed() - before == 4);
  CHECK(bit(mask, ',') && bit(mask, ']') && !bit(mask, 'a'));
}

TEST_CASE(grammar_mask_within_a_budget_is_the_mask_or_nothing) {
  std::mt19937 rng(9);
  auto tokens = test_vocabulary(rng);
  int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(kJson), vocab);
  std::vector<uint32_t> mask(vocab->words()), want(vocab->words());
  // Inside a string of an array: the string rule is used from several places, so its quote-closing
  // tokens are walked against the stack (work > 0).
  TokenMatcher m(g), reference(g);
  for (int32_t t : {int32_t('['), int32_t('"'), int32_t('a')}) CHECK(m.accept(t) && reference.accept(t));
  reference.fill_mask(want.data());
  std::fill(mask.begin(), mask.end(), 0xdeadbeefu);
  CHECK(m.fill_mask_within(mask.data(), 0) == -1);  // over budget: nothing written
  for (uint32_t w : mask) CHECK(w == 0xdeadbeefu);
  int64_t work = m.fill_mask_within(mask.data(), 1 << 20);
  CHECK(work > 0);
  CHECK(mask == want);
  CHECK(m.fill_mask_within(mask.data(), 0) == 0);  // unchanged since: copied, whatever the budget
  CHECK(mask == want);
  // Mid-character, at a position whose cache is compiled on first use: not ready, so -1 until a
  // full fill_mask has compiled it; then the same mask within a budget.
  TokenMatcher mid(g);
  for (int32_t t : {int32_t('['), int32_t('"'), int32_t(0xe4)}) CHECK(mid.accept(t));
  if (mid.fill_mask_within(mask.data(), 1 << 20) == -1) {
    TokenMatcher(mid).fill_mask(want.data());
    TokenMatcher again = mid;
    CHECK(again.fill_mask_within(mask.data(), 1 << 20) >= 0);
    CHECK(mask == want);
  } else {
    CHECK(false);  // a fresh grammar has compiled no mid-character position
  }
}

TEST_CASE(grammar_masks_stay_right_across_arena_compaction) {
  // 70,000 nested brackets push past the arena size at which frames are compacted (65,536); a mask
  // is asked at every depth, and after compaction each must still be exactly {"[", "]"}, then
  // closing them all leaves only the stop token.
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"[", "]", "x", ""}, std::vector<int32_t>{3});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar("root ::= \"[\" root? \"]\""), vocab);
  TokenMatcher m(g);
  std::vector<uint32_t> mask(vocab->words());
  int wrong = 0;
  for (int k = 0; k < 70000; k++) {
    CHECK(m.accept(0));
    m.fill_mask(mask.data());
    if (mask[0] != 0x3u) wrong++;
  }
  for (int k = 0; k < 70000; k++) {
    CHECK(m.accept(1));
    m.fill_mask(mask.data());
    // Only "]" while brackets are open (the inner root is done); closed, the stop token alone.
    if (mask[0] != (k + 1 < 70000 ? 0x2u : 0x8u)) wrong++;
  }
  CHECK(wrong == 0);
}

namespace {

/** The counted elements of the root rule as (min, max) pairs, max -1 for no bound. */
std::vector<std::pair<long, long>> counted_runs(const Grammar& g) {
  std::vector<std::pair<long, long>> out;
  for (uint32_t start : g.alts[size_t(g.root)]) {
    for (uint32_t i = start; g.elems[i].kind != ElemKind::kEnd; i++) {
      const Element& e = g.elems[i];
      if (e.counted) out.emplace_back(long(e.min_count), e.max_count == kUnboundedCount ? -1L : long(e.max_count));
    }
  }
  return out;
}

/** A JSON string class run the way xgrammar 0.1.27 prints `^[^\x00-\x1f"\\]{lo,hi}$` for hi > 128. */
std::string xgrammar_string_run(int lo, int hi) {
  const std::string cls = "[^\\0-\\x1f\\\"\\\\]";
  std::string g = "root ::= ((\"\\\"\" string_128 \"\\\"\"))\n";
  if (lo == 0) {
    for (int k = 1; k <= 127; k++) {
      g += "string_" + std::to_string(k) + " ::= (\"\" | (" + cls + (k < 127 ? " string_" + std::to_string(k + 1) : std::string()) + "))\n";
    }
  }
  g += "string_repeat_1 ::= ((" + cls + ")) (=(" + cls + " " + cls + "))\n";
  g += "string_repeat_1_inner ::= ((string_repeat_1{" + std::to_string(std::max(lo, 128) - 128) + ", " + std::to_string(hi - 128) + "}))\n";
  std::string tail;
  for (int k = 0; k < 128; k++) tail += " " + cls;
  g += "string_128 ::= (" + std::string(lo == 0 ? "(string_1) | " : "") + "(string_repeat_1_inner" + tail + "))\n";
  return g;
}

/**
 * A vocabulary for counted runs: the bytes, runs of 2..40 letters, runs ending in a quote or a
 * comma, multi-byte characters whole and split, and a long run of 70 letters (more than the
 * tagged walk tells apart: checked at mask time).
 */
std::vector<std::string> run_vocabulary(std::mt19937& rng) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; b++) v.push_back(std::string(1, char(b)));
  for (int n : {2, 3, 4, 5, 6, 7, 8, 11, 16, 23, 40}) {
    v.push_back(std::string(size_t(n), 'a'));
    v.push_back(std::string(size_t(n), 'b') + "\"");
    v.push_back(std::string(size_t(n - 1), 'c') + "\",");
    v.push_back(std::string(size_t(n), 'a') + "x");
  }
  v.push_back(std::string(70, 'a'));
  v.push_back(std::string(70, 'a') + "\"");
  for (const char* s : {"\xc3\xa9", "\xc3", "\xa9", "\xe4\xb8\xad", "\xe4\xb8", "\xad", "\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80",
                        "a\xc3\xa9", "\xc3\xa9\xc3\xa9\xc3", "\xa9\"", "\xad\xe4\xb8\xad\"", "\"\"", "\",\"", "\"]", "\"}", "ab\",\"cd",
                        "x\"", "xx", "xxx", "a.", "b.", ".", "ab,", ",a", "[\"", "\"a"}) {
    v.push_back(s);
  }
  add_random_strings(v, rng, "abcx\",.[]", 2, 9, 300);
  v.push_back("");  // the stop token
  return v;
}

/**
 * Seeded random walks over `g`: at every step the mask must equal token-by-token acceptance
 * (each token tried on a copy of the matcher). `prefer`: a token taken first when allowed (to
 * run a counted element to its bound), with probability 3/4. Returns the mismatches.
 */
int walk_and_compare(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<std::string>& tokens, int walks,
                     int max_steps, uint32_t seed, int32_t prefer = -1) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(g->vocab().words());
  const int32_t stop = int32_t(tokens.size() - 1);
  int mismatches = 0;
  for (int walk = 0; walk < walks; walk++) {
    TokenMatcher m(g);
    for (int step = 0; step < max_steps && !m.ended(); step++) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < tokens.size(); id++) {
        TokenMatcher copy = m;
        bool ok = copy.accept(int32_t(id));
        if (ok != bit(mask, id)) {
          if (mismatches++ < 5) {
            std::printf("    walk %d step %d token %zu '%s': mask %d, accept %d\n", walk, step, id, tokens[id].c_str(),
                        int(bit(mask, id)), int(ok));
          }
        }
        if (ok) allowed.push_back(int32_t(id));
      }
      if (allowed.empty()) {
        std::printf("    walk %d step %d: no token allowed\n", walk, step);
        mismatches++;
        break;
      }
      int32_t next = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (prefer >= 0 && bit(mask, size_t(prefer)) && rng() % 4 != 0) next = prefer;
      if (m.can_end() && rng() % 3 == 0) next = stop;
      CHECK(m.accept(next));
    }
  }
  return mismatches;
}

}  // namespace

TEST_CASE(grammar_runs_of_one_class_are_read_as_counted_elements) {
  // {m,n} of a class, a sequence of one class, xgrammar's chains and its split long repeats:
  // each one counted element with the exact bounds.
  auto runs = [](const std::string& text) { return counted_runs(parse_grammar(text)); };
  using R = std::vector<std::pair<long, long>>;
  CHECK(runs("root ::= \"\\\"\" [^\"\\\\]{0,1000} \"\\\"\"") == (R{{0, 1000}}));
  CHECK(runs("root ::= [a-z] [a-z] [a-z] [a-z]{2,5} [a-z]") == (R{{6, 9}}));
  CHECK(runs("root ::= [a-z]* [a-z]{772} [a-z]{128}") == (R{{900, -1}}));
  CHECK(runs("root ::= [0-9]{2,3}").empty());  // short runs stay unrolled
  CHECK(runs("root ::= [a-z] [a-z] [a-z] [a-z] [a-z] s\ns ::= \"\" | [a-z] s") == (R{{5, -1}}));  // xgrammar's C{5,}
  CHECK(runs("root ::= (\"ab\"){5}").empty());  // not one class
  CHECK(runs("root ::= r1\nr1 ::= \"\" | [a-z] r2\nr2 ::= \"\" | [a-z] r3\nr3 ::= \"\" | [a-z] r4\nr4 ::= \"\" | [a-z]") == (R{{0, 4}}));
  CHECK(runs("root ::= [a-z]{0,3} | [a-z]{5,9}") == (R{{5, 9}}));  // a gap (4): two alternatives
  CHECK(runs("root ::= [a-z]{0,3} | [a-z]{4,9}") == (R{{0, 9}}));  // no gap: one run
  CHECK(runs(xgrammar_string_run(0, 1000)) == (R{{0, 1000}}));
  CHECK(runs(xgrammar_string_run(900, 1000)) == (R{{900, 1000}}));
  CHECK(runs(xgrammar_string_run(1000, 1000)) == (R{{1000, 1000}}));
}

TEST_CASE(grammar_counted_runs_accept_exactly_their_lengths) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; b++) tokens.push_back(std::string(1, char(b)));
  tokens.push_back("");
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{int32_t(tokens.size() - 1)});
  auto str = [](size_t n, const std::string& unit) {
    std::string s = "\"";
    for (size_t k = 0; k < n; k++) s += unit;
    return s + "\"";
  };
  auto g = std::make_shared<CompiledGrammar>(parse_grammar(xgrammar_string_run(900, 1000)), vocab);
  for (size_t n : {0, 1, 899, 900, 901, 999, 1000, 1001}) {
    CHECK(accepts_text(g, str(n, "a")) == (n >= 900 && n <= 1000));
    CHECK(accepts_text(g, str(n, "\xe4\xb8\xad")) == (n >= 900 && n <= 1000));  // code points, not bytes
  }
  CHECK(!accepts_text(g, str(950, "a").insert(500, "\"")));
  CHECK(!accepts_text(g, str(950, "a").insert(500, "\xed\xa0\x80")));  // a surrogate is no character
  auto open = std::make_shared<CompiledGrammar>(parse_grammar("root ::= [a-c]{5,} \".\""), vocab);
  for (size_t n : {4, 5, 6, 2000}) CHECK(accepts_text(open, std::string(n, 'b') + ".") == (n >= 5));
}

TEST_CASE(grammar_counted_masks_match_token_by_token_checks) {
  std::mt19937 rng(17);
  auto tokens = run_vocabulary(rng);
  const int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  const char* cls = "[^\\0-\\x1f\\\"\\\\]";
  struct Case {
    std::string text;
    int32_t prefer;  // a token that runs the count up
  };
  const int32_t aaaa = 256 + 4 * 2;  // "aaaa" (n = 4 in run_vocabulary)
  std::vector<Case> cases = {
      {std::string("root ::= \"\\\"\" ") + cls + "{0,12} \"\\\"\"", aaaa},
      {std::string("root ::= \"\\\"\" ") + cls + "{5,9} \"\\\"\"", aaaa},
      {std::string("root ::= \"\\\"\" ") + cls + "{30,45} \"\\\"\"", aaaa},
      {std::string("root ::= \"\\\"\" ") + cls + "{75,80} \"\\\"\"", aaaa},  // the 70-letter token: checked at mask time
      {"root ::= [a-c]{4,} \".\"", aaaa},
      {"root ::= [ab]{0,5} [a-c]* \".\"", 'a'},  // the run's end is ambiguous
      {"root ::= \"x\"{4,7} \".\"", 'x'},        // a byte class
      // A run inside a rule used from several places: its end is checked against the stack below.
      {"root ::= \"[\" item (\",\" item){0,3} \"]\"\nitem ::= \"\\\"\" [a-c]{2,6} \"\\\"\"", 'a'},
      {"root ::= item (\",\" root)?\nitem ::= [^,.\\\"\\\\\\0-\\x1f]{1,5} | \"x\"", 'a'},
      {xgrammar_string_run(0, 200), aaaa},
      {xgrammar_string_run(150, 160), aaaa},
  };
  int total = 0;
  for (size_t k = 0; k < cases.size(); k++) {
    auto g = std::make_shared<CompiledGrammar>(parse_grammar(cases[k].text), vocab);
    const auto& elems = g->grammar().elems;
    CHECK(std::any_of(elems.begin(), elems.end(), [](const Element& e) { return e.counted; }));
    int mismatches = walk_and_compare(g, tokens, 12, 90, uint32_t(100 + k), cases[k].prefer);
    if (mismatches != 0) std::printf("    case %zu: %d mismatches\n", k, mismatches);
    total += mismatches;
  }
  CHECK(total == 0);
}

TEST_CASE(grammar_counted_masks_at_every_count_near_the_bounds) {
  // Single letters up to each count around min and max: at each, the mask equals token-by-token
  // acceptance (the buckets near the bounds, and the shared one in the middle).
  std::mt19937 rng(23);
  auto tokens = run_vocabulary(rng);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{int32_t(tokens.size() - 1)});
  const char* cls = "[^\\0-\\x1f\\\"\\\\]";
  for (const std::string& text : {std::string("root ::= \"\\\"\" ") + cls + "{50,120} \"\\\"\" \",\"?",
                                   std::string("root ::= \"\\\"\" ") + cls + "{0,60} \"\\\"\""}) {
    auto g = std::make_shared<CompiledGrammar>(parse_grammar(text), vocab);
    std::vector<uint32_t> mask(vocab->words());
    TokenMatcher m(g);
    CHECK(m.accept('"'));
    int mismatches = 0;
    for (int n = 0; n <= 121; n++) {
      m.fill_mask(mask.data());
      for (size_t id = 0; id < tokens.size(); id++) {
        TokenMatcher copy = m;
        if (copy.accept(int32_t(id)) != bit(mask, id)) mismatches++;
      }
      if (!m.accept(n % 7 == 3 ? 0xc3 : n % 7 == 4 ? 0xa9 : 'a')) break;  // now and then a character over two tokens
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE(grammar_counted_compile_does_not_grow_with_the_count) {
  std::mt19937 rng(29);
  auto tokens = run_vocabulary(rng);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{int32_t(tokens.size() - 1)});
  auto positions = [&](int n) {
    return CompiledGrammar(parse_grammar(xgrammar_string_run(0, n)), vocab).positions();
  };
  const size_t small = positions(200), large = positions(100000);
  std::printf("    caches compiled: %zu at maxLength 200, %zu at 100000\n", small, large);
  CHECK(small == large);
  CHECK(large < 100);  // the longest run in a token is 40 letters: about 40 buckets
}

namespace {

/** A vocabulary for e-mail-like text: the bytes, pieces that cross '@', '.' and the closing quote, random strings. */
std::vector<std::string> email_vocabulary(std::mt19937& rng) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; b++) v.push_back(std::string(1, char(b)));
  for (const char* s : {"ab", "a.b", "ab.", ".ab", "a@", "@a", "a@b", "a.b.c", "ab\"", "b\",", "a\"]", "\",\"", "a-b", "-a", "a-",
                        "b.a\"", "ab.ab.", "@ab.c", "\"a", "[\"", "\"]", "a..b", "x\"", "ba@ab.a\""}) {
    v.push_back(s);
  }
  add_random_strings(v, rng, "ab.-@\",[]x", 2, 7, 300);
  v.push_back("");  // the stop token
  return v;
}

}  // namespace

TEST_CASE(grammar_recursive_and_factored_rules_match_token_by_token_checks) {
  // Rules as xgrammar prints `X+` (r ::= X r | X), alternatives that begin alike, tail references
  // in cycles: the reader factors and inlines them and the compiler follows tail references to
  // the one place a rule is used from; the masks must stay exact, including where a rule is used
  // from several places (its context unknown) and where a tail reference meets a concrete one.
  std::mt19937 rng(23);
  auto tokens = email_vocabulary(rng);
  const int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  const std::vector<std::string> cases = {
      // ajv's e-mail format as the pattern rewriting prints it.
      "root ::= \"[\" (email (\",\" email){0,3})? \"]\"\n"
      "email ::= \"\\\"\" local dots \"@\" domain [a-b] label \"\\\"\"\n"
      "local ::= [a-b\\-] local | [a-b\\-]\nlocal2 ::= [a-b\\-] local2 | [a-b\\-]\ndots ::= \"\" | \".\" local2 dots\n"
      "label ::= \"\" | [a-b\\-]* [a-b]\ndomain ::= [a-b] label \".\" domain | [a-b] label \".\"",
      // The same rule reached by a tail cycle and from two concrete places.
      "root ::= \"(\" r \")\" \"[\" r \"]\"\nr ::= \"a\" r2\nr2 ::= \"\" | r | \"b\" r",
      // A tail reference and a concrete one with different continuations.
      "root ::= w \"x\" | \"@\" w\nw ::= [a-b] w | \".\"",
      // Alternatives sharing a prefix of references, one of them the whole of another.
      "root ::= s \",\" s | s \"]\" | s\ns ::= \"\\\"\" [a-b.]* \"\\\"\"",
      // `(X ",")+` of a rule used twice.
      "root ::= \"[\" items \"]\" \"@\" items\nitems ::= item \",\" items | item \",\"\nitem ::= [a-b] [a-b.]*",
  };
  int total = 0;
  for (size_t k = 0; k < cases.size(); k++) {
    auto g = std::make_shared<CompiledGrammar>(parse_grammar(cases[k]), vocab);
    int mismatches = walk_and_compare(g, tokens, 16, 60, uint32_t(300 + k));
    if (mismatches != 0) std::printf("    case %zu: %d mismatches\n", k, mismatches);
    total += mismatches;
  }
  CHECK(total == 0);
  // `r ::= [ab] r | [ab]` is one run of the class (at least one), not a recursive rule.
  const Grammar plus = parse_grammar("root ::= \"x\" r\nr ::= [ab] r | [ab]");
  std::vector<Element> root_elems;
  for (uint32_t e = plus.alts[size_t(plus.root)][0]; plus.elems[e].kind != ElemKind::kEnd; e++) root_elems.push_back(plus.elems[e]);
  CHECK(root_elems.size() == 3 && !root_elems[1].star && root_elems[2].star && root_elems[1].set == root_elems[2].set);
}

TEST_CASE(grammar_mask_is_reused_when_a_run_re_enters_what_follows_it) {
  // After each letter of `[a-b]*`, what follows (`opt "!"`) is entered again, pushing the frame for
  // "!" below opt: the same frame is found, not a new one, so the stacks compare equal and the
  // mask is reused.
  std::mt19937 rng(29);
  auto tokens = email_vocabulary(rng);
  const int32_t stop = int32_t(tokens.size() - 1);
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{stop});
  auto g = std::make_shared<CompiledGrammar>(parse_grammar("root ::= \"[\" v \"]\"\nv ::= [a-b]* opt \"!\"\nopt ::= \"\" | \"@\" | \"x\" opt"), vocab);
  TokenMatcher m(g);
  std::vector<uint32_t> mask(vocab->words());
  CHECK(m.accept('['));
  CHECK(m.accept('a'));
  m.fill_mask(mask.data());
  const size_t before = m.masks_computed();
  for (int k = 0; k < 6; k++) {
    CHECK(m.accept(k % 2 == 0 ? 'b' : 'a'));
    m.fill_mask(mask.data());
  }
  CHECK(m.masks_computed() == before);
  CHECK(bit(mask, 'a') && bit(mask, '@') && bit(mask, 'x') && bit(mask, '!') && !bit(mask, ']'));
}

int main() { return sluice_test::run_all("grammar"); }
