// The token matcher: stack sets stepped byte by byte, per-position token caches, masks.

#include "grammar/token_matcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

namespace sluice::grammar {
namespace {

/** More stack tops than this at once: the grammar is too ambiguous to follow byte by byte. */
constexpr size_t kMaxTops = 4096;

// UTF-8 states of a Class position: 0 at a character's start, else what the next byte must be.
//   1..3: that many continuation bytes (80-BF) still owed;
//   4: after E0 (A0-BF, then 1); 5: after ED (80-9F, then 1); 6: after F0 (90-BF, then 2);
//   7: after F4 (80-8F, then 2). Overlong forms, surrogates and code points past U+10FFFF never match.
uint32_t lead_state(uint8_t b) {
  if (b >= 0xc2 && b <= 0xdf) return 1;
  if (b == 0xe0) return 4;
  if (b == 0xed) return 5;
  if (b >= 0xe1 && b <= 0xef) return 2;
  if (b == 0xf0) return 6;
  if (b >= 0xf1 && b <= 0xf3) return 3;
  if (b == 0xf4) return 7;
  return 0;
}

/** The state after continuation byte b in state s, or -1 if b cannot come here. */
int next_utf8_state(uint32_t s, uint8_t b) {
  switch (s) {
    case 1: case 2: case 3: return (b & 0xc0) == 0x80 ? int(s) - 1 : -1;
    case 4: return b >= 0xa0 && b <= 0xbf ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0x9f ? 1 : -1;
    case 6: return b >= 0x90 && b <= 0xbf ? 2 : -1;
    case 7: return b >= 0x80 && b <= 0x8f ? 2 : -1;
    default: return -1;
  }
}

/** Tags tell apart exits after 1..kTagBits-1 characters (bit 0: still in the run). */
constexpr uint32_t kTagBits = 64;
constexpr uint32_t kNoTagElem = UINT32_MAX;

/**
 * Steps stack sets over a grammar, pushing frames onto an arena. With a tag element (compiling a
 * counted element, see CountedCaches), a top tagged with bit 0 at that element is its own run with
 * no bound: each character it completes keeps it (count = characters so far) and also leaves the
 * element, the stacks after that tagged with bit (count).
 */
class Stepper {
 public:
  /**
   * `frames`, when given, indexes the arena's frames by content: a frame pushed again (as each
   * character of a run re-enters what follows it) is found instead, so equal stacks keep equal
   * parent indices and a state that has not really changed still matches its last mask.
   */
  Stepper(const Grammar& g, std::vector<Frame>& arena, uint32_t tag_elem = kNoTagElem, FrameIndex* frames = nullptr)
      : g_(g), arena_(arena), frames_(frames), tag_elem_(tag_elem), tagging_(tag_elem != kNoTagElem) {}

  /** Adds to `out` every top reachable from element e over a stack whose next frame is `parent`. */
  void expand(uint32_t e, int32_t parent, StackSet& out) {
    while (true) {
      const Element& el = g_.elems[e];
      if (el.kind == ElemKind::kEnd) {
        if (parent == kAcceptParent) {
          out.accepting = true;
          out.accepting_tags |= tag_;
          return;
        }
        if (parent == kOpenParent) {
          out.completed = true;
          out.completed_tags |= tag_;
          return;
        }
        const Frame f = arena_[size_t(parent)];
        e = f.elem;
        parent = f.parent;
        continue;
      }
      if (el.kind == ElemKind::kRef) {
        // A rule referenced last in its alternative returns straight to our parent (no frame):
        // right recursion then runs in constant stack.
        int32_t back = g_.elems[e + 1].kind == ElemKind::kEnd ? parent : push(e + 1, parent);
        const std::vector<uint32_t>& alts = g_.alts[size_t(el.rule)];
        for (size_t k = 0; k + 1 < alts.size(); k++) expand(alts[k], back, out);
        e = alts.back();
        parent = back;
        continue;
      }
      add(out, Terminal{e << 3, parent, 0});
      if (!(el.star || (el.counted && el.min_count == 0))) return;
      e++;  // a starred element (or one counted from 0) may also match nothing
    }
  }

  /** out = in after byte b. */
  void step(const StackSet& in, uint8_t b, StackSet& out) {
    out.clear();
    for (size_t j = 0; j < in.tops.size(); j++) {
      const Terminal& t = in.tops[j];
      if (tagging_) tag_ = in.tags[j];
      uint32_t e = t.key >> 3, s = t.key & 7;
      const Element& el = g_.elems[e];
      if (s == 0) {
        if (b < 0x80 || el.kind == ElemKind::kBytes) {
          if (el.has(b)) end_char(e, t.parent, t.count, out);
        } else if (uint32_t ls = lead_state(b)) {
          add(out, Terminal{(e << 3) | ls, t.parent, t.count});  // a Class: any_non_ascii
        }
        continue;
      }
      int ns = next_utf8_state(s, b);
      if (ns < 0) continue;
      if (ns == 0) {
        end_char(e, t.parent, t.count, out);
      } else {
        add(out, Terminal{(e << 3) | uint32_t(ns), t.parent, t.count});
      }
    }
    tag_ = 0;
  }

 private:
  /** A character of element e completed, `count` characters of it before. */
  void end_char(uint32_t e, int32_t parent, uint32_t count, StackSet& out) {
    const Element& el = g_.elems[e];
    if (el.star) return expand(e, parent, out);
    if (!el.counted) return expand(e + 1, parent, out);
    const uint32_t k = count + 1;
    if (tagging_ && e == tag_elem_ && (tag_ & 1)) {
      // The tagged walk's own run: no bound here (the buckets apply them), each exit tagged.
      if (k >= kTagBits) {
        out.overflow = true;
        return;
      }
      add(out, Terminal{e << 3, parent, k});
      const uint64_t saved = tag_;
      tag_ = uint64_t(1) << k;
      expand(e + 1, parent, out);
      tag_ = saved;
      return;
    }
    if (el.max_count == kUnboundedCount) {
      add(out, Terminal{e << 3, parent, std::min(k, el.min_count)});
    } else if (k < el.max_count) {
      add(out, Terminal{e << 3, parent, k});
    }
    if (k >= el.min_count) expand(e + 1, parent, out);
  }

  int32_t push(uint32_t elem, int32_t parent) {
    const int32_t at = int32_t(arena_.size());
    if (frames_ != nullptr) {
      auto [it, fresh] = frames_->try_emplace((uint64_t(elem) << 32) | uint32_t(parent), at);
      if (!fresh) {
        // Entries outlive frames truncated away (a failed accept): check before reusing.
        const int32_t had = it->second;
        if (size_t(had) < arena_.size() && arena_[size_t(had)].elem == elem && arena_[size_t(had)].parent == parent) return had;
        it->second = at;
      }
    }
    arena_.push_back(Frame{elem, parent});
    return at;
  }

  void add(StackSet& out, Terminal t) {
    if (tagging_) {
      // The run's own top (bit 0) is never merged with a top that left it.
      const bool own = tag_ & 1;
      for (size_t j = 0; j < out.tops.size(); j++) {
        if (out.tops[j] == t && bool(out.tags[j] & 1) == own) {
          out.tags[j] |= tag_;
          return;
        }
      }
    } else {
      for (const Terminal& have : out.tops) {
        if (have == t) return;
      }
    }
    if (out.tops.size() >= kMaxTops) throw GrammarError("the grammar is too ambiguous to match (over 4096 parse stacks at once)");
    out.tops.push_back(t);
    if (tagging_) out.tags.push_back(tag_);
  }

  const Grammar& g_;
  std::vector<Frame>& arena_;
  FrameIndex* const frames_;
  const uint32_t tag_elem_;
  const bool tagging_;
  uint64_t tag_ = 0;  // the tags of the top being stepped (tagging only)
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void set_bit(uint32_t* mask, int32_t id) { mask[uint32_t(id) >> 5] |= uint32_t(1) << (uint32_t(id) & 31); }

}  // namespace

// ---- vocabulary ---------------------------------------------------------------------------

TokenVocabulary::TokenVocabulary(std::vector<std::string> tokens, std::vector<int32_t> stop_ids)
    : tokens_(std::move(tokens)), stop_ids_(std::move(stop_ids)), is_stop_(tokens_.size(), false) {
  for (int32_t id : stop_ids_) {
    if (id < 0 || size_t(id) >= tokens_.size()) throw GrammarError("a stop token id outside the vocabulary");
    is_stop_[size_t(id)] = true;
    tokens_[size_t(id)].clear();  // a stop token is never matched as text
  }
  for (size_t id = 0; id < tokens_.size(); id++) {
    if (!tokens_[id].empty()) sorted_.push_back(int32_t(id));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return tokens_[size_t(a)] < tokens_[size_t(b)]; });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); i++) {
    const std::string& a = tokens_[size_t(sorted_[i - 1])];
    const std::string& b = tokens_[size_t(sorted_[i])];
    size_t n = std::min(a.size(), b.size()), k = 0;
    while (k < n && a[k] == b[k]) k++;
    lcp_[i] = uint32_t(k);
  }
  size_t i = 0;
  for (int b = 0; b < 256; b++) {
    first_[size_t(b)] = uint32_t(i);
    while (i < sorted_.size() && uint8_t(tokens_[size_t(sorted_[i])][0]) == b) i++;
  }
  first_[256] = uint32_t(sorted_.size());
}

size_t PositionCache::bytes() const {
  return sizeof(*this) + accepted_bits.size() * 4 + accepted_ids.size() * 4 + uncertain_token.size() * 12 + long_tokens.size() * 4;
}

// ---- compiling ----------------------------------------------------------------------------

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab, int64_t deadline_ms)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  if (grammar_.elems.size() >= (size_t(1) << 28)) throw GrammarError("the grammar is too large");
  build_contexts();
  at_start_.resize(grammar_.elems.size());
  counted_.resize(grammar_.elems.size());
  mid_char_.resize(grammar_.elems.size() * 8);
  size_t longest = 0;
  for (int32_t id : vocab_->sorted()) longest = std::max(longest, vocab_->bytes(id).size());
  mid_char_clamp_ = uint32_t(std::min<size_t>(longest, 1u << 14)) + 1;
  std::vector<Frame> arena;
  // Only rules the root can reach are ever matched (xgrammar prints its generic JSON rules into
  // every schema's grammar, used or not).
  std::vector<bool> reachable(grammar_.alts.size(), false);
  std::vector<int32_t> todo{grammar_.root};
  reachable[size_t(grammar_.root)] = true;
  while (!todo.empty()) {
    int32_t r = todo.back();
    todo.pop_back();
    for (uint32_t start : grammar_.alts[size_t(r)]) {
      for (uint32_t e = start; grammar_.elems[e].kind != ElemKind::kEnd; e++) {
        int32_t q = grammar_.elems[e].rule;
        if (grammar_.elems[e].kind == ElemKind::kRef && !reachable[size_t(q)]) {
          reachable[size_t(q)] = true;
          todo.push_back(q);
        }
      }
    }
  }
  for (uint32_t e = 0; e < grammar_.elems.size(); e++) {
    ElemKind kind = grammar_.elems[e].kind;
    if ((kind != ElemKind::kBytes && kind != ElemKind::kClass) || !reachable[size_t(rule_of_[e])]) continue;
    if (deadline_ms != 0 && now_ms() > deadline_ms) throw GrammarError("compiling the grammar ran past its time limit");
    if (grammar_.elems[e].counted) {
      counted_[e] = compile_counted(e, arena);
    } else {
      at_start_[e] = compile_position(e << 3, 0, arena);
    }
  }
}

void CompiledGrammar::build_contexts() {
  const Grammar& g = grammar_;
  const size_t rules = g.alts.size();
  rule_of_.assign(g.elems.size(), -1);
  for (size_t r = 0; r < rules; r++) {
    for (uint32_t start : g.alts[r]) {
      for (uint32_t e = start;; e++) {
        rule_of_[e] = int32_t(r);
        if (g.elems[e].kind == ElemKind::kEnd) break;
      }
    }
  }
  // Where each rule is referenced from: its one site, or -1 for none, -2 for several, -3 for the
  // root's start alone (below which is the end). A reference last in its alternative (a tail
  // reference) pushes no frame: what follows it is what follows the rule it is in, so it is no site
  // of its own but brings that rule's sites. `r ::= X r | X` (xgrammar's `X+`) and the rules
  // factored out of it (grammar.cpp) then keep the one context of r's one outside use.
  std::vector<int64_t> site(rules, -1);
  std::vector<std::vector<uint32_t>> sites(rules);
  std::vector<std::vector<int32_t>> tails_into(rules);  // [r]: the rules that end by referencing r
  auto merge = [](int64_t a, int64_t b) { return a == -1 ? b : b == -1 || a == b ? a : -2; };
  site[size_t(g.root)] = -3;
  for (uint32_t e = 0; e < g.elems.size(); e++) {
    if (g.elems[e].kind != ElemKind::kRef) continue;
    const size_t r = size_t(g.elems[e].rule);
    sites[r].push_back(e);
    if (g.elems[e + 1].kind == ElemKind::kEnd) {
      tails_into[r].push_back(rule_of_[e]);
    } else {
      site[r] = merge(site[r], int64_t(e));
    }
  }
  // Sites flow along tail references until nothing changes (each rule's value changes at most
  // twice: none -> one -> several).
  std::vector<std::vector<int32_t>> tails_from(rules);
  for (size_t r = 0; r < rules; r++) {
    for (int32_t q : tails_into[r]) tails_from[size_t(q)].push_back(int32_t(r));
  }
  std::vector<int32_t> work;
  for (size_t r = 0; r < rules; r++) {
    if (site[r] != -1) work.push_back(int32_t(r));
  }
  while (!work.empty()) {
    const size_t q = size_t(work.back());
    work.pop_back();
    for (int32_t r : tails_from[q]) {
      const int64_t merged = merge(site[size_t(r)], site[q]);
      if (merged != site[size_t(r)]) {
        site[size_t(r)] = merged;
        work.push_back(r);
      }
    }
  }
  context_parent_.assign(rules, kOpenParent);
  chain_top_.assign(rules, -1);
  context_depth_.assign(rules, 0);
  std::vector<uint8_t> state(rules, 0);  // 0 to do, 1 in progress (a cycle: unknown), 2 done
  // Iterative depth-first resolution: a rule's context is its site's continuation in the site's rule.
  for (size_t r0 = 0; r0 < rules; r0++) {
    std::vector<size_t> path;
    size_t r = r0;
    while (state[r] == 0 && site[r] >= 0) {
      state[r] = 1;
      path.push_back(r);
      r = size_t(rule_of_[size_t(site[r])]);
    }
    if (state[r] == 0) {  // a root-only or multi-site rule
      context_parent_[r] = site[r] == -3 ? kAcceptParent : kOpenParent;
      if (context_parent_[r] == kOpenParent) chain_top_[r] = int32_t(r);
      state[r] = 2;
    }
    // r is now done, or in progress (a cycle: the rules on it keep an unknown context).
    while (!path.empty()) {
      size_t q = path.back();
      path.pop_back();
      size_t owner = size_t(rule_of_[size_t(site[q])]);
      if (state[owner] != 2 || context_depth_[owner] >= 64) {
        context_parent_[q] = kOpenParent;
        chain_top_[q] = int32_t(q);
      } else {
        chain_top_[q] = chain_top_[owner];
        uint32_t next = uint32_t(site[q]) + 1;
        if (g.elems[next].kind == ElemKind::kEnd) {  // a tail reference: no frame, as when matching
          context_parent_[q] = context_parent_[owner];
          context_depth_[q] = context_depth_[owner];
        } else {
          context_frames_.push_back(Frame{next, context_parent_[owner]});
          context_parent_[q] = int32_t(context_frames_.size() - 1);
          context_depth_[q] = context_depth_[owner] + 1;
        }
      }
      state[q] = 2;
    }
  }
  for (size_t r = 0; r < rules; r++) {
    if (state[r] != 2) context_parent_[r] = kOpenParent, context_depth_[r] = 0, chain_top_[r] = int32_t(r);
  }
  // Where a context is unknown, the rule's sites still say what may come after it: the bytes that
  // can begin any of their continuations, where a continuation that can end at once adds the
  // bytes that may follow its own rule's context (a fixed point over the rules).
  follow_first_.assign(rules, {});
  std::vector<std::vector<int32_t>> depends(rules);
  std::vector<Frame> arena = context_frames_;
  Stepper stepper(g, arena);
  StackSet after, next;
  for (size_t r = 0; r < rules; r++) {
    if (chain_top_[r] != int32_t(r)) continue;
    std::array<uint64_t, 4>& first = follow_first_[r];
    for (uint32_t e : sites[r]) {
      const size_t q = size_t(rule_of_[e]);
      after.clear();
      stepper.expand(e + 1, context_parent_[q], after);
      for (int b = 0; b < 256; b++) {
        stepper.step(after, uint8_t(b), next);
        if (!next.tops.empty() || next.completed || next.accepting) first[size_t(b) >> 6] |= uint64_t(1) << (b & 63);
      }
      if (after.completed && chain_top_[q] >= 0 && chain_top_[q] != int32_t(r)) depends[r].push_back(chain_top_[q]);
      arena.resize(context_frames_.size());
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules; r++) {
      for (int32_t d : depends[r]) {
        for (size_t w = 0; w < 4; w++) {
          uint64_t merged = follow_first_[r][w] | follow_first_[size_t(d)][w];
          if (merged != follow_first_[r][w]) follow_first_[r][w] = merged, changed = true;
        }
      }
    }
  }
}

uint32_t CompiledGrammar::bucket(const Terminal& top, uint32_t B) const {
  const Element& el = grammar_.elems[top.key >> 3];
  const uint32_t need = top.count < el.min_count ? el.min_count - top.count : 0;
  const uint32_t rem = el.max_count == kUnboundedCount ? B : el.max_count - top.count;
  return std::min(need, B) * (B + 1) + std::min(rem, B);
}

Terminal CompiledGrammar::mask_key(const Terminal& top) const {
  const uint32_t e = top.key >> 3;
  if (!grammar_.elems[e].counted) return top;
  if ((top.key & 7) != 0) return Terminal{top.key, top.parent, 0x80000000u | bucket(top, mid_char_clamp_)};
  const CountedCaches* c = counted_[e].get();
  // Tokens checked at mask time see the count itself.
  if (c == nullptr || c->has_long_tokens) return top;
  return Terminal{top.key, top.parent, 0x80000000u | bucket(top, c->B)};
}

const PositionCache& CompiledGrammar::cache(const Terminal& top) const {
  static const PositionCache unreachable;  // a rule the root never reaches: nothing to match
  const uint32_t key = top.key, e = key >> 3;
  const bool counted = grammar_.elems[e].counted;
  if ((key & 7) == 0) {
    if (!counted) {
      const auto& c = at_start_[e];
      return c ? *c : unreachable;
    }
    const CountedCaches* cc = counted_[e].get();
    if (cc == nullptr) return unreachable;
    const auto& c = cc->by_bucket[bucket(top, cc->B)];
    if (c) return *c;  // NOTE: compile_counted compiles every bucket a count reaches; else below
  }
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (!counted) {
    auto& slot = mid_char_[key];
    if (!slot) {
      std::vector<Frame> arena;
      slot = compile_position(key, 0, arena);
    }
    return *slot;
  }
  auto& slot = counted_mid_char_[(uint64_t(key) << 32) | bucket(top, mid_char_clamp_)];
  if (!slot) {
    // Any count in this bucket walks alike: the top's own.
    std::vector<Frame> arena;
    slot = compile_position(key, top.count, arena);
  }
  return *slot;
}

const PositionCache* CompiledGrammar::cache_if_ready(const Terminal& top) const {
  if ((top.key & 7) == 0) return &cache(top);
  // NOTE: never waits: another thread may hold the lock for a whole position's compile (tens of
  // milliseconds), and this is asked on the JS thread. Busy counts as not ready.
  std::unique_lock<std::mutex> lock(lazy_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return nullptr;
  if (!grammar_.elems[top.key >> 3].counted) return mid_char_[top.key].get();
  auto it = counted_mid_char_.find((uint64_t(top.key) << 32) | bucket(top, mid_char_clamp_));
  return it == counted_mid_char_.end() ? nullptr : it->second.get();
}

/**
 * What a walk over the vocabulary found from one top. Untagged: `accepted` tokens are accepted
 * (inside = -1, tags = all), `uncertain` suffixes depend on the stack below. Tagged (a counted
 * element's run, see CountedCaches): per token, `inside` = the characters it leaves the run with
 * when it stays in it (-1: it cannot), `tags` = bit i when leaving the run after i characters takes
 * it whole; an uncertain suffix's tags say after how many characters the run was left on its way.
 */
struct CompiledGrammar::Walk {
  struct Accepted {
    int32_t token;
    int32_t inside;
    uint64_t tags;
    bool boundary = true;  // (inside >= 0) the token ends between characters, not inside one
  };
  struct Uncertain {
    int32_t token;
    uint32_t from;
    uint64_t tags;
  };
  std::vector<Accepted> accepted;
  std::vector<Uncertain> uncertain;
  std::vector<int32_t> long_tokens;
  uint32_t longest = 0;  // the most characters any tagged way through a token spent in the run
};

CompiledGrammar::Walk CompiledGrammar::walk(uint32_t key, uint32_t count, bool tagged, std::vector<Frame>& arena) const {
  const TokenVocabulary& v = *vocab_;
  const std::vector<int32_t>& sorted = v.sorted();
  const std::vector<uint32_t>& lcp = v.lcp();
  arena = context_frames_;
  Stepper stepper(grammar_, arena, tagged ? key >> 3 : kNoTagElem);
  // levels[d]: the stacks after the first d bytes of the current token; completed_upto[d]: whether
  // the rule ended at any of levels 1..d (a token dying later may still be uncertain);
  // overflow_upto[d]: whether the tagged run passed what tags tell apart on the way.
  std::vector<StackSet> levels(1);
  std::vector<size_t> marks(1, arena.size());
  std::vector<bool> completed_upto(1, false), overflow_upto(1, false);
  levels[0].tops.push_back(Terminal{key, context_parent_[size_t(rule_of_[key >> 3])], count});
  if (tagged) levels[0].tags.push_back(1);
  Walk out;
  auto note = [&](uint64_t tags) {
    if (tags > 1) out.longest = std::max<uint32_t>(out.longest, 63 - uint32_t(__builtin_clzll(tags)));
  };
  // Bytes that may follow the end of the known context (see build_contexts).
  const int32_t top_rule = chain_top_[size_t(rule_of_[key >> 3])];
  const std::array<uint64_t, 4> none{};
  const std::array<uint64_t, 4>& follow = top_rule >= 0 ? follow_first_[size_t(top_rule)] : none;
  auto follows = [&](uint8_t b) { return (follow[b >> 6] >> (b & 63)) & 1; };

  size_t valid = 0;  // levels[0..valid] hold the previous token's prefix
  size_t i = 0;
  while (i < sorted.size()) {
    int32_t id = sorted[i];
    const std::string& t = v.bytes(id);
    size_t d = std::min<size_t>(i == 0 ? 0 : lcp[i], valid);
    // Extend the levels along this token while some stack lives.
    while (d < t.size() && !levels[d].tops.empty()) {
      if (levels.size() <= d + 1) {
        levels.resize(d + 2);
        marks.resize(d + 2);
        completed_upto.resize(d + 2);
        overflow_upto.resize(d + 2);
      }
      arena.resize(marks[d]);
      stepper.step(levels[d], uint8_t(t[d]), levels[d + 1]);
      marks[d + 1] = arena.size();
      completed_upto[d + 1] = completed_upto[d] || levels[d + 1].completed;
      overflow_upto[d + 1] = overflow_upto[d] || levels[d + 1].overflow;
      d++;
    }
    valid = d;
    if (overflow_upto[d]) {
      out.long_tokens.push_back(id);  // checked at mask time
      i++;
      continue;
    }
    bool accepted = false;
    if (d == t.size()) {
      const StackSet& end = levels[d];
      if (!tagged) {
        accepted = !end.tops.empty() || end.completed || end.accepting;
        if (accepted) out.accepted.push_back(Walk::Accepted{id, -1, ~uint64_t(0)});
      } else {
        int32_t inside = -1;
        bool boundary = true;
        uint64_t tags = end.completed_tags | end.accepting_tags;
        for (size_t j = 0; j < end.tops.size(); j++) {
          if (end.tags[j] & 1) {
            inside = int32_t(end.tops[j].count);
            boundary = (end.tops[j].key & 7) == 0;
          } else {
            tags |= end.tags[j];
          }
        }
        accepted = inside >= 0 || tags != 0;
        if (accepted) {
          out.accepted.push_back(Walk::Accepted{id, inside, tags, boundary});
          if (inside >= 0) out.longest = std::max<uint32_t>(out.longest, uint32_t(inside));
          note(tags);
        }
      }
      if (accepted && !tagged) {
        i++;
        continue;
      }
    }
    if (!completed_upto[d]) {
      if (accepted) {
        i++;
        continue;
      }
      // Dead after d bytes with no end of the rule on the way: so is every token sharing them.
      if (d == 1) {
        i = v.first(uint8_t(t[0]) + 1);
        continue;
      }
      size_t j = i + 1;
      while (j < sorted.size() && lcp[j] >= d) j++;
      i = j;
      continue;
    }
    for (size_t k = 1; k <= d && k < t.size(); k++) {
      if (levels[k].completed && follows(uint8_t(t[k]))) {
        uint64_t tags = tagged ? levels[k].completed_tags : ~uint64_t(0);
        if (tagged) note(tags);
        out.uncertain.push_back(Walk::Uncertain{id, uint32_t(k), tags});
      }
    }
    i++;
  }
  return out;
}

namespace {

/** The accepted tokens of a cache: `bits` itself, or its ids when there are fewer than its words. */
void set_accepted(PositionCache& cache, std::vector<uint32_t> bits, size_t count) {
  if (count >= bits.size()) {
    cache.accepted_bits = std::move(bits);
    return;
  }
  cache.accepted_ids.reserve(count);
  for (size_t k = 0; k < bits.size(); k++) {
    for (uint32_t word = bits[k]; word != 0; word &= word - 1) cache.accepted_ids.push_back(int32_t(k * 32 + uint32_t(__builtin_ctz(word))));
  }
}

}  // namespace

std::unique_ptr<PositionCache> CompiledGrammar::make_cache(const Walk& w, uint32_t cn, uint32_t cr, bool tagged,
                                                         std::shared_ptr<const PositionCache> base,
                                                         std::shared_ptr<const std::vector<int32_t>> exit_ids, uint32_t exit_begin,
                                                         uint32_t exit_end) const {
  const TokenVocabulary& v = *vocab_;
  // The exits this bucket allows: after i characters, need <= i <= rem (i >= 1: leaving at once is
  // the stack set's own business, expand put those tops there).
  uint64_t exits = ~uint64_t(0);
  if (tagged) {
    exits = 0;
    for (uint32_t k = std::max<uint32_t>(cn, 1); k <= cr && k < kTagBits; k++) exits |= uint64_t(1) << k;
  }
  auto cache = std::make_unique<PositionCache>();
  std::vector<const Walk::Uncertain*> uncertain;
  if (!tagged) {
    if (w.accepted.size() >= v.words()) {
      cache->accepted_bits.assign(v.words(), 0);
      for (const Walk::Accepted& a : w.accepted) set_bit(cache->accepted_bits.data(), a.token);
    } else {
      cache->accepted_ids.reserve(w.accepted.size());
      for (const Walk::Accepted& a : w.accepted) cache->accepted_ids.push_back(a.token);
    }
    for (const Walk::Uncertain& u : w.uncertain) uncertain.push_back(&u);
  } else {
    // Accepted: `base`, the tokens of the class alone that fit in rem characters (see
    // compile_counted), and exit_ids[exit_begin, exit_end), those taken by leaving the run after
    // need..rem characters. An uncertain suffix of a token accepted anyway is left out.
    std::vector<uint32_t> taken(v.words(), 0);
    if (!base->accepted_bits.empty()) {
      taken = base->accepted_bits;
    } else {
      for (int32_t id : base->accepted_ids) set_bit(taken.data(), id);
    }
    for (uint32_t k = exit_begin; k < exit_end; k++) set_bit(taken.data(), (*exit_ids)[k]);
    for (const Walk::Uncertain& u : w.uncertain) {
      if ((u.tags & exits) && !((taken[uint32_t(u.token) >> 5] >> (uint32_t(u.token) & 31)) & 1)) uncertain.push_back(&u);
    }
    cache->shared = std::move(base);
    cache->exit_ids = std::move(exit_ids);
    cache->exit_begin = exit_begin;
    cache->exit_end = exit_end;
  }
  auto suffix = [&](const Walk::Uncertain* e) {
    const std::string& t = v.bytes(e->token);
    return std::string_view(t).substr(e->from);
  };
  std::sort(uncertain.begin(), uncertain.end(), [&](const Walk::Uncertain* a, const Walk::Uncertain* b) {
    std::string_view x = suffix(a), y = suffix(b);
    return x != y ? x < y : a->token < b->token;
  });
  cache->uncertain_token.reserve(uncertain.size());
  for (size_t k = 0; k < uncertain.size(); k++) {
    uint32_t common = 0;
    if (k > 0) {
      std::string_view a = suffix(uncertain[k - 1]), b = suffix(uncertain[k]);
      while (common < a.size() && common < b.size() && a[common] == b[common]) common++;
    }
    cache->uncertain_token.push_back(uncertain[k]->token);
    cache->uncertain_from.push_back(uncertain[k]->from);
    cache->uncertain_lcp.push_back(common);
  }
  cache->long_tokens = w.long_tokens;
  bytes_ += cache->bytes();
  compiled_++;
  return cache;
}

std::unique_ptr<PositionCache> CompiledGrammar::compile_position(uint32_t key, uint32_t count, std::vector<Frame>& arena) const {
  Walk w = walk(key, count, false, arena);
  return make_cache(w, 0, 0, false, nullptr, nullptr, 0, 0);
}

std::unique_ptr<CountedCaches> CompiledGrammar::compile_counted(uint32_t elem, std::vector<Frame>& arena) {
  const Element& el = grammar_.elems[elem];
  Walk w = walk(elem << 3, 0, true, arena);
  auto out = std::make_unique<CountedCaches>();
  out->B = w.longest + 1;
  out->has_long_tokens = !w.long_tokens.empty();
  const uint32_t B = out->B;
  out->by_bucket.resize(size_t(B + 1) * (B + 1));
  // The counts a top can hold: 0 .. max - 1 (0 .. min when unbounded: the count stops there).
  // Buckets change only within B of 0, of min and of max, so those windows reach them all.
  const uint64_t last = el.max_count == kUnboundedCount ? el.min_count : el.max_count - 1;
  std::vector<uint32_t> buckets;
  auto visit = [&](uint64_t from, uint64_t to) {
    for (uint64_t k = from; k <= to && k <= last; k++) buckets.push_back(bucket(Terminal{elem << 3, 0, uint32_t(k)}, B));
  };
  auto before = [&](uint64_t x) { return x > B + 2 ? x - B - 2 : 0; };
  visit(0, B + 2);
  visit(before(el.min_count), el.min_count + 2);
  visit(before(last), last);
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  // The tokens of this class alone, per rem (cr): the same for every element of the class, so
  // built once. One of c characters is taken when c < rem (it stays in the run), and also when it
  // ends between characters and c == rem (it may leave the run at its end, need <= c <= rem: what
  // follows the run may always begin after it), so when w <= cr, w = c, or c + 1 if it ends
  // inside a character. Its exit after c characters is then left out of exit_ids below.
  std::string cls(2 + sizeof(el.set), '\0');
  cls[0] = char(el.kind);
  cls[1] = char(el.any_non_ascii);
  std::memcpy(cls.data() + 2, el.set.data(), sizeof(el.set));
  auto& staying = staying_[cls];
  if (staying.size() < B + 1) {
    std::vector<std::vector<int32_t>> by_count(B + 1);
    for (const Walk::Accepted& a : w.accepted) {
      if (a.inside >= 0) by_count[size_t(a.inside) + (a.boundary ? 0 : 1)].push_back(a.token);
    }
    std::vector<uint32_t> running(vocab_->words(), 0);
    size_t count = 0;
    staying.assign(B + 1, nullptr);
    for (uint32_t cr = 0; cr <= B; cr++) {
      // staying[cr]: the tokens with w <= cr.
      for (int32_t id : by_count[cr]) set_bit(running.data(), id);
      count += by_count[cr].size();
      auto shared = std::make_shared<PositionCache>();
      set_accepted(*shared, running, count);
      bytes_ += shared->bytes();
      staying[cr] = std::move(shared);
    }
  }
  // The tokens taken whole by leaving the run, by the count they leave it at (once per count).
  std::vector<std::pair<uint32_t, int32_t>> exiting;
  for (const Walk::Accepted& a : w.accepted) {
    uint64_t tags = a.tags & ~uint64_t(1);
    if (a.inside >= 0 && a.boundary && uint32_t(a.inside) < kTagBits) tags &= ~(uint64_t(1) << a.inside);  // in staying
    for (; tags != 0; tags &= tags - 1) exiting.emplace_back(uint32_t(__builtin_ctzll(tags)), a.token);
  }
  std::sort(exiting.begin(), exiting.end());
  auto exit_ids = std::make_shared<std::vector<int32_t>>();
  std::vector<uint32_t> first_exit(kTagBits + 1, 0);  // exit_ids[first_exit[i] ..]: leaving after i or more
  for (uint32_t i = 0, k = 0; i <= kTagBits; i++) {
    while (k < exiting.size() && exiting[k].first < i) k++;
    first_exit[i] = k;
  }
  for (const auto& e : exiting) exit_ids->push_back(e.second);
  bytes_ += exit_ids->size() * 4;
  for (uint32_t b : buckets) {
    const uint32_t cn = b / (B + 1), cr = b % (B + 1);
    const uint32_t lo = std::max<uint32_t>(cn, 1), hi = std::min<uint32_t>(cr, kTagBits - 1);
    const uint32_t begin = first_exit[lo], end = lo <= hi ? first_exit[hi + 1] : begin;
    out->by_bucket[b] = make_cache(w, cn, cr, true, staying[cr], exit_ids, begin, std::max(begin, end));
  }
  return out;
}

// ---- matching -----------------------------------------------------------------------------

TokenMatcher::TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  Stepper stepper(grammar_->grammar(), arena_, kNoTagElem, &frames_);
  const Grammar& g = grammar_->grammar();
  for (uint32_t start : g.alts[size_t(g.root)]) stepper.expand(start, kAcceptParent, state_);
}

bool TokenMatcher::fill_mask_if_unchanged(uint32_t* out) {
  const size_t words = grammar_->vocab().words();
  if (ended_) {
    std::memset(out, 0, words * 4);
    return true;
  }
  if (!last_valid_ || last_accepting_ != state_.accepting || last_tops_.size() != state_.tops.size()) return false;
  for (size_t j = 0; j < state_.tops.size(); j++) {
    if (!(last_tops_[j] == grammar_->mask_key(state_.tops[j]))) return false;
  }
  std::memcpy(out, last_mask_.data(), words * 4);
  return true;
}

int64_t TokenMatcher::fill_mask_within(uint32_t* out, size_t budget) {
  if (fill_mask_if_unchanged(out)) return 0;
  size_t work = 0;
  for (const Terminal& top : state_.tops) {
    const PositionCache* c = grammar_->cache_if_ready(top);
    if (c == nullptr) return -1;
    work += c->accepted_bits.empty() ? c->accepted_ids.size() / 16 : kMaskWordsCost;
    if (c->shared) work += c->shared->accepted_bits.empty() ? c->shared->accepted_ids.size() / 16 : kMaskWordsCost;
    work += (c->exit_end - c->exit_begin) / 16;
    work += c->long_tokens.size() * 16;
    if (top.parent != kAcceptParent) work += c->uncertain_token.size();
    if (work > budget) return -1;
  }
  fill_mask(out);
  return int64_t(work);
}

void TokenMatcher::fill_mask(uint32_t* out) {
  const TokenVocabulary& v = grammar_->vocab();
  if (fill_mask_if_unchanged(out)) return;
  std::memset(out, 0, v.words() * 4);
  masks_computed_++;
  if (state_.accepting) {
    for (int32_t id : v.stop_ids()) set_bit(out, id);
  }
  const Grammar& g = grammar_->grammar();
  Stepper stepper(g, arena_);
  const size_t base = arena_.size();
  for (const Terminal& top : state_.tops) {
    const PositionCache& c = grammar_->cache(top);
    if (c.shared) {
      if (!c.shared->accepted_bits.empty()) {
        const uint32_t* bits = c.shared->accepted_bits.data();
        for (size_t w = 0; w < c.shared->accepted_bits.size(); w++) out[w] |= bits[w];
      } else {
        for (int32_t id : c.shared->accepted_ids) set_bit(out, id);
      }
    }
    for (uint32_t k = c.exit_begin; k < c.exit_end; k++) set_bit(out, (*c.exit_ids)[k]);
    if (!c.accepted_bits.empty()) {
      const uint32_t* bits = c.accepted_bits.data();
      for (size_t w = 0; w < c.accepted_bits.size(); w++) out[w] |= bits[w];
    } else {
      for (int32_t id : c.accepted_ids) set_bit(out, id);
    }
    for (int32_t id : c.long_tokens) {
      // A token with more characters of a counted run than its cache tells apart: byte by byte.
      const std::string& t = v.bytes(id);
      if (levels_.size() < 2) levels_.resize(2), marks_.resize(2);
      StackSet& a = levels_[0];
      StackSet& b = levels_[1];
      a.clear();
      a.tops.push_back(top);
      bool ok = true;
      for (size_t k = 0; k < t.size() && ok; k++) {
        stepper.step(a, uint8_t(t[k]), b);
        ok = !b.tops.empty() || (k + 1 == t.size() && b.accepting);
        std::swap(a, b);
      }
      arena_.resize(base);
      if (ok) set_bit(out, id);
    }
    if (c.uncertain_token.empty() || top.parent == kAcceptParent) continue;
    // The uncertain tokens: their suffixes against what follows this top's rule.
    if (levels_.empty()) levels_.resize(1), marks_.resize(1);
    levels_[0].clear();
    arena_.resize(base);
    // The frame the cache knew nothing of: below this top's static context.
    int32_t at = top.parent;
    for (uint32_t k = grammar_->context_depth(top.key >> 3); k > 0 && at >= 0; k--) at = arena_[size_t(at)].parent;
    if (at < 0) continue;  // the root's end: nothing may follow
    const Frame below = arena_[size_t(at)];
    stepper.expand(below.elem, below.parent, levels_[0]);
    marks_[0] = arena_.size();
    const size_t n = c.uncertain_token.size();
    size_t valid = 0, i = 0;
    while (i < n) {
      const std::string& t = v.bytes(c.uncertain_token[i]);
      const size_t from = c.uncertain_from[i];
      const size_t len = t.size() - from;
      size_t d = std::min<size_t>(c.uncertain_lcp[i], valid);
      while (d < len && !levels_[d].tops.empty()) {
        if (levels_.size() <= d + 1) levels_.resize(d + 2), marks_.resize(d + 2);
        arena_.resize(marks_[d]);
        stepper.step(levels_[d], uint8_t(t[from + d]), levels_[d + 1]);
        marks_[d + 1] = arena_.size();
        d++;
      }
      valid = d;
      if (d == len && (!levels_[d].tops.empty() || levels_[d].accepting)) {
        set_bit(out, c.uncertain_token[i]);
        i++;
        continue;
      }
      // Byte d - 1 left no stack (or the suffix ran past a closed root): skip all sharing it.
      size_t j = i + 1;
      while (j < n && c.uncertain_lcp[j] >= d) j++;
      i = j;
    }
  }
  arena_.resize(base);
  last_tops_.clear();
  for (const Terminal& top : state_.tops) last_tops_.push_back(grammar_->mask_key(top));
  last_accepting_ = state_.accepting;
  last_mask_.assign(out, out + v.words());
  last_valid_ = true;
}

bool TokenMatcher::accept(int32_t token) {
  const TokenVocabulary& v = grammar_->vocab();
  if (ended_ || token < 0 || size_t(token) >= v.size()) return false;
  if (v.is_stop(token)) {
    if (!state_.accepting) return false;
    ended_ = true;
    return true;
  }
  const std::string& t = v.bytes(token);
  if (t.empty()) return false;
  const size_t base = arena_.size();
  Stepper stepper(grammar_->grammar(), arena_, kNoTagElem, &frames_);
  StackSet cur = state_;
  for (size_t k = 0; k < t.size(); k++) {
    stepper.step(cur, uint8_t(t[k]), next_);
    bool last = k + 1 == t.size();
    if (next_.tops.empty() && !(last && next_.accepting)) {
      arena_.resize(base);
      return false;
    }
    std::swap(cur, next_);
  }
  state_ = std::move(cur);
  if (arena_.size() > compact_at_ && !looking_ahead_) {
    compact();
    compact_at_ = std::max<size_t>(65536, 2 * arena_.size());
  }
  return true;
}

// Lookahead accepts push frames the restored state never reaches; they stay in the arena until
// the next compaction (frames never change, so the mask cache's equality test still holds).
template <typename F>
void TokenMatcher::look_ahead(F&& fn) {
  const StackSet saved = state_;
  const bool saved_ended = ended_;
  looking_ahead_ = true;
  auto restore = [&] {
    state_ = saved;
    ended_ = saved_ended;
    looking_ahead_ = false;
  };
  try {
    fn();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

int64_t TokenMatcher::count_ahead(const int32_t* tokens, int64_t n) {
  int64_t k = 0;
  look_ahead([&] {
    while (k < n && !ended_ && accept(tokens[k])) k++;
  });
  return k;
}

void TokenMatcher::fill_masks_ahead(const int32_t* tokens, int64_t n, uint32_t* out) {
  const size_t words = grammar_->vocab().words();
  look_ahead([&] {
    bool live = true;
    for (int64_t j = 0; j <= n; j++) {
      uint32_t* mask = out + size_t(j) * words;
      if (live && !ended_) fill_mask(mask);
      else std::memset(mask, 0xff, words * 4);
      if (j < n && live && !ended_) live = accept(tokens[j]);
    }
  });
}

void TokenMatcher::compact() {
  // Keep only frames reachable from the tops, renumbered in arena order.
  std::vector<int32_t> remap(arena_.size(), -1);
  std::vector<int32_t> stack;
  for (const Terminal& t : state_.tops) {
    for (int32_t p = t.parent; p >= 0 && remap[size_t(p)] == -1; p = arena_[size_t(p)].parent) {
      remap[size_t(p)] = 0;
      stack.push_back(p);
    }
  }
  std::sort(stack.begin(), stack.end());
  std::vector<Frame> kept;
  kept.reserve(stack.size());
  for (int32_t old : stack) {
    remap[size_t(old)] = int32_t(kept.size());
    Frame f = arena_[size_t(old)];
    kept.push_back(Frame{f.elem, f.parent < 0 ? f.parent : remap[size_t(f.parent)]});  // parents come first
  }
  for (Terminal& t : state_.tops) {
    if (t.parent >= 0) t.parent = remap[size_t(t.parent)];
  }
  arena_ = std::move(kept);
  frames_.clear();
  for (size_t k = 0; k < arena_.size(); k++) frames_.emplace((uint64_t(arena_[k].elem) << 32) | uint32_t(arena_[k].parent), int32_t(k));
  last_valid_ = false;  // the tops' parent indices now name other frames
}

}  // namespace sluice::grammar
