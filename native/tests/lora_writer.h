// Writes a random LoRA adapter in PEFT's layout (adapter_config.json + adapter_model.safetensors)
// for a model written by tiny_model_writer.h, for the native tests (test_lora, test_cuda_lora).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "safetensors_file.h"
#include "sluice/dtype.h"
#include "tiny_model_writer.h"

namespace sluice_test {

// The seven projections an adapter may adapt, in LoraTarget order.
inline const char* const kLoraProj[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

struct AdapterSpec {
  int rank = 8;
  double alpha = 16;
  bool rslora = false;
  bool bf16 = false;
  std::vector<int> targets = {0, 1, 2, 3, 4, 5, 6};
  std::vector<int> layers = {0, 1};
  uint32_t seed = 1;
  std::string peft_type = "LORA";
  std::string extra_config;  // appended JSON members
  std::string extra_tensor;  // a tensor name added as is (load checks)
  int b_rows_off = 0;        // lora_B rows off by this (load checks)
};

// [out, in] of projection p of a model of `m`'s dimensions.
inline std::pair<int64_t, int64_t> lora_target_shape(const TinyModelSpec& m, int p) {
  const int64_t H = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, I = m.inter;
  const std::pair<int64_t, int64_t> shapes[7] = {{q, H}, {kv, H}, {kv, H}, {H, q}, {I, H}, {I, H}, {H, I}};
  return shapes[p];
}

inline void write_adapter(const std::string& dir, const AdapterSpec& s, const TinyModelSpec& model = {}) {
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<RawTensor> ts;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, float scale) {
    RawTensor t{name, s.bf16 ? "BF16" : "F32", {rows, cols}, {}};
    for (int64_t i = 0; i < rows * cols; i++) {
      const float v = scale * normal(rng);
      if (s.bf16) {
        const uint16_t h = sluice::f32_to_bf16(v);
        t.bytes.push_back(uint8_t(h & 0xff));
        t.bytes.push_back(uint8_t(h >> 8));
      } else {
        const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
        t.bytes.insert(t.bytes.end(), b, b + 4);
      }
    }
    ts.push_back(std::move(t));
  };
  for (int l : s.layers)
    for (int p : s.targets) {
      const auto [out, in] = lora_target_shape(model, p);
      const std::string base = "base_model.model.model.layers." + std::to_string(l) + "." + kLoraProj[p];
      matrix(base + ".lora_A.weight", s.rank, in, 1.f / std::sqrt(float(in)));
      // B is random (PEFT starts it at zero; a trained adapter's is not).
      matrix(base + ".lora_B.weight", out + s.b_rows_off, s.rank, 0.6f / std::sqrt(float(s.rank)));
    }
  if (!s.extra_tensor.empty()) matrix(s.extra_tensor, 4, 4, 1.f);
  write_safetensors(dir, ts);
  std::rename((dir + "/model.safetensors").c_str(), (dir + "/adapter_model.safetensors").c_str());
  std::ofstream(dir + "/adapter_config.json")
      << "{\"peft_type\":\"" << s.peft_type << "\",\"r\":" << s.rank << ",\"lora_alpha\":" << s.alpha
      << ",\"use_rslora\":" << (s.rslora ? "true" : "false")
      << ",\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\",\"up_proj\",\"down_proj\"],"
         "\"bias\":\"none\",\"lora_dropout\":0.0"
      << s.extra_config << "}";
}

}  // namespace sluice_test
