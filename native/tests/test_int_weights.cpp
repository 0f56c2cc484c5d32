// AWQ and GPTQ linear weights: stored tensors packed here from the published descriptions
// (independently of the loader), repacked by model/int_weights.h, and every weight checked
// exactly against scale * (code - zero); plus config.json's quantization_config for both.
#include <cstring>
#include <random>
#include <vector>

#include "cpu/gemm_q4.h"
#include "cpu/gemm_q8.h"
#include "cpu/thread_pool.h"
#include "model/int_weights.h"
#include "model/model_weights.h"
#include "model/quantize.h"
#include "sluice/error.h"
#include "sluice/model_config.h"
#include "test_util.h"

using namespace sluice;

namespace {

// A linear's codes, groups, zeros (as the dequantizer uses them) and scales, drawn at random.
struct Plain {
  int64_t N, K, ng;
  std::vector<int> code;    // [N, K]
  std::vector<int> group;   // [K]
  std::vector<int> zero;    // [ng, N], true zero points
  std::vector<uint16_t> scale;  // [ng, N] f16
  double w(int64_t j, int64_t k) const {
    const int64_t g = group[size_t(k)];
    return double(f16_to_f32(scale[size_t(g * N + j)])) * (code[size_t(j * K + k)] - zero[size_t(g * N + j)]);
  }
};

Plain draw(int64_t N, int64_t K, int64_t G, int bits, std::mt19937& rng, int zero_lo, int zero_hi) {
  Plain p{N, K, (K + G - 1) / G, {}, {}, {}, {}};
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1), zero(zero_lo, zero_hi);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int64_t i = 0; i < N * K; i++) p.code.push_back(code(rng));
  for (int64_t k = 0; k < K; k++) p.group.push_back(int(k / G));
  for (int64_t i = 0; i < p.ng * N; i++) {
    p.zero.push_back(zero(rng));
    p.scale.push_back(f32_to_f16(scale(rng)));
  }
  return p;
}

struct Stored {
  std::vector<uint32_t> qweight, qzeros;
  std::vector<int32_t> g_idx;
  IntLinear views(const Plain& p, const QuantizationConfig& q) {
    const IntLinearShapes s = int_linear_shapes(q, p.N, p.K);
    IntLinear t;
    const auto view = [](const char* name, DType dt, std::vector<int64_t> shape, const void* data, size_t bytes) {
      TensorView v;
      v.name = name;
      v.file = "test.safetensors";
      v.dtype = dt;
      v.shape = std::move(shape);
      v.data = data;
      v.nbytes = bytes;
      return v;
    };
    t.qweight = view("m.qweight", DType::I32, s.qweight, qweight.data(), qweight.size() * 4);
    t.qzeros = view("m.qzeros", DType::I32, s.qzeros, qzeros.data(), qzeros.size() * 4);
    t.scales = view("m.scales", DType::F16, s.scales, p.scale.data(), p.scale.size() * 2);
    if (!g_idx.empty()) t.g_idx = view("m.g_idx", DType::I32, {p.K}, g_idx.data(), g_idx.size() * 4);
    return t;
  }
};

// AWQ: [K, N / 8] words along the outputs; output 8c + order[i] in nibble i.
Stored pack_awq(const Plain& p) {
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  Stored s;
  s.qweight.assign(size_t(p.K * p.N / 8), 0);
  s.qzeros.assign(size_t(p.ng * p.N / 8), 0);
  for (int64_t k = 0; k < p.K; k++)
    for (int64_t c = 0; c < p.N / 8; c++)
      for (int i = 0; i < 8; i++) s.qweight[size_t(k * p.N / 8 + c)] |= uint32_t(p.code[size_t((c * 8 + order[i]) * p.K + k)]) << (4 * i);
  for (int64_t g = 0; g < p.ng; g++)
    for (int64_t c = 0; c < p.N / 8; c++)
      for (int i = 0; i < 8; i++) s.qzeros[size_t(g * p.N / 8 + c)] |= uint32_t(p.zero[size_t(g * p.N + c * 8 + order[i])]) << (4 * i);
  return s;
}

// GPTQ: [K * bits / 32, N] words along the inputs, zeros along the outputs, minus one when v1.
Stored pack_gptq(const Plain& p, int bits, bool v1, bool with_g_idx) {
  const int per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  Stored s;
  s.qweight.assign(size_t(p.K / per * p.N), 0);
  s.qzeros.assign(size_t(p.ng * p.N / per), 0);
  for (int64_t k = 0; k < p.K; k++)
    for (int64_t j = 0; j < p.N; j++) s.qweight[size_t((k / per) * p.N + j)] |= uint32_t(p.code[size_t(j * p.K + k)]) << (bits * (k % per));
  for (int64_t g = 0; g < p.ng; g++)
    for (int64_t j = 0; j < p.N; j++)
      s.qzeros[size_t(g * p.N / per + j / per)] |= (uint32_t(p.zero[size_t(g * p.N + j)] - (v1 ? 1 : 0)) & mask) << (bits * (j % per));
  if (with_g_idx)
    for (int64_t k = 0; k < p.K; k++) s.g_idx.push_back(p.group[size_t(k)]);
  return s;
}

QuantizationConfig config(IntFormat f, int bits, int64_t group, bool v1) {
  QuantizationConfig q;
  q.method = f == IntFormat::Awq ? "awq" : "gptq";
  q.int_format = f;
  q.bits = bits;
  q.group_size = group;
  q.zero_offset = v1;
  return q;
}

// Every weight of the repacked matrix, by the format it came back in, against p.w exactly.
int mismatches(const TensorView& t, const Plain& p) {
  int bad = 0;
  std::vector<float> row(static_cast<size_t>(p.K));
  for (int64_t j = 0; j < p.N; j++) {
    if (t.dtype == DType::Q4) {
      cpu::q4_dequantize_row(t.data, j, row.data());
    } else if (t.dtype == DType::Q8_0) {
      const int64_t Kp = cpu::q8_padded_k(p.K);
      for (int64_t k = 0; k < p.K; k++)
        row[size_t(k)] = float(cpu::q8_values(t.data)[j * Kp + k]) *
                         f16_to_f32(cpu::q8_scales(t.data, p.N, p.K)[j * (Kp / 32) + k / 32]);
    } else {
      std::memcpy(row.data(), static_cast<const float*>(t.data) + j * p.K, size_t(p.K) * 4);
    }
    for (int64_t k = 0; k < p.K; k++)
      if (double(row[size_t(k)]) != p.w(j, k)) {
        if (bad++ < 3) std::printf("  [%ld, %ld]: got %.9g, want %.9g\n", long(j), long(k), double(row[size_t(k)]), p.w(j, k));
      }
  }
  return bad;
}

struct Run {
  TensorView t;
  std::vector<std::shared_ptr<HostBuffer>> owned;
};
Run repack(Stored& s, const Plain& p, const QuantizationConfig& q) {
  static cpu::ThreadPool pool(2);
  Run r;
  r.t = repack_int_linear(s.views(p, q), q, p.N, p.K, "m.weight", r.owned, pool);
  return r;
}

}  // namespace

TEST_CASE(awq_4bit_repacks_to_q4_exactly) {
  std::mt19937 rng(1);
  for (const auto& [N, K, G] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 96, 32}, {24, 256, 128}, {8, 200, 64}}) {
    if (K % G) continue;
    const Plain p = draw(N, K, G, 4, rng, 0, 15);
    Stored s = pack_awq(p);
    Run r = repack(s, p, config(IntFormat::Awq, 4, G, false));
    CHECK(r.t.dtype == DType::Q4);
    CHECK(r.t.shape == std::vector<int64_t>({N, K}));
    CHECK(mismatches(r.t, p) == 0);
    CHECK(cpu::q4_view(r.t.data).perm == nullptr && cpu::q4_view(r.t.data).h->group == G);
  }
}

TEST_CASE(gptq_4bit_v1_and_v2_repack_to_q4_exactly) {
  std::mt19937 rng(2);
  // v1 stores zero - 1: a true zero of 16 is what a stored 15 means (and zero 0 cannot be stored).
  for (const bool v1 : {true, false}) {
    for (const bool g_idx : {true, false}) {
      const Plain p = draw(24, 192, 64, 4, rng, v1 ? 1 : 0, v1 ? 16 : 15);
      Stored s = pack_gptq(p, 4, v1, g_idx);
      Run r = repack(s, p, config(IntFormat::Gptq, 4, 64, v1));
      CHECK(r.t.dtype == DType::Q4);
      CHECK(mismatches(r.t, p) == 0);
    }
  }
  // group_size -1: one group over the row.
  const Plain p = draw(16, 136, 136, 4, rng, 1, 16);
  Stored s = pack_gptq(p, 4, true, true);
  Run r = repack(s, p, config(IntFormat::Gptq, 4, 0, true));
  CHECK(r.t.dtype == DType::Q4 && cpu::q4_view(r.t.data).ng == 1);
  CHECK(mismatches(r.t, p) == 0);
}

TEST_CASE(gptq_act_order_becomes_a_permutation_and_irregular_groups_f32) {
  std::mt19937 rng(3);
  Plain p = draw(16, 128, 32, 4, rng, 1, 16);
  // Act-order: inputs visited in a random order, group = position in that order / G.
  std::vector<int> order(128);
  for (int i = 0; i < 128; i++) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < 128; i++) p.group[size_t(order[size_t(i)])] = i / 32;
  Stored s = pack_gptq(p, 4, true, true);
  Run r = repack(s, p, config(IntFormat::Gptq, 4, 32, true));
  CHECK(r.t.dtype == DType::Q4 && cpu::q4_view(r.t.data).perm != nullptr);
  CHECK(mismatches(r.t, p) == 0);

  // Groups that are no whole runs of 32 columns (group 0 holds 33): exact f32.
  p.group[size_t(order[32])] = 0;
  Stored s2 = pack_gptq(p, 4, true, true);
  Run r2 = repack(s2, p, config(IntFormat::Gptq, 4, 32, true));
  CHECK(r2.t.dtype == DType::F32);
  CHECK(mismatches(r2.t, p) == 0);

  // A group that does not exist is refused by name.
  s2.g_idx[5] = 4;
  bool refused = false;
  try {
    repack(s2, p, config(IntFormat::Gptq, 4, 32, true));
  } catch (const Error& e) {
    refused = e.code() == ErrorCode::kModelFileInvalid && std::string(e.what()).find("m.g_idx") != std::string::npos;
  }
  CHECK(refused);
}

TEST_CASE(gptq_8bit_symmetric_is_q8_0_and_asymmetric_f32) {
  std::mt19937 rng(4);
  Plain p = draw(12, 160, 32, 8, rng, 128, 128);
  Stored s = pack_gptq(p, 8, true, true);
  Run r = repack(s, p, config(IntFormat::Gptq, 8, 32, true));
  CHECK(r.t.dtype == DType::Q8_0);
  CHECK(mismatches(r.t, p) == 0);

  const Plain a = draw(12, 160, 32, 8, rng, 1, 256);
  Stored sa = pack_gptq(a, 8, true, true);
  Run ra = repack(sa, a, config(IntFormat::Gptq, 8, 32, true));
  CHECK(ra.t.dtype == DType::F32);
  CHECK(mismatches(ra.t, a) == 0);
}

static std::string llama_with(const std::string& quantization) {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 1000, "quantization_config": )" + quantization + "}";
}

TEST_CASE(awq_and_gptq_quantization_configs_as_published) {
  ModelConfig c = parse_model_config(llama_with(R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null,
    "quant_method": "awq", "version": "gemm", "zero_point": true})"), "awq");
  CHECK(c.quantization.int_format == IntFormat::Awq && c.quantization.bits == 4 && c.quantization.group_size == 128);
  c = parse_model_config(llama_with(R"({"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01,
    "desc_act": true, "group_size": -1, "model_file_base_name": null, "model_name_or_path": null,
    "quant_method": "gptq", "static_groups": false, "sym": true, "true_sequential": true})"), "gptq");
  CHECK(c.quantization.int_format == IntFormat::Gptq && c.quantization.group_size == 0 && c.quantization.zero_offset);
  c = parse_model_config(llama_with(R"({"bits": 8, "checkpoint_format": "gptq_v2", "group_size": 32,
    "quant_method": "gptq", "sym": false, "desc_act": false})"), "gptq v2");
  CHECK(c.quantization.bits == 8 && c.quantization.group_size == 32 && !c.quantization.zero_offset);
  bool refused = false;
  try {
    parse_model_config(llama_with(R"({"bits": 4, "group_size": "128", "quant_method": "gptq"})"), "bad");
  } catch (const Error& e) {
    refused = e.code() == ErrorCode::kModelFileInvalid && std::string(e.what()).find("group_size") != std::string::npos;
  }
  CHECK(refused);
}

// dequantize_packed_weights with keep_dense_q4 (the CUDA backend's load): a layer's q/k/v/o stay
// Q4 when all four have groups the GPU kernels take (multiples of 32), a dense layer's gate/up/down
// when all three do; experts, Q8_0 and the rest become bf16, each weight q4_dequantize_row's
// value rounded once. Without keep_dense_q4 everything packed becomes bf16.
TEST_CASE(dequantize_packed_weights_keeps_gpu_ready_dense_q4) {
  std::vector<std::vector<uint8_t>> bufs;
  const auto q4 = [&](int64_t group) {
    const int64_t N = 8, K = 64;
    bufs.emplace_back(cpu::q4_bytes(N, K, group, false));
    void* dst = bufs.back().data();
    cpu::q4_init(dst, N, K, group, nullptr);
    std::vector<uint8_t> codes(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; n++) {
      for (int64_t k = 0; k < K; k++) codes[size_t(k)] = uint8_t((n * 7 + k * 3) % 16);
      cpu::q4_set_row(dst, n, codes.data());
      for (int64_t g = 0; g < cpu::q4_groups(cpu::q4_padded_k(K), group); g++)
        cpu::q4_set_group(dst, n, g, g * group < K ? 0.01f * float(n + g + 1) : 0.f, g * group < K ? uint8_t(8) : 0);
    }
    TensorView t;
    t.name = "m.weight";
    t.dtype = DType::Q4;
    t.shape = {N, K};
    t.data = dst;
    t.nbytes = bufs.back().size();
    return t;
  };
  std::vector<uint16_t> bf16_store(8 * 64, 0);
  TensorView bf16;
  bf16.name = "router.weight";
  bf16.dtype = DType::BF16;
  bf16.shape = {8, 64};
  bf16.data = bf16_store.data();
  bf16.nbytes = bf16_store.size() * 2;
  const auto build = [&]() {
    bufs.clear();  // (moving a buffer keeps its data where the views point)
    ModelWeights w;
    w.layers.resize(3);
    for (LayerWeights& l : w.layers)
      for (TensorView* t : {&l.q, &l.k, &l.v, &l.o}) *t = q4(32);
    // Layer 0: dense, every group 32 (all kept). Layer 1: down's group 16 (its MLP dequantized)
    // and v's 16 (its attention too). Layer 2: sparse (the expert dequantized, attention kept).
    for (TensorView* t : {&w.layers[0].gate, &w.layers[0].up, &w.layers[0].down, &w.layers[1].gate, &w.layers[1].up}) *t = q4(64);
    w.layers[1].down = q4(16);
    w.layers[1].v = q4(16);
    w.layers[2].router = bf16;
    w.layers[2].experts.resize(1);
    for (TensorView* t : {&w.layers[2].experts[0].gate, &w.layers[2].experts[0].up, &w.layers[2].experts[0].down}) *t = q4(32);
    w.lm_head = bf16;
    w.embed = bf16;
    w.main_dtype = DType::Q4;
    return w;
  };
  ModelWeights w = build();
  const std::vector<uint8_t> gate1 = bufs[15];  // layer 1's gate: after every layer's q/k/v/o and layer 0's MLP
  dequantize_packed_weights(w, 2, true);
  const LayerWeights &l0 = w.layers[0], &l1 = w.layers[1], &l2 = w.layers[2];
  for (const TensorView* t : {&l0.q, &l0.k, &l0.v, &l0.o, &l0.gate, &l0.up, &l0.down, &l2.q, &l2.k, &l2.v, &l2.o})
    CHECK(t->dtype == DType::Q4);
  for (const TensorView* t : {&l1.q, &l1.k, &l1.v, &l1.o, &l1.gate, &l1.up, &l1.down, &l2.experts[0].gate,
                              &l2.experts[0].up, &l2.experts[0].down})
    CHECK(t->dtype == DType::BF16 && t->nbytes == 8 * 64 * 2);
  CHECK(l2.router.dtype == DType::BF16 && l2.router.data == bf16_store.data());
  CHECK(w.main_dtype == DType::Q4);
  std::vector<float> row(64);
  int wrong = 0;
  for (int64_t n = 0; n < 8; n++) {
    cpu::q4_dequantize_row(gate1.data(), n, row.data());
    for (int64_t k = 0; k < 64; k++) wrong += static_cast<const uint16_t*>(l1.gate.data)[n * 64 + k] != f32_to_bf16(row[size_t(k)]);
  }
  CHECK(wrong == 0);

  ModelWeights all = build();
  dequantize_packed_weights(all, 2);
  for (const TensorView* t : streamed_matrices(all)) CHECK(t->dtype == DType::BF16);
  CHECK(all.main_dtype == DType::BF16);
}

int main() { return sluice_test::run_all("int_weights"); }
