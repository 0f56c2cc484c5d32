// Native engine bench, no Node needed:
//   sluice_bench --model DIR [--backend cpu|cuda] [--batch 1,8,32] [--prompt 512] [--decode 32]
//                [--threads N] [--kv-bytes BYTES] [--gpu-memory-utilization F] [--precision f32|bf16]
//                [--quantization none|int8|fp8] [--kv-cache-dtype auto|fp8] [--device-tokens] [--graphs-at-load] [--json FILE]
// Prints a table: memory bandwidth (CPU: streaming read; CUDA: device-to-device copy, read +
// written bytes), the batch-1 decode roofline (weight bytes / bandwidth), and per batch size the
// prefill and decode throughput. The Node bench (bench/engine.ts) drives the same engine through
// the addon. --device-tokens (EngineOptions::cuda_device_tokens) decodes pipelined: step N+1 is
// begun before step N ends, as the addon does; --graphs-at-load captures the decode graphs at load.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/engine.h"
#include "sluice/error.h"

using namespace sluice;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024.0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

struct Row {
  int batch;
  double prefill_tps, decode_tps, decode_step_ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model, json_out, precision = "f32", backend = "cpu", quantization = "none", kv_dtype = "auto";
  std::vector<int> batches{1, 8, 32};
  int prompt_len = 512, decode_steps = 32, threads = 0;
  size_t kv_bytes = 0;
  double gpu_util = 0.9;
  bool device_tokens = false, graphs_at_load = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--batch") batches = parse_list(next());
    else if (a == "--prompt") prompt_len = std::atoi(next().c_str());
    else if (a == "--decode") decode_steps = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--kv-bytes") kv_bytes = size_t(std::atoll(next().c_str()));
    else if (a == "--json") json_out = next();
    else if (a == "--precision") precision = next();
    else if (a == "--quantization") quantization = next();
    else if (a == "--kv-cache-dtype") kv_dtype = next();
    else if (a == "--backend") backend = next();
    else if (a == "--gpu-memory-utilization") gpu_util = std::atof(next().c_str());
    else if (a == "--device-tokens") device_tokens = true;
    else if (a == "--graphs-at-load") graphs_at_load = true;
    else {
      std::fprintf(stderr, "usage: sluice_bench --model DIR [--backend cpu|cuda] [--batch 1,8,32] [--prompt N] [--decode N] [--threads N] [--kv-bytes B] [--gpu-memory-utilization F] [--precision f32|bf16] [--quantization none|int8|fp8] [--kv-cache-dtype auto|fp8] [--device-tokens] [--graphs-at-load] [--json FILE]\n");
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return 2;
  }
  try {
    const bool cuda = backend == "cuda";
    std::fprintf(stderr, "measuring %s bandwidth...\n", cuda ? "device" : "memory");
    const double bandwidth = cuda ? measure_device_bandwidth() : measure_memory_bandwidth(threads);
    std::fprintf(stderr, "loading %s...\n", model.c_str());
    EngineOptions opts;
    opts.model_dir = model;
    opts.backend = backend;
    opts.kv_cache_bytes = kv_bytes ? kv_bytes : cuda ? 0 : size_t(2) << 30;
    opts.gpu_memory_utilization = gpu_util;
    opts.num_threads = threads;
    opts.matmul_precision = precision;
    opts.quantization = quantization;
    opts.kv_cache_dtype = kv_dtype;
    opts.prefix_caching = false;  // the same prompts repeat across batch sizes: measure compute, not hits
    opts.cuda_device_tokens = device_tokens;
    opts.cuda_graphs_at_load = graphs_at_load;
    auto engine = Engine::load(opts);
    const EngineInfo info = engine->info();
    const double roofline = bandwidth / double(info.weight_bytes);
    std::vector<Row> rows;
    uint32_t next_id = 1;
    for (int batch : batches) {
      std::vector<uint32_t> ids;
      for (int b = 0; b < batch; b++) {
        std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
        for (int t = 0; t < prompt_len; t++) prompt[size_t(t)] = int32_t((t * 31 + b * 7 + 11) % info.config.vocab_size);
        engine->add_sequence(next_id, prompt, {0.f, 1.f, 0, 0, 0});
        ids.push_back(next_id++);
      }
      // Prefill: every sequence's prompt, at most 2048 batched tokens per step.
      auto t0 = Clock::now();
      std::vector<int> remaining(size_t(batch), prompt_len);
      for (;;) {
        StepPlan plan;
        int budget = 2048;
        for (int b = 0; b < batch && budget > 0; b++) {
          if (!remaining[size_t(b)]) continue;
          int n = std::min(remaining[size_t(b)], budget);
          plan.seq_ids.push_back(ids[size_t(b)]);
          plan.num_tokens.push_back(uint32_t(n));
          remaining[size_t(b)] -= n;
          budget -= n;
        }
        if (plan.seq_ids.empty()) break;
        engine->step(plan);
      }
      const double prefill_s = seconds_since(t0);
      StepPlan decode;
      decode.seq_ids = ids;
      decode.num_tokens.assign(ids.size(), 1);
      engine->step(decode);  // warm-up step
      t0 = Clock::now();
      if (engine->pipelined()) {
        // One step always in flight: the decode plan does not depend on the last result.
        engine->begin_step(decode);
        for (int s = 1; s < decode_steps; s++) {
          engine->begin_step(decode);
          engine->end_step();
        }
        engine->end_step();
      } else {
        for (int s = 0; s < decode_steps; s++) engine->step(decode);
      }
      const double decode_s = seconds_since(t0);
      rows.push_back({batch, double(batch) * prompt_len / prefill_s, double(batch) * decode_steps / decode_s,
                      1000.0 * decode_s / decode_steps});
      for (uint32_t id : ids) engine->free_sequence(id);
    }
    std::printf("model %s  %s  weights %.1f MB  backend %s (%s, %d threads, matmul precision %s)\n",
                info.config.architecture.c_str(), info.weight_dtype.c_str(), double(info.weight_bytes) / 1e6,
                info.backend.c_str(), info.simd.c_str(), info.num_threads, info.matmul_precision.c_str());
    std::printf("%s bandwidth %.1f GB/s  batch-1 decode roofline %.1f tok/s\n",
                cuda ? "device-to-device copy" : "memory read", bandwidth / 1e9, roofline);
    if (cuda) std::printf("device memory held %.1f MB (KV pool %.1f MB)\n", double(info.device_bytes) / 1e6,
                          double(info.kv_cache_bytes) / 1e6);
    std::printf("KV cache %s, %lld blocks of %lld tokens\n", info.kv_cache_dtype.c_str(), (long long)info.num_blocks,
                (long long)info.block_size);
    std::printf("%6s %14s %14s %12s %10s\n", "batch", "prefill tok/s", "decode tok/s", "step ms", "roofline");
    for (const Row& r : rows)
      std::printf("%6d %14.1f %14.1f %12.2f %9.0f%%\n", r.batch, r.prefill_tps, r.decode_tps, r.decode_step_ms,
                  r.batch == 1 ? 100.0 * r.decode_tps / roofline : 0.0);
    std::printf("peak RSS %.1f MB\n", peak_rss_bytes() / 1e6);
    if (!json_out.empty()) {
      std::ofstream out(json_out);
      out << "{\"model\":\"" << info.config.architecture << "\",\"weight_dtype\":\"" << info.weight_dtype
          << "\",\"weight_bytes\":" << info.weight_bytes << ",\"memory_bandwidth_bytes_per_s\":" << bandwidth
          << ",\"decode_roofline_tokens_per_s\":" << roofline << ",\"peak_rss_bytes\":" << peak_rss_bytes()
          << ",\"backend\":\"" << info.backend << "\",\"device\":\"" << info.simd
          << "\",\"device_tokens\":" << (engine->pipelined() ? "true" : "false")
          << ",\"device_bytes\":" << info.device_bytes << ",\"kv_cache_bytes\":" << info.kv_cache_bytes
          << ",\"kv_cache_dtype\":\"" << info.kv_cache_dtype << "\",\"kv_blocks\":" << info.num_blocks << ",\"rows\":[";
      for (size_t i = 0; i < rows.size(); i++)
        out << (i ? "," : "") << "{\"batch\":" << rows[i].batch << ",\"prefill_tokens_per_s\":" << rows[i].prefill_tps
            << ",\"decode_tokens_per_s\":" << rows[i].decode_tps << ",\"decode_step_ms\":" << rows[i].decode_step_ms
            << "}";
      out << "]}\n";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
