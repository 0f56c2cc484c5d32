// A float64 reference of the tiny Llama-family checkpoints the native tests write
// (tiny_model_writer.h: rotate-half rope, GQA, RMSNorm, SiLU-gated MLP, no biases), written
// independently of the engine, over a weight getter (so a test can hand it merged weights).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace sluice_test {

using Vec = std::vector<double>;
using WeightFn = std::function<Vec(const std::string& name)>;

struct RefDims {
  int hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, inter = 128, layers = 2, vocab = 96;
  double eps = 1e-5, theta = 10000.0;
};

// A checkpoint's tensors as float64, by name.
struct CheckpointWeights {
  std::unique_ptr<sluice::SafetensorsModel> st;
  explicit CheckpointWeights(const std::string& dir) : st(sluice::SafetensorsModel::open_dir(dir)) {}
  Vec get(const std::string& name) const {
    const sluice::TensorView* t = st->find(name);
    if (!t) throw std::runtime_error("no tensor " + name);
    Vec v(size_t(t->numel()));
    for (int64_t i = 0; i < t->numel(); i++) v[size_t(i)] = t->float_at(i);
    return v;
  }
};

inline Vec ref_rms(const Vec& x, const Vec& w, double eps = 1e-5) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = x[i] * r * w[i];
  return out;
}

// y = W x, W [N, K] row-major.
inline Vec ref_mv(const Vec& W, const Vec& x, size_t N) {
  const size_t K = x.size();
  Vec y(N, 0.0);
  for (size_t n = 0; n < N; n++)
    for (size_t k = 0; k < K; k++) y[n] += W[n * K + k] * x[k];
  return y;
}

// Rotate-half rope of `heads` heads of head_dim hd at position pos, in place.
inline void ref_rope(Vec& x, int heads, int hd, int64_t pos, double theta = 10000.0) {
  for (int h = 0; h < heads; h++)
    for (int i = 0; i < hd / 2; i++) {
      const double f = std::pow(theta, -2.0 * i / hd) * double(pos);
      double& a = x[size_t(h * hd + i)];
      double& b = x[size_t(h * hd + i + hd / 2)];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(f) - b0 * std::sin(f);
      b = b0 * std::cos(f) + a0 * std::sin(f);
    }
}

// One attention row over cached K/V (all of them), GQA.
inline Vec ref_attend(const Vec& q, const std::vector<Vec>& K, const std::vector<Vec>& V, int heads, int kv_heads, int hd) {
  Vec out(size_t(heads * hd), 0.0);
  for (int h = 0; h < heads; h++) {
    const int g = h / (heads / kv_heads);
    std::vector<double> s(K.size());
    double mx = -1e300;
    for (size_t j = 0; j < K.size(); j++) {
      double d = 0;
      for (int i = 0; i < hd; i++) d += q[size_t(h * hd + i)] * K[j][size_t(g * hd + i)];
      s[j] = d / std::sqrt(double(hd));
      mx = std::max(mx, s[j]);
    }
    double z = 0;
    for (double& v : s) z += (v = std::exp(v - mx));
    for (size_t j = 0; j < K.size(); j++)
      for (int i = 0; i < hd; i++) out[size_t(h * hd + i)] += s[j] / z * V[j][size_t(g * hd + i)];
  }
  return out;
}

inline Vec ref_silu_mlp(const Vec& x, const Vec& gate, const Vec& up, const Vec& down, size_t inter) {
  Vec g = ref_mv(gate, x, inter), u = ref_mv(up, x, inter);
  for (size_t i = 0; i < inter; i++) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return ref_mv(down, g, x.size());
}

struct LlamaRun {
  std::vector<std::vector<Vec>> layer_inputs;  // [layers][T]: the residual stream entering each layer
  std::vector<Vec> logits;                     // [T]
};

// The model over `tokens` (positions 0..T-1), weights by their checkpoint names.
inline LlamaRun run_llama(const RefDims& d, const WeightFn& w, const std::vector<int32_t>& tokens) {
  const size_t T = tokens.size(), H = size_t(d.hidden);
  const Vec embed = w("model.embed_tokens.weight");
  std::vector<Vec> x(T);
  for (size_t t = 0; t < T; t++) x[t] = Vec(embed.begin() + long(size_t(tokens[t]) * H), embed.begin() + long(size_t(tokens[t] + 1) * H));
  LlamaRun run;
  for (int l = 0; l < d.layers; l++) {
    run.layer_inputs.push_back(x);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec wi = w(p + "input_layernorm.weight"), wp = w(p + "post_attention_layernorm.weight");
    const Vec wq = w(p + "self_attn.q_proj.weight"), wk = w(p + "self_attn.k_proj.weight"), wv = w(p + "self_attn.v_proj.weight"),
              wo = w(p + "self_attn.o_proj.weight");
    const Vec wg = w(p + "mlp.gate_proj.weight"), wu = w(p + "mlp.up_proj.weight"), wd = w(p + "mlp.down_proj.weight");
    std::vector<Vec> K, V, next(T);
    for (size_t t = 0; t < T; t++) {
      const Vec xn = ref_rms(x[t], wi, d.eps);
      Vec q = ref_mv(wq, xn, size_t(d.heads * d.head_dim)), k = ref_mv(wk, xn, size_t(d.kv_heads * d.head_dim));
      ref_rope(q, d.heads, d.head_dim, int64_t(t), d.theta);
      ref_rope(k, d.kv_heads, d.head_dim, int64_t(t), d.theta);
      K.push_back(k);
      V.push_back(ref_mv(wv, xn, size_t(d.kv_heads * d.head_dim)));
      const Vec o = ref_mv(wo, ref_attend(q, K, V, d.heads, d.kv_heads, d.head_dim), H);
      Vec y = x[t];
      for (size_t i = 0; i < H; i++) y[i] += o[i];
      const Vec m = ref_silu_mlp(ref_rms(y, wp, d.eps), wg, wu, wd, size_t(d.inter));
      for (size_t i = 0; i < H; i++) y[i] += m[i];
      next[t] = y;
    }
    x = next;
  }
  const Vec lm = w("lm_head.weight"), norm = w("model.norm.weight");
  for (size_t t = 0; t < T; t++) run.logits.push_back(ref_mv(lm, ref_rms(x[t], norm, d.eps), size_t(d.vocab)));
  return run;
}

}  // namespace sluice_test
