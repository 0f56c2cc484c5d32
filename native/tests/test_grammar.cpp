// The grammar reader and the token matcher. The masks the per-position caches give are checked
// against the definition of an allowed token (a copy of the matcher accepts it) on every step of
// seeded random walks, over a vocabulary built to cross every boundary the caches reason about:
// tokens that end a string and go on, that end inside a multi-byte character, that hold several
// characters of whitespace, that close the root.
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
  const char alphabet[] = "ab\"{}[],: 0123-.eE\\u\n";
  std::uniform_int_distribution<int> len(2, 6), pick(0, int(sizeof(alphabet)) - 2);
  for (int k = 0; k < 400; k++) {
    std::string s;
    for (int n = len(rng); n > 0; n--) s += alphabet[pick(rng)];
    v.push_back(s);
  }
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
  CHECK(throws("root ::= \"a\"{0,2000}"));         // an optional range wider than is unrolled
  CHECK(throws("root ::= \"a\"{100001}"));         // a count past the bound
  CHECK(throws("root ::= (\"a\"{1024}){1024}"));   // nested repetitions past the element bound
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

int main() { return sluice_test::run_all("grammar"); }
