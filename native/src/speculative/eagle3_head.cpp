#include "speculative/eagle3_head.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "sluice/error.h"
#include "util/json.h"

namespace sluice {

namespace {

constexpr int64_t kBlockSize = 16;

[[noreturn]] void invalid(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::kModelFileInvalid, source + ": " + what);
}

int64_t json_int(const json::Value& v, const std::string& source, const char* what) {
  if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || v.as_number() < 0)
    invalid(source, std::string(what) + " must be a non-negative integer");
  return int64_t(v.as_number());
}

}  // namespace

Eagle3Config parse_eagle3_config(const std::string& dir, const ModelConfig& target) {
  const std::string path = (dir.empty() || dir.back() == '/' ? dir : dir + "/") + "config.json";
  const std::string text = read_text_file(path);
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    invalid(path, e.what());
  }
  if (!root.is_object()) invalid(path, "expected a JSON object");
  const json::Value* archs = root.find("architectures");
  const std::string arch = archs && archs->is_array() && !archs->as_array().empty() && archs->as_array()[0].is_string()
                               ? archs->as_array()[0].as_string()
                               : std::string();
  if (arch.find("Eagle3") == std::string::npos && arch.find("EAGLE3") == std::string::npos)
    throw Error(ErrorCode::kUnsupportedModel, path + ": not an EAGLE-3 head (architectures names " +
                                                  (arch.empty() ? std::string("nothing") : arch) +
                                                  "; expected e.g. LlamaForCausalLMEagle3)");
  Eagle3Config c;
  c.layer = parse_model_config(text, path, "LlamaForCausalLM");
  if (c.layer.num_layers != 1)
    throw Error(ErrorCode::kUnsupportedModel, path + ": EAGLE-3 heads of " + std::to_string(c.layer.num_layers) +
                                                  " layers are not supported (one midlayer)");
  if (c.layer.qkv_bias || c.layer.o_bias) throw Error(ErrorCode::kUnsupportedModel, path + ": attention biases are not supported in EAGLE-3 heads");
  const json::Value* dv = root.find("draft_vocab_size");
  c.draft_vocab = dv && !dv->is_null() ? json_int(*dv, path, "draft_vocab_size") : c.layer.vocab_size;
  const json::Value* th = root.find("target_hidden_size");
  c.target_hidden = th && !th->is_null() ? json_int(*th, path, "target_hidden_size") : c.layer.hidden_size;
  if (const json::Value* nbr = root.find("norm_before_residual"); nbr && nbr->is_bool()) c.norm_before_residual = nbr->as_bool();
  if (c.draft_vocab < 1 || c.draft_vocab > c.layer.vocab_size)
    invalid(path, "draft_vocab_size must be in [1, vocab_size]");

  if (c.layer.vocab_size != target.vocab_size)
    throw Error(ErrorCode::kInvalidArgument, path + ": the head's vocab_size " + std::to_string(c.layer.vocab_size) +
                                                 " is not the target's " + std::to_string(target.vocab_size));
  if (c.target_hidden != target.hidden_size)
    throw Error(ErrorCode::kInvalidArgument, path + ": the head reads hidden states of width " + std::to_string(c.target_hidden) +
                                                 ", the target's are " + std::to_string(target.hidden_size));
  const int64_t L = target.num_layers;
  const json::Value* ec = root.find("eagle_config");
  const json::Value* ids = ec && ec->is_object() ? ec->find("eagle_aux_hidden_state_layer_ids") : nullptr;
  if (ids && !ids->is_null()) {
    if (!ids->is_array() || ids->as_array().size() != 3) invalid(path, "eagle_config.eagle_aux_hidden_state_layer_ids must hold 3 layer ids");
    for (const json::Value& v : ids->as_array()) c.aux_layers.push_back(json_int(v, path, "eagle_aux_hidden_state_layer_ids"));
  } else {
    if (L < 7) throw Error(ErrorCode::kInvalidArgument, path + ": a target of " + std::to_string(L) +
                                                            " layers needs eagle_config.eagle_aux_hidden_state_layer_ids");
    c.aux_layers = {2, L / 2, L - 3};
  }
  for (int64_t l : c.aux_layers)
    if (l >= L)
      throw Error(ErrorCode::kInvalidArgument, path + ": aux hidden state layer " + std::to_string(l) + " is past the target's " +
                                                   std::to_string(L) + " layers");
  return c;
}

struct Eagle3Head::Impl {
  explicit Impl(cpu::ThreadPool& p) : pool(p) {}
  ~Impl() {
    if (kv_mem) ::munmap(kv_mem, kv_bytes);
  }

  cpu::ThreadPool& pool;
  std::unique_ptr<SafetensorsModel> st;
  TensorView embed, fc, hidden_norm, input_norm, post_norm, q, k, v, o, gate, up, down, norm, lm_head;
  std::vector<int32_t> draft_to_target;  // [draft_vocab]
  std::vector<float> inv_freq;

  void* kv_mem = nullptr;
  size_t kv_bytes = 0;
  int64_t num_blocks = 0;
  cpu::PagedKV kv;
  std::vector<int32_t> free_blocks;

  struct Seq {
    std::vector<int32_t> blocks;
    int64_t entries = 0;
  };
  std::unordered_map<uint32_t, Seq> seqs;

  // Scratch, grown to the largest call.
  std::vector<float> feats, x, out, e, hn, cat, qb, kb, vb, attn, tmp, mn, g, u, last, logits, lse;
  std::vector<int32_t> tokens, positions, entry, token_seq, slots, argmax;
  std::vector<const int32_t*> tables;

  void release(Seq& s) {
    free_blocks.insert(free_blocks.end(), s.blocks.begin(), s.blocks.end());
    s.blocks.clear();
    s.entries = 0;
  }
  // Blocks for entries [0, n); false when the pool cannot give them.
  bool reserve(Seq& s, int64_t n) {
    const int64_t need = (n + kBlockSize - 1) / kBlockSize - int64_t(s.blocks.size());
    if (need <= 0) return true;
    if (need > int64_t(free_blocks.size())) return false;
    for (int64_t i = 0; i < need; i++) {
      s.blocks.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    return true;
  }

  void layer(const Eagle3Config& c, int64_t T, const float* xin, float* y);
  void draft_tokens(const Eagle3Config& c, int64_t R, const float* hidden_rows, int32_t* drafts);
};

Eagle3Head::Eagle3Head(const std::string& dir, const ModelConfig& target, const TensorView& target_embed,
                       cpu::ThreadPool& pool, int64_t max_entries)
    : impl_(std::make_unique<Impl>(pool)), cfg_(parse_eagle3_config(dir, target)) {
  Impl& m = *impl_;
  m.st = SafetensorsModel::open_dir(dir);
  const ModelConfig& L = cfg_.layer;
  const int64_t H = L.hidden_size, qd = L.num_heads * L.head_dim, kvd = L.num_kv_heads * L.head_dim;
  auto need = [&](const char* name, std::vector<int64_t> shape) {
    const TensorView* t = m.st->find(name);
    if (!t) throw Error(ErrorCode::kModelFileInvalid, dir + ": the EAGLE-3 head has no tensor " + name);
    if (!is_float_dtype(t->dtype))
      throw Error(ErrorCode::kUnsupportedModel, dir + ": tensor " + name + " is " + dtype_name(t->dtype) + " (f32, f16 or bf16 expected)");
    if (t->shape != shape) {
      TensorView want;
      want.shape = shape;
      throw Error(ErrorCode::kModelFileInvalid, dir + ": tensor " + name + " has shape " + t->shape_string() + ", expected " +
                                                    want.shape_string());
    }
    return *t;
  };
  m.fc = need("fc.weight", {H, 3 * cfg_.target_hidden});
  m.hidden_norm = need("midlayer.hidden_norm.weight", {H});
  m.input_norm = need("midlayer.input_layernorm.weight", {H});
  m.post_norm = need("midlayer.post_attention_layernorm.weight", {H});
  m.q = need("midlayer.self_attn.q_proj.weight", {qd, 2 * H});
  m.k = need("midlayer.self_attn.k_proj.weight", {kvd, 2 * H});
  m.v = need("midlayer.self_attn.v_proj.weight", {kvd, 2 * H});
  m.o = need("midlayer.self_attn.o_proj.weight", {H, qd});
  m.gate = need("midlayer.mlp.gate_proj.weight", {L.intermediate_size, H});
  m.up = need("midlayer.mlp.up_proj.weight", {L.intermediate_size, H});
  m.down = need("midlayer.mlp.down_proj.weight", {H, L.intermediate_size});
  m.norm = need("norm.weight", {H});
  m.lm_head = need("lm_head.weight", {cfg_.draft_vocab, H});
  if (m.st->find("embed_tokens.weight")) m.embed = need("embed_tokens.weight", {L.vocab_size, H});
  else if (m.st->find("model.embed_tokens.weight")) m.embed = need("model.embed_tokens.weight", {L.vocab_size, H});
  else if (H == target.hidden_size && is_float_dtype(target_embed.dtype)) m.embed = target_embed;
  else throw Error(ErrorCode::kModelFileInvalid, dir + ": the head has no embed_tokens.weight and cannot share the target's");

  // d2t: target id = draft id + d2t[draft id]. Absent: the draft vocabulary is the target's.
  m.draft_to_target.resize(size_t(cfg_.draft_vocab));
  const TensorView* d2t = m.st->find("d2t");
  if (!d2t) {
    if (cfg_.draft_vocab != L.vocab_size) throw Error(ErrorCode::kModelFileInvalid, dir + ": a reduced draft vocabulary needs the d2t tensor");
    for (int64_t i = 0; i < cfg_.draft_vocab; i++) m.draft_to_target[size_t(i)] = int32_t(i);
  } else {
    if (d2t->shape != std::vector<int64_t>{cfg_.draft_vocab} || (d2t->dtype != DType::I64 && d2t->dtype != DType::I32))
      throw Error(ErrorCode::kModelFileInvalid, dir + ": d2t must be an int64 vector of draft_vocab_size entries, got " +
                                                    dtype_name(d2t->dtype) + " " + d2t->shape_string());
    for (int64_t i = 0; i < cfg_.draft_vocab; i++) {
      int64_t off;
      if (d2t->dtype == DType::I64) std::memcpy(&off, static_cast<const uint8_t*>(d2t->data) + 8 * i, 8);
      else {
        int32_t o32;
        std::memcpy(&o32, static_cast<const uint8_t*>(d2t->data) + 4 * i, 4);
        off = o32;
      }
      const int64_t id = i + off;
      if (id < 0 || id >= L.vocab_size)
        throw Error(ErrorCode::kModelFileInvalid, dir + ": d2t maps draft token " + std::to_string(i) + " to " + std::to_string(id) +
                                                      ", outside the vocabulary");
      m.draft_to_target[size_t(i)] = int32_t(id);
    }
  }
  m.inv_freq = L.rope_inv_freq();

  m.num_blocks = std::max<int64_t>(1, (max_entries + kBlockSize - 1) / kBlockSize);
  const size_t row = size_t(kBlockSize * kvd) * sizeof(float);
  m.kv_bytes = 2 * row * size_t(m.num_blocks);
  void* p = ::mmap(nullptr, m.kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error(ErrorCode::kOutOfMemory, "cannot reserve " + std::to_string(m.kv_bytes) + " bytes for the EAGLE-3 head's cache");
  m.kv_mem = p;
  m.kv.k = p;
  m.kv.v = static_cast<uint8_t*>(p) + row * size_t(m.num_blocks);
  m.kv.dtype = DType::F32;
  m.kv.block_size = kBlockSize;
  m.kv.n_kv_heads = L.num_kv_heads;
  m.kv.head_dim = L.head_dim;
  m.free_blocks.reserve(size_t(m.num_blocks));
  for (int64_t b = m.num_blocks - 1; b >= 0; b--) m.free_blocks.push_back(int32_t(b));
}

Eagle3Head::~Eagle3Head() = default;

size_t Eagle3Head::weight_bytes() const { return impl_->st->total_bytes(); }
size_t Eagle3Head::kv_bytes() const { return impl_->kv_bytes; }

int64_t Eagle3Head::num_entries(uint32_t seq_id) const {
  auto it = impl_->seqs.find(seq_id);
  return it == impl_->seqs.end() ? -1 : it->second.entries;
}

void Eagle3Head::remove(uint32_t seq_id) {
  auto it = impl_->seqs.find(seq_id);
  if (it == impl_->seqs.end()) return;
  impl_->release(it->second);
  impl_->seqs.erase(it);
}

// The midlayer over T rows whose tokens, positions, entries, token_seq and tables are set:
// y = its output before the final norm (the hidden state the next draft step reads).
void Eagle3Head::Impl::layer(const Eagle3Config& c, int64_t T, const float* xin, float* y) {
  const ModelConfig& L = c.layer;
  const int64_t H = L.hidden_size, hd = L.head_dim, nq = L.num_heads, nkv = L.num_kv_heads, I = L.intermediate_size;
  const float eps = float(L.rms_norm_eps);
  const size_t t = size_t(T);
  e.resize(t * size_t(H));
  hn.resize(t * size_t(H));
  cat.resize(t * size_t(2 * H));
  qb.resize(t * size_t(nq * hd));
  kb.resize(t * size_t(nkv * hd));
  vb.resize(t * size_t(nkv * hd));
  attn.resize(t * size_t(nq * hd));
  tmp.resize(t * size_t(H));
  mn.resize(t * size_t(H));
  g.resize(t * size_t(I));
  u.resize(t * size_t(I));
  slots.resize(t);

  // The attention input: [input_layernorm(embed(token)), hidden_norm(x)].
  cpu::embedding(pool, tokens.data(), T, embed.data, embed.dtype, H, e.data());
  cpu::rmsnorm(pool, e.data(), T, H, input_norm.data, input_norm.dtype, eps, e.data());
  cpu::rmsnorm(pool, xin, T, H, hidden_norm.data, hidden_norm.dtype, eps, hn.data());
  for (int64_t r = 0; r < T; r++) {
    std::memcpy(cat.data() + r * 2 * H, e.data() + r * H, size_t(H) * sizeof(float));
    std::memcpy(cat.data() + r * 2 * H + H, hn.data() + r * H, size_t(H) * sizeof(float));
  }
  std::memcpy(y, c.norm_before_residual ? hn.data() : xin, t * size_t(H) * sizeof(float));

  const cpu::LinearOut qkv[3] = {{q.data, q.dtype, nq * hd, nullptr, DType::F32, qb.data()},
                                 {k.data, k.dtype, nkv * hd, nullptr, DType::F32, kb.data()},
                                 {v.data, v.dtype, nkv * hd, nullptr, DType::F32, vb.data()}};
  cpu::matmul_multi(pool, cat.data(), T, 2 * H, qkv, 3);
  cpu::rope(pool, qb.data(), T, nq, hd, L.rotary_dim(), inv_freq.data(), positions.data());
  cpu::rope(pool, kb.data(), T, nkv, hd, L.rotary_dim(), inv_freq.data(), positions.data());
  for (int64_t r = 0; r < T; r++) {
    const int32_t* table = tables[size_t(token_seq[size_t(r)])];
    const int64_t en = entry[size_t(r)];
    slots[size_t(r)] = int32_t(int64_t(table[en / kBlockSize]) * kBlockSize + en % kBlockSize);
  }
  cpu::kv_write(pool, kv, kb.data(), vb.data(), slots.data(), T);
  cpu::AttentionBatch ab;
  ab.token_seq = token_seq.data();
  ab.token_pos = entry.data();  // entries are contiguous per sequence: entry index = causal order
  ab.block_tables = tables.data();
  ab.n_heads = nq;
  ab.scale = float(L.softmax_scale());
  cpu::paged_attention(pool, qb.data(), T, ab, kv, attn.data());
  cpu::matmul(pool, attn.data(), T, nq * hd, o.data, o.dtype, H, nullptr, DType::F32, tmp.data());
  cpu::add_inplace(pool, y, tmp.data(), T * H);

  cpu::rmsnorm(pool, y, T, H, post_norm.data, post_norm.dtype, eps, mn.data());
  const cpu::LinearOut gu[2] = {{gate.data, gate.dtype, I, nullptr, DType::F32, g.data()},
                                {up.data, up.dtype, I, nullptr, DType::F32, u.data()}};
  cpu::matmul_multi(pool, mn.data(), T, H, gu, 2);
  cpu::silu_mul_split(pool, g.data(), u.data(), T, I, g.data());
  cpu::matmul(pool, g.data(), T, I, down.data, down.dtype, H, nullptr, DType::F32, tmp.data());
  cpu::add_inplace(pool, y, tmp.data(), T * H);
}

// Greedy drafts (target ids) of R hidden rows [R, H].
void Eagle3Head::Impl::draft_tokens(const Eagle3Config& c, int64_t R, const float* hidden_rows, int32_t* drafts) {
  const int64_t H = c.layer.hidden_size, DV = c.draft_vocab;
  last.resize(size_t(R * H));
  logits.resize(size_t(R * DV));
  lse.resize(size_t(R));
  argmax.resize(size_t(R));
  cpu::rmsnorm(pool, hidden_rows, R, H, norm.data, norm.dtype, float(c.layer.rms_norm_eps), last.data());
  cpu::matmul(pool, last.data(), R, H, lm_head.data, lm_head.dtype, DV, nullptr, DType::F32, logits.data());
  cpu::logits_stats(pool, logits.data(), R, DV, argmax.data(), lse.data());
  for (int64_t r = 0; r < R; r++) drafts[r] = draft_to_target[size_t(argmax[size_t(r)])];
}

void Eagle3Head::run(const std::vector<Update>& updates) {
  Impl& m = *impl_;
  const ModelConfig& L = cfg_.layer;
  const int64_t H = L.hidden_size, F = 3 * cfg_.target_hidden;
  // Round 0: every update's new positions, from the target's features.
  struct Live {
    const Update* u;
    Impl::Seq* seq;
    int64_t base;  // the sequence's entries before this call
  };
  std::vector<Live> live;
  live.reserve(updates.size());
  int64_t T = 0;
  for (const Update& u : updates) {
    if (u.n <= 0) continue;
    Impl::Seq& s = m.seqs[u.seq_id];
    // Room for the new entries and the drafts' temporary ones; else the sequence starts over.
    if (!m.reserve(s, s.entries + u.n + std::max(0, u.k - 1))) {
      m.release(s);
      if (!m.reserve(s, u.n + std::max(0, u.k - 1))) continue;
    }
    live.push_back({&u, &s, s.entries});
    T += u.n;
  }
  if (T == 0) return;
  const size_t t = size_t(T);
  m.feats.resize(t * size_t(F));
  m.x.resize(t * size_t(H));
  m.out.resize(t * size_t(H));
  m.tokens.resize(t);
  m.positions.resize(t);
  m.entry.resize(t);
  m.token_seq.resize(t);
  m.tables.resize(live.size());
  int64_t r = 0;
  for (size_t i = 0; i < live.size(); i++) {
    const Update& u = *live[i].u;
    m.tables[i] = live[i].seq->blocks.data();
    for (int64_t j = 0; j < u.n; j++, r++) {
      std::memcpy(m.feats.data() + r * F, u.features + j * u.stride, size_t(F) * sizeof(float));
      m.tokens[size_t(r)] = u.next_tokens[j];
      m.positions[size_t(r)] = int32_t(u.first + j);
      m.entry[size_t(r)] = int32_t(live[i].base + j);
      m.token_seq[size_t(r)] = int32_t(i);
    }
  }
  cpu::matmul(m.pool, m.feats.data(), T, F, m.fc.data, m.fc.dtype, H, nullptr, DType::F32, m.x.data());
  m.layer(cfg_, T, m.x.data(), m.out.data());
  for (Live& l : live) l.seq->entries += l.u->n;

  // Drafting rounds: each drafting sequence's last output row, then its own outputs fed back.
  std::vector<size_t> drafting;  // indices into live
  std::vector<float> hidden;     // [drafting, H]
  r = 0;
  for (size_t i = 0; i < live.size(); i++) {
    r += live[i].u->n;
    if (live[i].u->k <= 0) continue;
    drafting.push_back(i);
    hidden.insert(hidden.end(), m.out.begin() + (r - 1) * H, m.out.begin() + r * H);
  }
  std::vector<int32_t> next(drafting.size());
  for (int round = 0; !drafting.empty(); round++) {
    const int64_t R = int64_t(drafting.size());
    m.draft_tokens(cfg_, R, hidden.data(), next.data());
    if (logits_observer) logits_observer(R, m.logits.data());
    for (int64_t d = 0; d < R; d++) live[drafting[size_t(d)]].u->drafts->push_back(next[size_t(d)]);
    // The sequences that want another draft run one more row each.
    std::vector<size_t> still;
    std::vector<float> x_next;
    std::vector<int32_t> tok_next;
    for (int64_t d = 0; d < R; d++) {
      const Live& l = live[drafting[size_t(d)]];
      if (round + 1 >= l.u->k) continue;
      still.push_back(drafting[size_t(d)]);
      x_next.insert(x_next.end(), hidden.begin() + d * H, hidden.begin() + (d + 1) * H);
      tok_next.push_back(next[size_t(d)]);
    }
    drafting.swap(still);
    if (drafting.empty()) break;
    const int64_t n = int64_t(drafting.size());
    m.tokens.assign(tok_next.begin(), tok_next.end());
    m.positions.resize(size_t(n));
    m.entry.resize(size_t(n));
    m.token_seq.resize(size_t(n));
    for (int64_t d = 0; d < n; d++) {
      const Live& l = live[drafting[size_t(d)]];
      // Temporary entries past the committed ones: the next call overwrites them.
      m.positions[size_t(d)] = int32_t(l.u->first + l.u->n + round);
      m.entry[size_t(d)] = int32_t(l.seq->entries + round);
      m.token_seq[size_t(d)] = int32_t(drafting[size_t(d)]);
    }
    hidden.resize(size_t(n * H));
    m.layer(cfg_, n, x_next.data(), hidden.data());
    next.resize(size_t(n));
  }
}

}  // namespace sluice
