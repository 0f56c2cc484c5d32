// EAGLE-3 heads (issue 35): the head against a float64 reference written here (its layer, the
// fc over three aux hidden states, the draft vocabulary map), the engine's capture of the
// target's hidden states against a float64 reference of the target, the head's context kept in
// pieces equal to one pass, greedy output unchanged when its drafts are verified, and the checks
// at load.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "model/safetensors.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "sluice/model_config.h"
#include "speculative/eagle3_head.h"
#include "llama_reference.h"
#include "safetensors_file.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::temp_dir;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;

namespace {

constexpr int kH = 64, kHeads = 4, kKv = 2, kHd = 16, kInter = 96, kVocab = 96, kDraftVocab = 40, kLayers = 4;
const std::vector<int64_t> kAux = {0, 1, 3};

TinyModelSpec target_spec() {
  TinyModelSpec s;
  s.layers = kLayers;
  s.inter = 128;
  s.dtype = "F32";
  s.seed = 7;
  return s;
}

// Draft id i is target id 2i + 1.
int32_t draft_to_target(int64_t i) { return int32_t(2 * i + 1); }

struct HeadSpec {
  int vocab = kVocab;
  bool aux_ids = true;
  bool drop_fc = false;
};

void write_head(const std::string& dir, const HeadSpec& hs) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  using T = sluice_test::RawTensor;
  std::vector<T> ts;
  auto floats = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    T t{name, "F32", shape, std::vector<uint8_t>(size_t(n) * 4)};
    for (int64_t i = 0; i < n; i++) {
      const float v = offset + scale * normal(rng);
      std::memcpy(t.bytes.data() + 4 * i, &v, 4);
    }
    ts.push_back(std::move(t));
  };
  const int q = kHeads * kHd, kv = kKv * kHd;
  if (!hs.drop_fc) floats("fc.weight", {kH, 3 * kH}, 1.f / std::sqrt(3.f * kH), 0.f);
  floats("midlayer.hidden_norm.weight", {kH}, 0.1f, 1.f);
  floats("midlayer.input_layernorm.weight", {kH}, 0.1f, 1.f);
  floats("midlayer.post_attention_layernorm.weight", {kH}, 0.1f, 1.f);
  floats("midlayer.self_attn.q_proj.weight", {q, 2 * kH}, 1.f / std::sqrt(2.f * kH), 0.f);
  floats("midlayer.self_attn.k_proj.weight", {kv, 2 * kH}, 1.f / std::sqrt(2.f * kH), 0.f);
  floats("midlayer.self_attn.v_proj.weight", {kv, 2 * kH}, 1.f / std::sqrt(2.f * kH), 0.f);
  floats("midlayer.self_attn.o_proj.weight", {kH, q}, 1.f / std::sqrt(float(q)), 0.f);
  floats("midlayer.mlp.gate_proj.weight", {kInter, kH}, 1.f / std::sqrt(float(kH)), 0.f);
  floats("midlayer.mlp.up_proj.weight", {kInter, kH}, 1.f / std::sqrt(float(kH)), 0.f);
  floats("midlayer.mlp.down_proj.weight", {kH, kInter}, 1.f / std::sqrt(float(kInter)), 0.f);
  floats("norm.weight", {kH}, 0.1f, 1.f);
  floats("lm_head.weight", {kDraftVocab, kH}, 4.f / std::sqrt(float(kH)), 0.f);
  T d2t{"d2t", "I64", {kDraftVocab}, std::vector<uint8_t>(size_t(kDraftVocab) * 8)};
  for (int64_t i = 0; i < kDraftVocab; i++) {
    const int64_t off = draft_to_target(i) - i;
    std::memcpy(d2t.bytes.data() + 8 * i, &off, 8);
  }
  ts.push_back(std::move(d2t));
  T t2d{"t2d", "BOOL", {kVocab}, std::vector<uint8_t>(size_t(kVocab), 0)};
  for (int64_t i = 0; i < kDraftVocab; i++) t2d.bytes[size_t(draft_to_target(i))] = 1;
  ts.push_back(std::move(t2d));

  sluice_test::write_safetensors(dir, ts);
  std::ofstream cfg(dir + "/config.json");
  cfg << "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"model_type\":\"llama\",\"hidden_size\":" << kH
      << ",\"intermediate_size\":" << kInter << ",\"num_hidden_layers\":1,\"num_attention_heads\":" << kHeads
      << ",\"num_key_value_heads\":" << kKv << ",\"head_dim\":" << kHd << ",\"vocab_size\":" << hs.vocab
      << ",\"draft_vocab_size\":" << kDraftVocab
      << ",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"hidden_act\":\"silu\"";
  if (hs.aux_ids) cfg << ",\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[0,1,3]}";
  cfg << "}";
}

const std::string& target_dir() {
  static const std::string d = [] {
    const std::string dir = temp_dir("eagle3-target");
    write_tiny_model(dir, target_spec());
    return dir;
  }();
  return d;
}

const std::string& head_dir() {
  static const std::string d = [] {
    const std::string dir = temp_dir("eagle3-head");
    write_head(dir, HeadSpec{});
    return dir;
  }();
  return d;
}

// ---- float64 reference ----------------------------------------------------------------------

using sluice_test::CheckpointWeights;
using sluice_test::Vec;

// The target over `tokens`: per position the features [aux0 | aux1 | aux2] (each layer's input)
// and the logits of the last position.
struct TargetRun {
  std::vector<Vec> features;
  Vec last_logits;
};

TargetRun run_target(const std::vector<int32_t>& tokens) {
  static const CheckpointWeights w(target_dir());
  sluice_test::RefDims d;
  d.layers = kLayers;
  const sluice_test::LlamaRun r = sluice_test::run_llama(d, [&](const std::string& n) { return w.get(n); }, tokens);
  TargetRun run;
  run.features.assign(tokens.size(), Vec());
  for (int64_t l : kAux)
    for (size_t t = 0; t < tokens.size(); t++)
      run.features[t].insert(run.features[t].end(), r.layer_inputs[size_t(l)][t].begin(), r.layer_inputs[size_t(l)][t].end());
  run.last_logits = r.logits.back();
  return run;
}

// The head over context positions 0..n-1 (features[t], next token tokens[t + 1]), then k drafts:
// the logits of each drafting round over the draft vocabulary, and the drafts (target ids).
struct HeadRun {
  std::vector<Vec> logits;
  std::vector<int32_t> drafts;
};

HeadRun run_head(const std::vector<Vec>& features, const std::vector<int32_t>& next_tokens, int k) {
  static const CheckpointWeights h(head_dir());
  static const CheckpointWeights tw(target_dir());
  const Vec embed = tw.get("model.embed_tokens.weight");
  const Vec fc = h.get("fc.weight"), whn = h.get("midlayer.hidden_norm.weight"), win = h.get("midlayer.input_layernorm.weight"),
            wpost = h.get("midlayer.post_attention_layernorm.weight"), wq = h.get("midlayer.self_attn.q_proj.weight"),
            wk = h.get("midlayer.self_attn.k_proj.weight"), wv = h.get("midlayer.self_attn.v_proj.weight"),
            wo = h.get("midlayer.self_attn.o_proj.weight"), wg = h.get("midlayer.mlp.gate_proj.weight"),
            wu = h.get("midlayer.mlp.up_proj.weight"), wd = h.get("midlayer.mlp.down_proj.weight"), wn = h.get("norm.weight"),
            lm = h.get("lm_head.weight");
  std::vector<Vec> K, V;
  auto step = [&](const Vec& x, int32_t token, int64_t pos) {
    const Vec e(embed.begin() + long(token) * kH, embed.begin() + long(token + 1) * kH);
    Vec cat = sluice_test::ref_rms(e, win);
    const Vec hn = sluice_test::ref_rms(x, whn);
    cat.insert(cat.end(), hn.begin(), hn.end());
    Vec q = sluice_test::ref_mv(wq, cat, kHeads * kHd), kk = sluice_test::ref_mv(wk, cat, kKv * kHd);
    sluice_test::ref_rope(q, kHeads, kHd, pos);
    sluice_test::ref_rope(kk, kKv, kHd, pos);
    K.push_back(kk);
    V.push_back(sluice_test::ref_mv(wv, cat, kKv * kHd));
    const Vec o = sluice_test::ref_mv(wo, sluice_test::ref_attend(q, K, V, kHeads, kKv, kHd), kH);
    Vec y = x;
    for (int i = 0; i < kH; i++) y[size_t(i)] += o[size_t(i)];
    const Vec m = sluice_test::ref_silu_mlp(sluice_test::ref_rms(y, wpost), wg, wu, wd, kInter);
    for (int i = 0; i < kH; i++) y[size_t(i)] += m[size_t(i)];
    return y;
  };
  Vec out;
  const int64_t n = int64_t(features.size());
  for (int64_t t = 0; t < n; t++) out = step(sluice_test::ref_mv(fc, features[size_t(t)], kH), next_tokens[size_t(t)], t);
  HeadRun run;
  for (int j = 0; j < k; j++) {
    const Vec logits = sluice_test::ref_mv(lm, sluice_test::ref_rms(out, wn), kDraftVocab);
    run.logits.push_back(logits);
    const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    run.drafts.push_back(draft_to_target(best));
    if (j + 1 < k) out = step(out, run.drafts.back(), n + j);
  }
  return run;
}

// Largest |a - b| over the largest |b|.
double rel_err(const float* a, const Vec& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); i++) {
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

// Whether b's best entry beats its second by more than `margin` (argmax comparable across precisions).
bool clear_winner(const Vec& b, double margin) {
  Vec s = b;
  std::sort(s.rbegin(), s.rend());
  return s[0] - s[1] > margin;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; i++) p.push_back((i * 11 + salt * 5 + 2) % kVocab);
  return p;
}

ModelConfig target_config() {
  return parse_model_config(read_text_file(target_dir() + "/config.json"), "target");
}

EngineOptions target_options(bool with_head, bool prefix_caching = false) {
  EngineOptions o;
  o.model_dir = target_dir();
  if (with_head) o.eagle3_dir = head_dir();
  o.kv_cache_bytes = size_t(1) << 22;
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  return o;
}

std::vector<float> as_f32(const std::vector<Vec>& rows) {
  std::vector<float> out;
  for (const Vec& r : rows)
    for (double v : r) out.push_back(float(v));
  return out;
}

}  // namespace

TEST_CASE(head_matches_float64_reference) {
  const std::vector<int32_t> tokens = prompt_of(21, 1);
  const TargetRun tr = run_target(std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
  const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
  const HeadRun ref = run_head(tr.features, next, 4);

  CheckpointWeights tw(target_dir());
  cpu::ThreadPool pool(2);
  Eagle3Head head(head_dir(), target_config(), *tw.st->find("model.embed_tokens.weight"), pool, 4096);
  CHECK(head.config().aux_layers == kAux);
  CHECK(head.config().draft_vocab == kDraftVocab);
  std::vector<std::vector<float>> seen;
  head.logits_observer = [&](int64_t R, const float* logits) { seen.emplace_back(logits, logits + R * kDraftVocab); };
  const std::vector<float> feats = as_f32(tr.features);
  std::vector<int32_t> drafts;
  head.run({{5, feats.data(), 3 * kH, next.data(), 0, int64_t(next.size()), 4, &drafts}});
  CHECK(seen.size() == 4);
  CHECK(drafts.size() == 4);
  for (size_t j = 0; j < std::min<size_t>(4, seen.size()); j++) {
    const double err = rel_err(seen[j].data(), ref.logits[j]);
    if (err > 1e-4) std::printf("  round %zu: logits off by %.3g of the largest\n", j, err);
    CHECK(err <= 1e-4);
  }
  // Drafts are the reference's argmax mapped through d2t (every round's winner is clear).
  for (size_t j = 0; j < ref.logits.size(); j++) CHECK(clear_winner(ref.logits[j], 1e-3));
  CHECK(drafts == ref.drafts);
  for (int32_t d : drafts) CHECK(d % 2 == 1 && d < 2 * kDraftVocab);
  CHECK(head.num_entries(5) == int64_t(next.size()));
}

TEST_CASE(head_context_in_pieces_equals_one_pass) {
  const std::vector<int32_t> tokens = prompt_of(25, 2);
  const TargetRun tr = run_target(std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
  const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
  const std::vector<float> feats = as_f32(tr.features);
  CheckpointWeights tw(target_dir());
  cpu::ThreadPool pool(2);
  Eagle3Head head(head_dir(), target_config(), *tw.st->find("model.embed_tokens.weight"), pool, 4096);
  std::vector<std::vector<float>> seen;
  head.logits_observer = [&](int64_t R, const float* logits) { seen.emplace_back(logits, logits + R * kDraftVocab); };
  std::vector<int32_t> one, scratch;
  head.run({{1, feats.data(), 3 * kH, next.data(), 0, 24, 3, &one}});
  const std::vector<std::vector<float>> whole = seen;
  // The same positions in three calls, drafting between them (temporary entries overwritten), and
  // beside another sequence in the same calls.
  seen.clear();
  std::vector<int32_t> pieces, other;
  const int64_t cuts[] = {0, 7, 8, 24};
  for (int c = 0; c < 3; c++) {
    pieces.clear();
    other.clear();
    head.run({{2, feats.data() + cuts[c] * 3 * kH, 3 * kH, next.data() + cuts[c], cuts[c], cuts[c + 1] - cuts[c], 3, &pieces},
              {3, feats.data(), 3 * kH, next.data(), 0, 5, c == 2 ? 0 : 2, &other}});
  }
  CHECK(pieces == one);
  CHECK(head.num_entries(2) == 24);
  CHECK(head.num_entries(3) == 15);
  // The last call's rounds: sequence 2's rows are first; compare them to the one pass.
  CHECK(seen.size() >= 3);
  for (size_t j = 0; j < 3 && j + 3 <= seen.size(); j++) {
    const std::vector<float>& got = seen[seen.size() - 3 + j];
    double err = 0;
    for (int i = 0; i < kDraftVocab; i++) err = std::max(err, double(std::abs(got[size_t(i)] - whole[j][size_t(i)])));
    CHECK(err < 1e-4);
  }
  head.remove(2);
  CHECK(head.num_entries(2) == -1);
}

TEST_CASE(engine_drafts_from_captured_hidden_states) {
  auto e = Engine::load(target_options(true));
  const EngineInfo info = e->info();
  CHECK(info.eagle3_draft_vocab == kDraftVocab);
  CHECK(info.eagle3_aux_layers == kAux);
  // A prompt whose greedy token and drafts are clear winners in the reference (so float32 and
  // float64 agree on them); most are.
  std::vector<int32_t> prompt;
  TargetRun tr;
  int32_t greedy = -1;
  HeadRun ref;
  for (int salt = 3; salt < 40 && greedy < 0; salt++) {
    prompt = prompt_of(19, salt);
    tr = run_target(prompt);
    if (!clear_winner(tr.last_logits, 1e-3)) continue;
    const int32_t best = int32_t(std::max_element(tr.last_logits.begin(), tr.last_logits.end()) - tr.last_logits.begin());
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(best);
    ref = run_head(tr.features, next, 4);
    if (std::all_of(ref.logits.begin(), ref.logits.end(), [](const Vec& l) { return clear_winner(l, 1e-3); })) greedy = best;
  }
  CHECK(greedy >= 0);
  e->add_sequence(9, prompt, SamplingParams{0.f, 1.f, 0, 0, 0});
  StepPlan plan;
  plan.seq_ids = {9};
  plan.num_tokens = {100};
  plan.num_next_drafts = {4};
  const StepResult r = e->step(plan);
  CHECK(r.tokens.size() == 1);
  CHECK(r.row_next_drafts.size() == 1 && r.row_next_drafts[0] == 4);
  // The reference: the target's greedy token, then the head over the target's hidden states.
  CHECK(!r.tokens.empty() && r.tokens[0] == greedy);
  CHECK(r.next_drafts == ref.drafts);
  // A row that does not ask gets none; the head's context still grows.
  StepPlan quiet;
  quiet.seq_ids = {9};
  quiet.num_tokens = {1};
  const StepResult q = e->step(quiet);
  CHECK(q.row_next_drafts.size() == 1 && q.row_next_drafts[0] == 0 && q.next_drafts.empty());
}

// Greedy output with the head's drafts verified equals output without them, alone and with a
// prefix-cache hit (the head then lacks the cached positions).
TEST_CASE(greedy_output_unchanged_with_head_drafts) {
  for (bool caching : {false, true}) {
    auto plain = Engine::load(target_options(false, caching));
    auto spec = Engine::load(target_options(true, caching));
    for (uint32_t id = 1; id <= 2; id++) {
      const std::vector<int32_t> prompt = prompt_of(13, 4);  // the same prompt twice: a hit when caching
      const SamplingParams greedy{0.f, 1.f, 0, 0, 0};
      plain->add_sequence(id, prompt, greedy);
      const int64_t cached = spec->add_sequence(id, prompt, greedy);
      if (caching && id == 2) CHECK(cached > 0);
      std::vector<int32_t> a, b, drafts;
      int steps = 0, drafted = 0;
      while (a.size() < 40) {
        StepPlan p;
        p.seq_ids = {id};
        p.num_tokens = {100};
        const StepResult r = plain->step(p);
        a.insert(a.end(), r.tokens.begin(), r.tokens.end());
      }
      while (b.size() < 40 && steps < 100) {
        StepPlan p;
        p.seq_ids = {id};
        p.num_tokens = {uint32_t(100)};
        p.num_drafts = {uint32_t(drafts.size())};
        p.drafts = drafts;
        p.num_next_drafts = {3};
        const StepResult r = spec->step(p);
        steps++;
        drafted += int(r.row_drafted[0]);
        b.insert(b.end(), r.tokens.begin(), r.tokens.end());
        drafts = r.next_drafts;
        CHECK(r.row_next_drafts[0] == r.next_drafts.size());
      }
      b.resize(std::min(b.size(), size_t(40)));
      CHECK(a.size() >= 40);
      a.resize(40);
      CHECK(a == b);
      CHECK(drafted > 0);
      plain->free_sequence(id);
      spec->free_sequence(id);
    }
  }
}

TEST_CASE(load_checks) {
  auto load_with = [](const std::string& head) {
    EngineOptions o;
    o.model_dir = target_dir();
    o.eagle3_dir = head;
    o.kv_cache_bytes = size_t(1) << 20;
    o.num_threads = 1;
    Engine::load(o);
  };
  HeadSpec bad_vocab;
  bad_vocab.vocab = kVocab + 1;
  const std::string d1 = temp_dir("eagle3-bad-vocab");
  write_head(d1, bad_vocab);
  CHECK_THROWS_CODE(load_with(d1), ErrorCode::kInvalidArgument);
  HeadSpec no_aux;
  no_aux.aux_ids = false;  // a 4-layer target has no default aux layers
  const std::string d2 = temp_dir("eagle3-no-aux");
  write_head(d2, no_aux);
  CHECK_THROWS_CODE(load_with(d2), ErrorCode::kInvalidArgument);
  HeadSpec no_fc;
  no_fc.drop_fc = true;
  const std::string d3 = temp_dir("eagle3-no-fc");
  write_head(d3, no_fc);
  CHECK_THROWS_CODE(load_with(d3), ErrorCode::kModelFileInvalid);
  // A target checkpoint is not a head.
  CHECK_THROWS_CODE(load_with(target_dir()), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(load_with(temp_dir("eagle3-missing")), ErrorCode::kModelFileMissing);
}

int main() { return sluice_test::run_all("eagle3"); }
