// The Node binding: a thin wrapper over sluice::Engine. Long calls (load, step, bandwidth)
// run on the libuv pool through PromiseWorker; the rest are quick and synchronous.
//
// Every entry point translates C++ exceptions into JS errors with a `code` (guarded() here,
// PromiseWorker for the async ones): an exception that reached node-addon-api untranslated would
// end the process in std::terminate.
#include <napi.h>

#include <cmath>
#include <memory>

#include "cpu/kernels.h"
#include "promise_worker.h"
#include "sluice/engine.h"
#include "sluice/error.h"

namespace sluice_addon {

namespace {

using sluice::Engine;

int64_t get_int(const Napi::Object& o, const char* key, int64_t fallback) {
  Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().Int64Value() : fallback;
}

// An integer field within [min, max]; absent -> fallback. Anything else is INVALID_ARGUMENT
// (never a silent wrap: 2^31 must not become -2^31 on its way to an int).
int32_t get_int32(Napi::Env env, const Napi::Object& o, const char* key, int32_t fallback, int64_t min, int64_t max) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : NAN;
  if (!(d >= double(min) && d <= double(max)) || d != std::floor(d))
    throw make_error(env, "INVALID_ARGUMENT", std::string(key) + " must be an integer in [" + std::to_string(min) +
                                                  ", " + std::to_string(max) + "]");
  return int32_t(d);
}

// Runs a synchronous entry point, turning every C++ exception into a JS error with a code.
template <typename F>
Napi::Value guarded(Napi::Env env, F&& body) {
  try {
    return body();
  } catch (const Napi::Error&) {
    throw;
  } catch (const sluice::Error& e) {
    throw make_error(env, sluice::error_code_name(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    throw make_error(env, "OUT_OF_MEMORY", "out of memory");
  } catch (const std::exception& e) {
    throw make_error(env, "INTERNAL", e.what());
  }
}

// prefixHashKey: 32 hex digits -> the two little-endian words of the 16-byte key.
std::array<uint64_t, 2> parse_hash_key(Napi::Env env, const std::string& hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw make_error(env, "INVALID_ARGUMENT", "prefixHashKey must be 32 hexadecimal digits (16 bytes)");
  std::array<uint64_t, 2> key{0, 0};
  for (size_t i = 0; i < 16; i++) {
    const uint64_t byte = std::stoul(hex.substr(2 * i, 2), nullptr, 16);
    key[i / 8] |= byte << (8 * (i % 8));
  }
  return key;
}

Napi::Object info_to_js(Napi::Env env, const sluice::EngineInfo& i) {
  Napi::Object o = Napi::Object::New(env);
  const sluice::ModelConfig& c = i.config;
  o.Set("architecture", c.architecture);
  o.Set("modelType", c.model_type);
  o.Set("weightDtype", i.weight_dtype);
  o.Set("vocabSize", double(c.vocab_size));
  o.Set("hiddenSize", double(c.hidden_size));
  o.Set("numLayers", double(c.num_layers));
  o.Set("numHeads", double(c.num_heads));
  o.Set("numKvHeads", double(c.num_kv_heads));
  o.Set("headDim", double(c.head_dim));
  o.Set("contextLength", double(c.max_position_embeddings));
  o.Set("weightBytes", double(i.weight_bytes));
  o.Set("kvCacheBytes", double(i.kv_cache_bytes));
  o.Set("blockSize", double(i.block_size));
  o.Set("numBlocks", double(i.num_blocks));
  o.Set("backend", i.backend);
  o.Set("simd", i.simd);
  o.Set("numThreads", double(i.num_threads));
  o.Set("matmulPrecision", i.matmul_precision);
  o.Set("deviceBytes", double(i.device_bytes));
  o.Set("prefixCaching", i.prefix_caching);
  if (!i.broken_reason.empty()) o.Set("brokenReason", i.broken_reason);
  return o;
}

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "NativeEngine",
                       {InstanceMethod("info", &EngineWrap::Info), InstanceMethod("addSequence", &EngineWrap::AddSequence),
                        InstanceMethod("freeSequence", &EngineWrap::FreeSequence),
                        InstanceMethod("numFreeBlocks", &EngineWrap::NumFreeBlocks),
                        InstanceMethod("numSequenceBlocks", &EngineWrap::NumSequenceBlocks),
                        InstanceMethod("step", &EngineWrap::Step), InstanceMethod("injectFault", &EngineWrap::InjectFault),
                        InstanceMethod("dispose", &EngineWrap::Dispose)});
  }

  // Constructed from JS only by load(): new NativeEngine(external)
  explicit EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
    if (info.Length() != 1 || !info[0].IsExternal())
      throw Napi::TypeError::New(info.Env(), "use load() to create an engine");
    engine_.reset(info[0].As<Napi::External<Engine>>().Data());
  }

 private:
  Engine& engine(Napi::Env env) {
    if (!engine_) throw make_error(env, "DISPOSED", "the engine has been disposed");
    if (busy_) throw make_error(env, "ENGINE_BUSY", "a step is running; wait for it before changing sequences");
    return *engine_;
  }

  Napi::Value Info(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      if (!engine_) throw make_error(info.Env(), "DISPOSED", "the engine has been disposed");
      return info_to_js(info.Env(), engine_->info());  // read-only; safe during a step
    });
  }

  Napi::Value AddSequence(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    return guarded(env, [&]() -> Napi::Value {
      if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsTypedArray() || !info[2].IsObject())
        throw Napi::TypeError::New(env, "addSequence(seqId, Int32Array prompt, sampling, keyed?, cacheScope?)");
      Napi::TypedArray ta = info[1].As<Napi::TypedArray>();
      if (ta.TypedArrayType() != napi_int32_array) throw Napi::TypeError::New(env, "prompt must be an Int32Array");
      Napi::Int32Array prompt = ta.As<Napi::Int32Array>();
      Napi::Object s = info[2].As<Napi::Object>();
      sluice::SamplingParams p;
      if (s.Get("temperature").IsNumber()) p.temperature = s.Get("temperature").As<Napi::Number>().FloatValue();
      if (s.Get("topP").IsNumber()) p.top_p = s.Get("topP").As<Napi::Number>().FloatValue();
      p.top_k = get_int32(env, s, "topK", 0, 0, INT32_MAX);
      p.logprobs = get_int32(env, s, "logprobs", 0, 0, 20);
      Napi::Value seed = s.Get("seed");
      if (seed.IsBigInt()) {
        bool lossless;
        p.seed = seed.As<Napi::BigInt>().Uint64Value(&lossless);
      } else if (seed.IsNumber()) {
        p.seed = uint64_t(seed.As<Napi::Number>().Int64Value());
      }
      std::vector<int32_t> tokens(prompt.Data(), prompt.Data() + prompt.ElementLength());
      const bool keyed = info.Length() > 3 && info[3].IsBoolean() && info[3].As<Napi::Boolean>().Value();
      const std::string scope = info.Length() > 4 && info[4].IsString() ? info[4].As<Napi::String>().Utf8Value() : "";
      const int64_t num_cached = engine(env).add_sequence(info[0].As<Napi::Number>().Uint32Value(), tokens, p, keyed, scope);
      return Napi::Number::New(env, double(num_cached));
    });
  }

  Napi::Value FreeSequence(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      if (!info[0].IsNumber()) throw Napi::TypeError::New(info.Env(), "freeSequence(seqId)");
      if (!engine_) return info.Env().Undefined();  // freeing after dispose is a no-op
      engine(info.Env()).free_sequence(info[0].As<Napi::Number>().Uint32Value());
      return info.Env().Undefined();
    });
  }

  Napi::Value NumFreeBlocks(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      return Napi::Number::New(info.Env(), double(engine(info.Env()).num_free_blocks()));
    });
  }

  Napi::Value NumSequenceBlocks(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      if (!info[0].IsNumber()) throw Napi::TypeError::New(info.Env(), "numSequenceBlocks(seqId)");
      return Napi::Number::New(info.Env(),
                               double(engine(info.Env()).num_sequence_blocks(info[0].As<Napi::Number>().Uint32Value())));
    });
  }

  // injectFault(seqId, 'prepare' | 'sample' | 'device'): see Engine::inject_fault (tests only).
  Napi::Value InjectFault(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      if (!info[0].IsNumber() || !info[1].IsString()) throw Napi::TypeError::New(info.Env(), "injectFault(seqId, point)");
      const std::string point = info[1].As<Napi::String>().Utf8Value();
      sluice::FaultPoint fp;
      if (point == "prepare") fp = sluice::FaultPoint::kPrepareRow;
      else if (point == "sample") fp = sluice::FaultPoint::kSampleRow;
      else if (point == "device") fp = sluice::FaultPoint::kDevice;
      else throw make_error(info.Env(), "INVALID_ARGUMENT", "fault point must be prepare, sample or device");
      engine(info.Env()).inject_fault(info[0].As<Napi::Number>().Uint32Value(), fp);
      return info.Env().Undefined();
    });
  }

  Napi::Value Step(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    return guarded(env, [&]() -> Napi::Value { return StepImpl(info); });
  }

  Napi::Value StepImpl(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Engine& eng = engine(env);
    if (!info[0].IsObject()) throw Napi::TypeError::New(env, "step({seqIds: Uint32Array, numTokens: Uint32Array})");
    Napi::Object plan_js = info[0].As<Napi::Object>();
    Napi::Value ids = plan_js.Get("seqIds"), counts = plan_js.Get("numTokens");
    if (!ids.IsTypedArray() || ids.As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array ||
        !counts.IsTypedArray() || counts.As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array)
      throw Napi::TypeError::New(env, "plan.seqIds and plan.numTokens must be Uint32Arrays");
    Napi::Uint32Array ids_a = ids.As<Napi::Uint32Array>(), counts_a = counts.As<Napi::Uint32Array>();
    // Copy the plan: the typed arrays may be reused by JS while the step runs.
    auto plan = std::make_shared<sluice::StepPlan>();
    plan->seq_ids.assign(ids_a.Data(), ids_a.Data() + ids_a.ElementLength());
    plan->num_tokens.assign(counts_a.Data(), counts_a.Data() + counts_a.ElementLength());

    busy_ = true;
    auto* worker = new PromiseWorker<sluice::StepResult>(
        env, [&eng, plan]() { return eng.step(*plan); }, &StepResultToJs, Value(),
        [this]() {
          busy_ = false;
          if (dispose_pending_) engine_.reset();
        });
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
  }

  static Napi::Value StepResultToJs(Napi::Env env, sluice::StepResult& r) {
    const size_t m = r.seq_ids.size(), tn = size_t(r.top_n);
    Napi::Object o = Napi::Object::New(env);
    auto seq_ids = Napi::Uint32Array::New(env, m);
    auto tokens = Napi::Int32Array::New(env, m);
    auto logprobs = Napi::Float32Array::New(env, m);
    auto top_ids = Napi::Int32Array::New(env, m * tn);
    auto top_lps = Napi::Float32Array::New(env, m * tn);
    std::copy(r.seq_ids.begin(), r.seq_ids.end(), seq_ids.Data());
    std::copy(r.tokens.begin(), r.tokens.end(), tokens.Data());
    std::copy(r.logprobs.begin(), r.logprobs.end(), logprobs.Data());
    std::copy(r.top_ids.begin(), r.top_ids.end(), top_ids.Data());
    std::copy(r.top_logprobs.begin(), r.top_logprobs.end(), top_lps.Data());
    o.Set("seqIds", seq_ids);
    o.Set("tokens", tokens);
    o.Set("logprobs", logprobs);
    o.Set("topN", double(tn));
    o.Set("topIds", top_ids);
    o.Set("topLogprobs", top_lps);
    // Rows that failed on their own: [{seqId, code, message}] (usually empty).
    Napi::Array errors = Napi::Array::New(env, r.errors.size());
    for (size_t i = 0; i < r.errors.size(); i++) {
      Napi::Object e = Napi::Object::New(env);
      e.Set("seqId", double(r.errors[i].seq_id));
      e.Set("code", sluice::error_code_name(r.errors[i].code));
      e.Set("message", r.errors[i].message);
      errors.Set(uint32_t(i), e);
    }
    o.Set("errors", errors);
    return o;
  }

  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      if (busy_) dispose_pending_ = true;  // freed when the running step settles
      else engine_.reset();
      return info.Env().Undefined();
    });
  }

  std::unique_ptr<Engine> engine_;
  bool busy_ = false;
  bool dispose_pending_ = false;
};

struct AddonData {
  Napi::FunctionReference engine_ctor;
};

Napi::Value LoadImpl(const Napi::CallbackInfo& info);

Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value { return LoadImpl(info); });
}

Napi::Value LoadImpl(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw Napi::TypeError::New(env, "load(options)");
  Napi::Object o = info[0].As<Napi::Object>();
  sluice::EngineOptions opts;
  if (!o.Get("modelDir").IsString()) throw Napi::TypeError::New(env, "options.modelDir must be a string");
  opts.model_dir = o.Get("modelDir").As<Napi::String>().Utf8Value();
  if (o.Get("backend").IsString()) opts.backend = o.Get("backend").As<Napi::String>().Utf8Value();
  if (o.Get("kvCacheBytes").IsNumber()) opts.kv_cache_bytes = size_t(o.Get("kvCacheBytes").As<Napi::Number>().Int64Value());
  opts.block_size = int(get_int(o, "blockSize", 16));
  opts.num_threads = int(get_int(o, "numThreads", 0));
  if (o.Get("matmulPrecision").IsString()) opts.matmul_precision = o.Get("matmulPrecision").As<Napi::String>().Utf8Value();
  if (o.Get("prefixCaching").IsBoolean()) opts.prefix_caching = o.Get("prefixCaching").As<Napi::Boolean>().Value();
  if (o.Get("gpuMemoryUtilization").IsNumber())
    opts.gpu_memory_utilization = o.Get("gpuMemoryUtilization").As<Napi::Number>().DoubleValue();
  if (o.Get("prefixHashKey").IsString())
    opts.prefix_hash_key = parse_hash_key(env, o.Get("prefixHashKey").As<Napi::String>().Utf8Value());
  AddonData* data = env.GetInstanceData<AddonData>();
  auto* worker = new PromiseWorker<Engine*>(
      env, [opts]() { return Engine::load(opts).release(); },
      [data](Napi::Env e, Engine*& engine) -> Napi::Value {
        Engine* raw = engine;
        engine = nullptr;
        return data->engine_ctor.New({Napi::External<Engine>::New(e, raw)});
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

Napi::Value MeasureBandwidth(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int threads = info[0].IsNumber() ? info[0].As<Napi::Number>().Int32Value() : 0;
  size_t bytes = info[1].IsNumber() ? size_t(info[1].As<Napi::Number>().Int64Value()) : (size_t(1) << 30);
  int repeats = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : 5;
  auto* worker = new PromiseWorker<double>(
      env, [=]() { return sluice::measure_memory_bandwidth(threads, bytes, repeats); },
      [](Napi::Env e, double& v) -> Napi::Value { return Napi::Number::New(e, v); });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

Napi::Value MeasureDeviceBandwidth(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t bytes = info[0].IsNumber() ? size_t(info[0].As<Napi::Number>().Int64Value()) : (size_t(1) << 30);
  int repeats = info[1].IsNumber() ? info[1].As<Napi::Number>().Int32Value() : 10;
  auto* worker = new PromiseWorker<double>(
      env, [=]() { return sluice::measure_device_bandwidth(bytes, repeats); },
      [](Napi::Env e, double& v) -> Napi::Value { return Napi::Number::New(e, v); });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  data->engine_ctor = Napi::Persistent(EngineWrap::Init(env));
  env.SetInstanceData(data);
  exports.Set("load", Napi::Function::New(env, Load));
  exports.Set("measureMemoryBandwidth", Napi::Function::New(env, MeasureBandwidth));
  exports.Set("measureDeviceBandwidth", Napi::Function::New(env, MeasureDeviceBandwidth));
  // Whether a CUDA device is usable ('' when it is, else why not); quick, no context kept.
  exports.Set("cudaUnavailableReason", Napi::Function::New(env, [](const Napi::CallbackInfo& i) -> Napi::Value {
                return guarded(i.Env(), [&]() -> Napi::Value {
                  std::string why;
                  return Napi::String::New(i.Env(), sluice::cuda_available(&why) ? "" : why);
                });
              }));
  exports.Set("simdLevel", Napi::Function::New(env, [](const Napi::CallbackInfo& i) -> Napi::Value {
                return Napi::String::New(i.Env(), sluice::cpu::simd_level_name());
              }));
  exports.Set("cudaCompiled", Napi::Boolean::New(env,
#ifdef SLUICE_WITH_CUDA
                                                 true
#else
                                                 false
#endif
                                                 ));
  return exports;
}

}  // namespace

}  // namespace sluice_addon

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return sluice_addon::Init(env, exports); }
NODE_API_MODULE(sluice, InitAddon)
