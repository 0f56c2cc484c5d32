// FP8 checkpoints: the e4m3 decoder over every code against the format's definition, the single
// bf16 rounding of the dequantized products, and config.json's quantization_config.
#include <cmath>
#include <cstring>
#include <random>

#include "cpu/thread_pool.h"
#include "model/fp8.h"
#include "model/quantize.h"
#include "sluice/error.h"
#include "sluice/model_config.h"
#include "test_util.h"
#include "util/e4m3.h"

using namespace sluice;

TEST_CASE(e4m3_decodes_all_256_codes_exactly) {
  // The OCP FP8 definition, written independently: value = (-1)^s * 2^(1 - bias) * (0 + m/8) for
  // exponent field 0, else (-1)^s * 2^(e - bias) * (1 + m/8), bias 7; S.1111.111 is NaN.
  for (int code = 0; code < 256; code++) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    const float got = e4m3_to_float(uint8_t(code));
    if (e == 15 && m == 7) {
      CHECK(std::isnan(got) && e4m3_is_nan(uint8_t(code)));
      continue;
    }
    const double want = std::pow(-1.0, s) * std::pow(2.0, e == 0 ? -6 : e - 7) * ((e == 0 ? 0.0 : 1.0) + m / 8.0);
    CHECK(!e4m3_is_nan(uint8_t(code)));
    if (double(got) != want) std::printf("  code 0x%02x: got %.9g, want %.9g\n", code, double(got), want);
    CHECK(double(got) == want);
    CHECK(std::signbit(got) == (s == 1));  // 0x80 is -0
  }
  CHECK(e4m3_to_float(0x7e) == 448.f && e4m3_to_float(0xfe) == -448.f);
  CHECK(e4m3_to_float(0x38) == 1.f && e4m3_to_float(0x01) == std::ldexp(1.f, -9) && e4m3_to_float(0x08) == std::ldexp(1.f, -6));
}

// The bf16 nearest to v, ties to even, found by bracketing v between consecutive bf16 values.
static uint16_t nearest_bf16(double v) {
  uint16_t lo = f32_to_bf16(float(v));
  // Walk to the bf16 at or below v in magnitude, then compare with its successor.
  uint16_t a = lo;
  while (std::fabs(double(bf16_to_f32(a))) > std::fabs(v)) a = uint16_t(a - 1);
  while (std::fabs(double(bf16_to_f32(uint16_t(a + 1)))) <= std::fabs(v)) a = uint16_t(a + 1);
  const uint16_t b = uint16_t(a + 1);
  const double da = std::fabs(v - double(bf16_to_f32(a))), db = std::fabs(double(bf16_to_f32(b)) - v);
  if (da < db) return a;
  if (db < da) return b;
  return (a & 1) ? b : a;
}

TEST_CASE(dequantized_products_round_once_to_bf16) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-40, 10);
  int mismatches = 0;
  for (int i = 0; i < 200000; i++) {
    const uint8_t c = uint8_t(code(rng));
    if (e4m3_is_nan(c) || (c & 0x7f) == 0) continue;
    const float scale = std::ldexp(mant(rng), ex(rng));
    const double v = double(e4m3_to_float(c)) * double(scale);
    if (f64_to_bf16(v) != nearest_bf16(v)) mismatches++;
  }
  CHECK(mismatches == 0);
  // A product just above a bf16 tie: rounding through f32 first would land on the tie and go to even.
  const double tie = 1.0 + 1.0 / 256;  // halfway between bf16 1.0 and 1.0078125
  const double above = tie + std::ldexp(1.0, -30);
  CHECK(f32_to_bf16(float(above)) == f32_to_bf16(1.0f));  // the double rounding this avoids
  CHECK(f64_to_bf16(above) == uint16_t(f32_to_bf16(1.0f) + 1));
  CHECK(f64_to_bf16(tie) == f32_to_bf16(1.0f));
  CHECK(f64_to_bf16(-above) == uint16_t(f32_to_bf16(-1.0f) + 1));
  CHECK(f64_to_bf16(0.0) == 0 && f64_to_bf16(-0.0) == 0x8000);
}

static std::string qwen3_with(const std::string& quantization) {
  return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1000, "quantization_config": )" + quantization + "}";
}

TEST_CASE(fp8_quantization_configs_as_published) {
  ModelConfig c = parse_model_config(qwen3_with(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128]})"), "Qwen3-8B-FP8");
  CHECK(c.quantization.method == "fp8" && c.quantization.fp8 == Fp8Scales::Block);
  CHECK(c.quantization.block_rows == 128 && c.quantization.block_cols == 128);

  c = parse_model_config(qwen3_with(R"({"config_groups": {"group_0": {"input_activations": {"dynamic": true,
    "num_bits": 8, "strategy": "token", "symmetric": true, "type": "float"}, "output_activations": null,
    "targets": ["Linear"], "weights": {"dynamic": false, "num_bits": 8, "observer": "minmax",
    "strategy": "channel", "symmetric": true, "type": "float"}}}, "format": "float-quantized",
    "ignore": ["lm_head"], "quant_method": "compressed-tensors", "quantization_status": "compressed"})"), "ct");
  CHECK(c.quantization.method == "compressed-tensors" && c.quantization.fp8 == Fp8Scales::Channel);

  c = parse_model_config(qwen3_with(R"({"config_groups": {"group_0": {"input_activations": {"dynamic": false,
    "num_bits": 8, "strategy": "tensor", "type": "float"}, "targets": ["Linear"], "weights": {"num_bits": 8,
    "strategy": "tensor", "type": "float"}}}, "format": "float-quantized", "quant_method": "compressed-tensors"})"), "ct");
  CHECK(c.quantization.fp8 == Fp8Scales::Tensor);

  c = parse_model_config(qwen3_with(R"({"exclude_modules": ["lm_head"], "kv_cache_quant_algo": null,
    "quant_algo": "FP8", "quant_method": "modelopt"})"), "modelopt");
  CHECK(c.quantization.method == "modelopt" && c.quantization.fp8 == Fp8Scales::Tensor);

  c = parse_model_config(qwen3_with("null"), "none");
  CHECK(c.quantization.method.empty() && c.quantization.fp8 == Fp8Scales::None);
}

TEST_CASE(unsupported_and_malformed_quantization_configs_are_refused) {
  const auto code_of = [](const std::string& q) {
    try {
      parse_model_config(qwen3_with(q), "c");
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::kInternal, std::string("accepted"));
  };
  const auto unsupported = [&](const std::string& q, const std::string& names) {
    auto [code, what] = code_of(q);
    const bool ok = code == ErrorCode::kUnsupportedModel && what.find(names) != std::string::npos &&
                    what.find("supported: fp8") != std::string::npos;
    if (!ok) std::printf("  %s -> %s\n", q.c_str(), what.c_str());
    CHECK(ok);
  };
  unsupported(R"({"quant_method": "awq", "bits": 3, "group_size": 128})", "awq with 3 bits");
  unsupported(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})", "awq version \"gemv\"");
  unsupported(R"({"quant_method": "awq", "bits": 4, "group_size": 100})", "group_size 100");
  unsupported(R"({"quant_method": "gptq", "bits": 2, "group_size": 128})", "gptq with 2 bits");
  unsupported(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})",
              "checkpoint_format \"marlin\"");
  unsupported(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})", "quant_method \"bitsandbytes\"");
  unsupported(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})", "fmt \"e5m2\"");
  unsupported(R"({"quant_method": "fp8", "activation_scheme": "dynamic"})", "without weight_block_size");
  unsupported(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})", "quant_algo \"NVFP4\"");
  unsupported(R"({"quant_method": "mxfp4"})", "outside gpt-oss");
  unsupported(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}})",
              "format \"pack-quantized\"");
  unsupported(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
    "weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128}}}})", "strategy \"group\"");
  unsupported(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
    "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}})", "type \"int\"");

  const auto malformed = [&](const std::string& q, const std::string& names) {
    auto [code, what] = code_of(q);
    const bool ok = code == ErrorCode::kModelFileInvalid && what.find(names) != std::string::npos;
    if (!ok) std::printf("  %s -> %s\n", q.c_str(), what.c_str());
    CHECK(ok);
  };
  malformed(R"({"quant_method": "fp8", "weight_block_size": [128]})", "weight_block_size");
  malformed(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})", "weight_block_size");
  malformed(R"({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": "lm_head"})",
            "modules_to_not_convert");
  malformed(R"({"fmt": "e4m3"})", "quant_method");
  malformed(R"({"quant_method": "compressed-tensors", "format": "float-quantized"})", "config_groups");
}

// dequantize_fp8_weights (what the CUDA backend's upload runs on bind_weights' keep_fp8 views):
// with keep_fp8_groups a layer's q/k/v/o stay F8E4M3 when all four are, a dense layer's
// gate/up/down when all three are; the rest becomes exactly dequantize_fp8's bf16 (the binder's
// bits without keep_fp8), its scale view cleared. Without keep_fp8_groups every one becomes bf16.
TEST_CASE(dequantize_fp8_weights_keeps_whole_fp8_groups) {
  QuantizationConfig q;
  q.fp8 = Fp8Scales::Channel;
  const int64_t N = 8, K = 32;
  std::vector<uint8_t> codes(size_t(N * K));
  for (size_t i = 0; i < codes.size(); i++) codes[i] = uint8_t((i * 37 + 11) % 256) & 0xf7;  // bit 3 clear: no NaN
  std::vector<float> scales(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; n++) scales[size_t(n)] = 0.01f * float(n + 1);
  TensorView fp8, scale, bf16;
  fp8.name = "m.weight";
  fp8.dtype = DType::F8E4M3;
  fp8.shape = {N, K};
  fp8.data = codes.data();
  fp8.nbytes = codes.size();
  scale.name = "m.weight_scale";
  scale.dtype = DType::F32;
  scale.shape = {N, 1};
  scale.data = scales.data();
  scale.nbytes = scales.size() * 4;
  std::vector<uint16_t> bf16_store(size_t(N * K), 0);
  bf16.name = "b.weight";
  bf16.dtype = DType::BF16;
  bf16.shape = {N, K};
  bf16.data = bf16_store.data();
  bf16.nbytes = bf16_store.size() * 2;
  const auto build = [&]() {
    ModelWeights w;
    w.layers.resize(3);
    for (LayerWeights& l : w.layers) {
      LayerWeights::Fp8ScaleViews& s = l.fp8_scale;
      for (auto [t, sc] : {std::pair{&l.q, &s.q}, {&l.k, &s.k}, {&l.v, &s.v}, {&l.o, &s.o}, {&l.gate, &s.gate},
                           {&l.up, &s.up}, {&l.down, &s.down}})
        *t = fp8, *sc = scale;
    }
    // Layer 1: gate kept in bf16 by the checkpoint (its up and down dequantized); layer 2: sparse.
    w.layers[1].gate = bf16;
    w.layers[1].fp8_scale.gate = TensorView{};
    w.layers[2].gate = w.layers[2].up = w.layers[2].down = TensorView{};
    w.layers[2].fp8_scale.gate = w.layers[2].fp8_scale.up = w.layers[2].fp8_scale.down = TensorView{};
    w.layers[2].router = bf16;
    w.layers[2].experts.resize(1);
    for (TensorView* t : {&w.layers[2].experts[0].gate, &w.layers[2].experts[0].up, &w.layers[2].experts[0].down}) *t = bf16;
    w.lm_head = w.embed = bf16;
    w.main_dtype = DType::F8E4M3;
    return w;
  };
  std::vector<std::shared_ptr<HostBuffer>> owned;
  cpu::ThreadPool pool(1);
  const TensorView want = dequantize_fp8(fp8, scale, q, owned, pool);

  ModelWeights w = build();
  dequantize_fp8_weights(w, q, 1, true);
  const LayerWeights &l0 = w.layers[0], &l1 = w.layers[1], &l2 = w.layers[2];
  for (const TensorView* t : {&l0.q, &l0.k, &l0.v, &l0.o, &l0.gate, &l0.up, &l0.down, &l1.q, &l1.k, &l1.v, &l1.o,
                              &l2.q, &l2.k, &l2.v, &l2.o})
    CHECK(t->dtype == DType::F8E4M3 && t->data == codes.data());
  CHECK(l0.fp8_scale.down.data == scales.data() && l1.fp8_scale.o.data == scales.data());
  CHECK(l1.gate.data == bf16_store.data());
  for (const TensorView* t : {&l1.up, &l1.down}) {
    CHECK(t->dtype == DType::BF16 && t->nbytes == size_t(N * K) * 2);
    CHECK(std::memcmp(t->data, want.data, want.nbytes) == 0);
  }
  CHECK(l1.fp8_scale.up.data == nullptr && l1.fp8_scale.down.data == nullptr);
  CHECK(w.main_dtype == DType::F8E4M3);

  ModelWeights all = build();
  dequantize_fp8_weights(all, q, 1);
  for (const TensorView* t : streamed_matrices(all)) {
    CHECK(t->dtype == DType::BF16);
    if (t->data != bf16_store.data()) CHECK(std::memcmp(t->data, want.data, want.nbytes) == 0);
  }
  CHECK(all.main_dtype == DType::BF16);
}

// The code nearest to x by a search over every finite code, ties to the even code; |x| >= 448
// saturates (the encoder's rule; nothing above 448 is nearer to another code anyway).
static uint8_t nearest_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  if (a >= 448) return sign | 0x7e;
  uint8_t best = 0;
  for (int code = 1; code <= 0x7e; code++) {
    const double d = std::fabs(double(e4m3_to_float(uint8_t(code))) - a), db = std::fabs(double(e4m3_to_float(best)) - a);
    if (d < db || (d == db && (code & 1) == 0)) best = uint8_t(code);
  }
  return sign | best;
}

TEST_CASE(e4m3_encoder_rounds_to_nearest_even_and_saturates) {
  // Every finite code survives the round trip (+-0 included).
  for (int code = 0; code < 256; code++)
    if (!e4m3_is_nan(uint8_t(code))) CHECK(f32_to_e4m3(e4m3_to_float(uint8_t(code))) == code);
  // Midpoints between neighbouring codes (exact in f32: 5 significant bits) go to the even
  // code, across binade boundaries and from the subnormals too; a step either side goes to the
  // nearer one.
  for (int code = 0; code < 0x7e; code++)
    for (uint8_t sign : {uint8_t(0), uint8_t(0x80)}) {
      const float lo = e4m3_to_float(uint8_t(sign | code)), hi = e4m3_to_float(uint8_t(sign | (code + 1)));
      const float mid = float((double(lo) + double(hi)) / 2);
      CHECK(double(mid) == (double(lo) + double(hi)) / 2);
      CHECK(f32_to_e4m3(mid) == (sign | (code % 2 == 0 ? code : code + 1)));
      CHECK(f32_to_e4m3(std::nextafter(mid, lo)) == (sign | code));
      CHECK(f32_to_e4m3(std::nextafter(mid, hi)) == (sign | (code + 1)));
    }
  // 448 and beyond, infinities included, saturate; NaN stays NaN whatever its sign and payload.
  for (float big : {448.f, 449.f, 464.f, 480.f, 1e4f, 3.4e38f, INFINITY}) {
    CHECK(f32_to_e4m3(big) == 0x7e);
    CHECK(f32_to_e4m3(-big) == 0xfe);
  }
  uint32_t nan_bits[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu};
  for (uint32_t bits : nan_bits) {
    float nan;
    std::memcpy(&nan, &bits, 4);
    CHECK(e4m3_is_nan(f32_to_e4m3(nan)));
  }
  // Random floats over binades 2^-14 .. 2^10 (below the smallest subnormal, 2^-9, up past 448)
  // against the search.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-14, 9), sign(0, 1);
  int mismatches = 0;
  for (int i = 0; i < 100000; i++) {
    const float x = std::ldexp(mant(rng), ex(rng)) * (sign(rng) ? -1.f : 1.f);
    const uint8_t got = f32_to_e4m3(x), want = nearest_e4m3(x);
    if (got != want && mismatches++ < 3) std::printf("  %.9g: got 0x%02x, want 0x%02x\n", double(x), got, want);
  }
  CHECK(mismatches == 0);
}

int main() { return sluice_test::run_all("fp8"); }
