// Grammar-constrained decoding: which tokens of a vocabulary may come next, as a bitmask, and
// advancing with the token sampled.
//
// A matcher's state is a set of parse stacks (persistent: frames live in an arena and point at
// their parent), each topped by a position that consumes a byte. Tokens are byte strings; a token
// is allowed when some stack can consume all of its bytes.
//
// Checking 150k tokens a step against the stacks would take milliseconds, so compiling a grammar
// walks the whole vocabulary (sorted, sharing prefixes) once from every byte-consuming position
// of every rule. Below the position lies its rule's static context: while a rule is referenced
// from one place only (as the many small rules of a JSON schema's grammar are), what follows it
// is known, and the walk goes on into it; the first rule referenced from several places (or
// recursively) is where knowledge ends. A reference last in its alternative (a tail reference)
// is no place of its own: what follows it is what follows the rule holding it, so `r ::= X r | X`
// used once keeps that one use's context. Each token is sorted into
//   - accepted: its bytes fit inside that context (whatever follows it),
//   - rejected: every path dies inside it,
//   - uncertain: the context can end partway through the token, so the rest (its "suffix")
//     depends on the stack below: those are kept, sorted by suffix.
// A step's mask is then the union, over the stacks' top positions, of the accepted set and the
// uncertain tokens whose suffix the rest of that stack accepts; the suffixes are walked in sorted
// order, so a shared prefix is checked once and a dead prefix skips every suffix under it.
//
// Counted elements (C{m,n}, grammar.h) keep their count in the stack's top. What a token does from
// a count k depends only on need = max(0, m - k) and rem = n - k, each clamped to B, one more than
// the most characters of the class a token can hold (about 34 at Qwen2.5's vocabulary): the
// positions of a long run share one cache and only the last B or so differ. All of those caches come
// from one walk over the vocabulary that tags each way through a token with the count it left the
// element at (see CountedCaches); a token with 64 or more characters of the class is checked at
// mask time instead (never in practice).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace sluice::grammar {

/** A model's vocabulary as byte strings, sorted and indexed for matching. */
class TokenVocabulary {
 public:
  /** tokens[id]: the token's bytes ("" = never allowed); stop_ids: allowed once the output is complete. */
  TokenVocabulary(std::vector<std::string> tokens, std::vector<int32_t> stop_ids);

  size_t size() const { return tokens_.size(); }
  /** 32-bit words in a mask. */
  size_t words() const { return (tokens_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return tokens_[size_t(id)]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool is_stop(int32_t id) const { return id >= 0 && size_t(id) < is_stop_.size() && is_stop_[size_t(id)]; }

  /** Ids of the non-empty tokens in byte order; lcp[i]: bytes token sorted[i] shares with sorted[i-1]. */
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint32_t>& lcp() const { return lcp_; }
  /** sorted[first_[b] .. first_[b + 1]) are the tokens beginning with byte b. */
  uint32_t first(int b) const { return first_[size_t(b)]; }

 private:
  std::vector<std::string> tokens_;
  std::vector<int32_t> stop_ids_;
  std::vector<bool> is_stop_;
  std::vector<int32_t> sorted_;
  std::vector<uint32_t> lcp_;
  std::array<uint32_t, 257> first_{};
};

/** Below the root's frame: the output is complete. */
constexpr int32_t kAcceptParent = -1;
/** Below a position compiled alone: what follows its rule is not known. */
constexpr int32_t kOpenParent = -2;

/** A stack frame: the element to go on at, and the frame below. */
struct Frame {
  uint32_t elem;
  int32_t parent;
};

/** A matcher's frames by content (elem << 32 | parent) -> index in its arena. */
using FrameIndex = std::unordered_map<uint64_t, int32_t>;

/**
 * A stack's top: key = element * 8 + UTF-8 state (bytes still owed by a multi-byte character);
 * count: a counted element's characters matched so far (capped at min_count when it has no upper
 * bound), else 0.
 */
struct Terminal {
  uint32_t key;
  int32_t parent;
  uint32_t count = 0;
  bool operator==(const Terminal& o) const { return key == o.key && parent == o.parent && count == o.count; }
};

struct StackSet {
  std::vector<Terminal> tops;
  bool accepting = false;  // some stack has closed the root
  bool completed = false;  // (compiling) the rule compiled alone has ended
  // Compiling a counted element (tagged walk, see CountedCaches): per top, bit 0 for the element's
  // own run, bit i for the ways that left it after i characters; and the tags that accepted or
  // completed. `overflow`: the run passed the most characters tags can tell apart.
  std::vector<uint64_t> tags;
  uint64_t accepting_tags = 0, completed_tags = 0;
  bool overflow = false;
  void clear() {
    tops.clear();
    tags.clear();
    accepting = completed = overflow = false;
    accepting_tags = completed_tags = 0;
  }
};

/** What compiling found for one position (see the file comment). */
struct PositionCache {
  /**
   * (Counted elements) accepted tokens shared by every position of one class with the same
   * remaining count: those that stay in the run (see CountedCaches). The rest are below.
   */
  std::shared_ptr<const PositionCache> shared;
  /**
   * (Counted elements) the tokens taken whole by leaving the run after need..rem characters:
   * exit_ids[exit_begin, exit_end), a list shared by the element's buckets, sorted by that count.
   */
  std::shared_ptr<const std::vector<int32_t>> exit_ids;
  uint32_t exit_begin = 0, exit_end = 0;
  std::vector<uint32_t> accepted_bits;  // a mask, when many tokens are accepted
  std::vector<int32_t> accepted_ids;    // else the ids
  std::vector<int32_t> uncertain_token;
  std::vector<uint32_t> uncertain_from;  // where in the token its suffix begins
  std::vector<uint32_t> uncertain_lcp;   // bytes this suffix shares with the one before
  /** (Counted elements) tokens checked byte by byte from the top at mask time (see the file comment). */
  std::vector<int32_t> long_tokens;
  size_t bytes() const;
};

/**
 * The caches of a counted element's position at a character's start, one per bucket
 * (min(need, B), min(rem, B)) that some count reaches (see the file comment). A bucket's accepted
 * tokens are those that stay in the run with fewer than rem characters (which depends on the class
 * alone: a mask shared by the grammar's counted elements of that class, one per rem) and those
 * that leave it after need..rem characters and are taken whole by what follows (few: a range of
 * one list per element).
 */
struct CountedCaches {
  uint32_t B = 1;
  std::vector<std::unique_ptr<PositionCache>> by_bucket;  // [cn * (B + 1) + cr]
  bool has_long_tokens = false;
};

class CompiledGrammar {
 public:
  /**
   * Compiles every position of `grammar` against `vocab`. Throws GrammarError past `deadline_ms`
   * (milliseconds on a steady clock, 0 = none) or when the grammar is too ambiguous to match.
   */
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab, int64_t deadline_ms = 0);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  /** The cache of a stack top; one in the middle of a multi-byte character is compiled on first use. */
  const PositionCache& cache(const Terminal& top) const;
  /**
   * The cache of a stack top if it is ready (one in the middle of a character may not be yet, or be
   * compiling on another thread), else null. Never blocks.
   */
  const PositionCache* cache_if_ready(const Terminal& top) const;
  /**
   * What decides a top's mask given its stack below: the top with a counted element's count
   * replaced by its bucket (tops equal here have equal masks), for reusing the last mask.
   */
  Terminal mask_key(const Terminal& top) const;
  /** Memory held by the caches. */
  size_t bytes() const { return bytes_.load(); }
  size_t positions() const { return compiled_.load(); }

 private:
  struct Walk;
  /** Walks the vocabulary from a top (count: its count; tagged: a counted element's tagged walk). */
  Walk walk(uint32_t key, uint32_t count, bool tagged, std::vector<Frame>& arena) const;
  /** A position's cache from a walk (tagged: for bucket (cn, cr), `base` the staying tokens, see compile_counted). */
  std::unique_ptr<PositionCache> make_cache(const Walk& w, uint32_t cn, uint32_t cr, bool tagged,
                                            std::shared_ptr<const PositionCache> base, std::shared_ptr<const std::vector<int32_t>> exit_ids,
                                            uint32_t exit_begin, uint32_t exit_end) const;
  std::unique_ptr<PositionCache> compile_position(uint32_t key, uint32_t count, std::vector<Frame>& arena) const;
  std::unique_ptr<CountedCaches> compile_counted(uint32_t elem, std::vector<Frame>& arena);
  /** A counted top's bucket with clamp B: cn * (B + 1) + cr. */
  uint32_t bucket(const Terminal& top, uint32_t B) const;
  void build_contexts();

  Grammar grammar_;
  /** The rule each element belongs to. */
  std::vector<int32_t> rule_of_;
  /** Frames of the static contexts; per rule, the frame below it (or kOpenParent / kAcceptParent) and how many frames deep. */
  std::vector<Frame> context_frames_;
  std::vector<int32_t> context_parent_;
  std::vector<uint32_t> context_depth_;
  /** Per rule, the rule whose unknown context ends its own (-1: none, it ends at the root's end). */
  std::vector<int32_t> chain_top_;
  /** Per such rule, the bytes that may come first after it, from all the places it is used. */
  std::vector<std::array<uint64_t, 4>> follow_first_;

 public:
  /** Frames of static context below the rule of element `elem` (see the file comment). */
  uint32_t context_depth(uint32_t elem) const { return context_depth_[size_t(rule_of_[elem])]; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<std::unique_ptr<PositionCache>> at_start_;  // by element: positions at a character's start
  std::vector<std::unique_ptr<CountedCaches>> counted_;   // by element: counted ones at a character's start
  /** By class (kind, any_non_ascii, set): per rem, the tokens that stay in a run of it (see CountedCaches). */
  std::unordered_map<std::string, std::vector<std::shared_ptr<const PositionCache>>> staying_;
  /** Clamp of the buckets of counted positions mid-character: the longest token's bytes, plus one. */
  uint32_t mid_char_clamp_ = 1;
  mutable std::mutex lazy_mutex_;
  mutable std::vector<std::unique_ptr<PositionCache>> mid_char_;  // by key, compiled on first use
  // Counted positions mid-character, by key << 32 | bucket (clamp mid_char_clamp_), compiled on first use.
  mutable std::unordered_map<uint64_t, std::unique_ptr<PositionCache>> counted_mid_char_;
  mutable std::atomic<size_t> bytes_{0};
  mutable std::atomic<size_t> compiled_{0};
};

/** One output's position in its grammar. Not thread-safe; one thread at a time. */
class TokenMatcher {
 public:
  explicit TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  /**
   * Writes the allowed next tokens into out[0, words) (bit v of word v/32 = token v). The mask is a
   * function of the stack set alone, so the last one is kept and copied while the stacks are the
   * same: inside a free string (right recursion, no new frame) every token but the first finds the
   * state it left.
   */
  void fill_mask(uint32_t* out);
  /**
   * Copies the last mask into out[0, words) when the stack set has not changed since it was
   * computed (what fill_mask would then do, in microseconds); false, writing nothing, otherwise.
   */
  bool fill_mask_if_unchanged(uint32_t* out);
  /**
   * fill_mask when it is known to be cheap: the last mask still holds, or every top's cache is
   * compiled and the work (suffixes to walk, plus kMaskWordsCost a top whose accepted set is a
   * bitmask) is at most `budget`. Returns the work done (0 for a copied mask), or -1 having written
   * nothing: the caller then fills it where a slow mask does no harm (a pool thread).
   */
  int64_t fill_mask_within(uint32_t* out, size_t budget);
  /** The work fill_mask_within counts for OR-ing one top's accepted bitmask into the mask. */
  static constexpr size_t kMaskWordsCost = 64;
  /** Masks computed (not copied from the last) since the matcher was made; for tests and benches. */
  size_t masks_computed() const { return masks_computed_; }
  /** Advances with a token; false (state unchanged) if the grammar does not allow it. */
  bool accept(int32_t token);
  /**
   * Speculative decoding: how many of tokens[0, n) the grammar accepts one after another from here
   * (a stop token, once accepted, ends the run). The state is left as it was.
   */
  int64_t count_ahead(const int32_t* tokens, int64_t n);
  /**
   * Speculative decoding: the masks after tokens[0, j) for j = 0..n, at out + j * words: what
   * fill_mask would give after accepting them. Past a token the grammar refuses, or after a stop
   * token, every token is allowed (no row reads such a mask: verification stops at the refused or
   * final token). The state is left as it was.
   */
  void fill_masks_ahead(const int32_t* tokens, int64_t n, uint32_t* out);
  /** Whether the output may end here (a stop token is allowed). */
  bool can_end() const { return state_.accepting; }
  /** Whether a stop token has been accepted. */
  bool ended() const { return ended_; }
  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  void compact();
  // Runs fn (which may accept tokens) and puts the state back as it was.
  template <typename F>
  void look_ahead(F&& fn);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Frame> arena_;
  FrameIndex frames_;  // frames pushed by accept, by content (see Stepper)
  StackSet state_;
  bool ended_ = false;
  // Inside count_ahead / fill_masks_ahead: accept() must not compact (the saved state's frames
  // would be renumbered under it).
  bool looking_ahead_ = false;
  size_t compact_at_ = 65536;  // arena size that triggers dropping unreachable frames
  // The last mask and the stack set it was computed for. NOTE: a frame, once pushed, is never
  // changed until compact() renumbers the arena (accept and fill_mask only truncate what they
  // pushed themselves), so equal tops (keys and parent indices) mean equal stacks; compact()
  // forgets the mask.
  std::vector<Terminal> last_tops_;  // as mask_key gives them
  bool last_accepting_ = false;
  bool last_valid_ = false;
  std::vector<uint32_t> last_mask_;
  size_t masks_computed_ = 0;
  // Scratch reused between calls.
  std::vector<StackSet> levels_;
  std::vector<size_t> marks_;
  StackSet next_;
};

}  // namespace sluice::grammar
