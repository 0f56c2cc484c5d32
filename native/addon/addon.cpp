// The Node binding: a thin wrapper over sluice::Engine. Long calls (load, step, bandwidth)
// run on the libuv pool through PromiseWorker; the rest are quick and synchronous.
//
// Every entry point translates C++ exceptions into JS errors with a `code` (guarded() here,
// PromiseWorker for the async ones): an exception that reached node-addon-api untranslated would
// end the process in std::terminate.
#include <napi.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cpu/kernels.h"
#include "lora/lora_adapter.h"
#include "promise_worker.h"
#include "sluice/engine.h"
#include "sluice/error.h"

namespace sluice_addon {

void init_grammar(Napi::Env env, Napi::Object exports);  // grammar_addon.cpp
void init_vision(Napi::Env env, Napi::Object exports);   // vision_addon.cpp


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
  o.Set("kvCacheDtype", i.kv_cache_dtype);
  o.Set("blockSize", double(i.block_size));
  o.Set("numBlocks", double(i.num_blocks));
  o.Set("backend", i.backend);
  o.Set("simd", i.simd);
  o.Set("numThreads", double(i.num_threads));
  o.Set("matmulPrecision", i.matmul_precision);
  o.Set("deviceBytes", double(i.device_bytes));
  o.Set("prefixCaching", i.prefix_caching);
  o.Set("draftVerification", i.draft_verification);
  if (!i.lora_ranks.empty()) {
    Napi::Array adapters = Napi::Array::New(env, i.lora_ranks.size());
    for (size_t k = 0; k < i.lora_ranks.size(); k++) {
      Napi::Object a = Napi::Object::New(env);
      a.Set("id", double(i.lora_ids[k]));
      a.Set("rank", double(i.lora_ranks[k]));
      a.Set("bytes", double(i.lora_bytes[k]));
      adapters.Set(uint32_t(k), a);
    }
    o.Set("loraAdapters", adapters);
  }
  if (i.eagle3_draft_vocab > 0) {
    Napi::Object h = Napi::Object::New(env);
    h.Set("draftVocabSize", double(i.eagle3_draft_vocab));
    Napi::Array aux = Napi::Array::New(env, i.eagle3_aux_layers.size());
    for (size_t k = 0; k < i.eagle3_aux_layers.size(); k++) aux.Set(uint32_t(k), double(i.eagle3_aux_layers[k]));
    h.Set("auxLayers", aux);
    h.Set("weightBytes", double(i.eagle3_weight_bytes));
    h.Set("kvBytes", double(i.eagle3_kv_bytes));
    o.Set("eagle3", h);
  }
  if (i.window > 0) {
    o.Set("window", double(i.window));
    o.Set("numWindowBlocks", double(i.num_window_blocks));
    o.Set("windowBlocksInUse", double(i.window_blocks_in_use));
    o.Set("windowKvBytes", double(i.window_kv_bytes));
  }
  if (!i.broken_reason.empty()) o.Set("brokenReason", i.broken_reason);
  return o;
}

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "NativeEngine",
                       {InstanceMethod("info", &EngineWrap::Info), InstanceMethod("step", &EngineWrap::Step),
                        InstanceMethod("injectFault", &EngineWrap::InjectFault),
                        InstanceMethod("provideMasks", &EngineWrap::ProvideMasks),
                        InstanceMethod("loadAdapter", &EngineWrap::LoadAdapter),
                        InstanceMethod("checkAdapter", &EngineWrap::CheckAdapter),
                        InstanceMethod("retireAdapter", &EngineWrap::RetireAdapter),
                        InstanceMethod("dispose", &EngineWrap::Dispose)});
  }

  // Constructed from JS only by load(): new NativeEngine(external)
  explicit EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
    if (info.Length() != 1 || !info[0].IsExternal())
      throw Napi::TypeError::New(info.Env(), "use load() to create an engine");
    engine_.reset(info[0].As<Napi::External<Engine>>().Data());
    config_ = engine_->info().config;
    mask_words_ = size_t(sluice::token_mask_words(config_.vocab_size));
    pipelined_ = engine_->pipelined();
  }

  // loadAdapter(dir) -> Promise<{id, rank, bytes}>: a LoRA adapter read on the pool (while steps
  // run), then installed in its turn among the steps submitted before and after it.
  Napi::Value LoadAdapter(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      Napi::Env env = info.Env();
      Engine& eng = engine(env);
      if (!info[0].IsString()) throw Napi::TypeError::New(env, "loadAdapter(dir: string)");
      std::string dir = info[0].As<Napi::String>().Utf8Value();
      struct Loaded {
        int32_t id = 0;
        int64_t rank = 0;
        size_t bytes = 0;
      };
      return in_turn<Loaded>(env, [&eng, dir, config = config_](Turn& turn) {
        auto adapter = std::make_shared<const sluice::LoraAdapter>(dir, config);
        turn.take();
        return Loaded{eng.install_adapter(adapter), adapter->rank(), adapter->bytes()};
      }, [](Napi::Env e, Loaded& l) -> Napi::Value {
        Napi::Object o = Napi::Object::New(e);
        o.Set("id", double(l.id));
        o.Set("rank", double(l.rank));
        o.Set("bytes", double(l.bytes));
        return o;
      });
    });
  }

  // checkAdapter(dir) -> Promise<{rank, bytes}>: what loadAdapter would check, on the pool, without
  // reading the matrices or touching the engine (LoraAdapter::inspect).
  Napi::Value CheckAdapter(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      Napi::Env env = info.Env();
      engine(env);  // not disposed
      if (!info[0].IsString()) throw Napi::TypeError::New(env, "checkAdapter(dir: string)");
      std::string dir = info[0].As<Napi::String>().Utf8Value();
      auto* worker = new PromiseWorker<sluice::LoraAdapter::Summary>(
          env, [dir, config = config_]() { return sluice::LoraAdapter::inspect(dir, config); },
          [](Napi::Env e, sluice::LoraAdapter::Summary& s) -> Napi::Value {
            Napi::Object o = Napi::Object::New(e);
            o.Set("rank", double(s.rank));
            o.Set("bytes", double(s.bytes));
            return o;
          },
          Value());
      Napi::Promise p = worker->promise();
      worker->Queue();
      return p;
    });
  }

  // retireAdapter(id) -> Promise<void>: new sequences may no longer name it (see Engine::retire_adapter).
  Napi::Value RetireAdapter(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      Napi::Env env = info.Env();
      Engine& eng = engine(env);
      if (!info[0].IsNumber()) throw Napi::TypeError::New(env, "retireAdapter(id: number)");
      const int32_t id = info[0].As<Napi::Number>().Int32Value();
      return in_turn<bool>(env, [&eng, id](Turn& turn) {
        turn.take();
        eng.retire_adapter(id);
        return true;
      }, [](Napi::Env e, bool&) -> Napi::Value { return e.Undefined(); });
    });
  }

 private:
  struct StepQueue;  // below

  Engine& engine(Napi::Env env) {
    if (!engine_ || dispose_pending_) throw make_error(env, "DISPOSED", "the engine has been disposed");
    return *engine_;
  }

  // NOTE: waits for a running step (the engine is not thread-safe); the facade reads it at load.
  Napi::Value Info(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      Engine& eng = engine(info.Env());
      std::lock_guard<std::mutex> lock(queue_->engine_mu);
      return info_to_js(info.Env(), eng.info());
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
      Engine& eng = engine(info.Env());
      std::lock_guard<std::mutex> lock(queue_->engine_mu);
      eng.inject_fault(info[0].As<Napi::Number>().Uint32Value(), fp);
      return info.Env().Undefined();
    });
  }

  Napi::Value Step(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    return guarded(env, [&]() -> Napi::Value { return StepImpl(info); });
  }

  // step(plan): queued behind the steps already submitted and run in submission order, so the
  // scheduler can hand in step N+1 while step N runs and the engine starts it without waiting for
  // JavaScript. The plan is copied: its typed arrays may be reused while the step waits or runs.
  Napi::Value StepImpl(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Engine& eng = engine(env);
    if (!info[0].IsObject()) throw Napi::TypeError::New(env, "step({seqIds, numTokens, frees?, adds?})");
    Napi::Object plan_js = info[0].As<Napi::Object>();
    auto plan = std::make_shared<sluice::StepPlan>(parse_plan(env, plan_js));
    if (!plan->constrained.empty()) {
      // The token masks of the constrained rows come later, through provideMasks(maskSlot, ...).
      if (!plan_js.Get("maskSlot").IsNumber()) throw Napi::TypeError::New(env, "plan.maskSlot must be a number with plan.constrained");
      const uint32_t id = plan_js.Get("maskSlot").As<Napi::Number>().Uint32Value();
      if (mask_slots_.count(id)) throw make_error(env, "INVALID_ARGUMENT", "plan.maskSlot is already waiting for masks");
      // One mask per constrained row, and one more after each of its drafts.
      auto slot = std::make_shared<MaskSlot>(size_t(sluice::token_mask_rows(*plan)) * mask_words_);
      mask_slots_.emplace(id, slot);
      plan->masks = slot;
    }

    std::shared_ptr<StepQueue> queue = queue_;
    const uint64_t ticket = queue->next_ticket++;
    if (pipelined_) {
      std::lock_guard<std::mutex> l(queue->mu);
      queue->waiting.emplace(ticket, plan);
      queue->cv.notify_all();  // a worker waiting for its step's device work may begin this one
    }
    in_flight_++;
    auto* worker = new PromiseWorker<sluice::StepResult>(
        env,
        [&eng, plan, queue, ticket, pipelined = pipelined_]() {
          // The next ticket is served whatever happens to this one.
          Turn turn{*queue, ticket};
          turn.take();
          if (!pipelined) return eng.step(*plan);
          return run_pipelined(eng, *queue, ticket, *plan);
        },
        &StepResultToJs, Value(),
        [this]() {
          if (--in_flight_ == 0 && dispose_pending_) engine_.reset();
        });
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
  }

  // A pipelined engine's step, on its worker's turn (holding engine_mu): begins it unless the
  // worker before began it early; while its device work runs, begins the next step as soon as
  // that one is submitted (so the device never waits for this result to reach JavaScript and the
  // next plan to be prepared); then ends it. A next step with constrained rows is left to its own
  // worker: its masks depend on this result. One worker at a time touches the engine, in ticket
  // order, so this needs no more pool threads than the serial loop.
  static sluice::StepResult run_pipelined(Engine& eng, StepQueue& q, uint64_t ticket, const sluice::StepPlan& plan) {
    std::unique_lock<std::mutex> l(q.mu);
    q.waiting.erase(ticket);
    auto early = q.begun_early.find(ticket);
    if (early != q.begun_early.end()) {
      const std::exception_ptr failed = early->second;
      q.begun_early.erase(early);
      if (failed) std::rethrow_exception(failed);
    } else {
      l.unlock();
      eng.begin_step(plan);
      l.lock();
    }
    for (;;) {
      auto next = q.waiting.find(ticket + 1);
      if (next != q.waiting.end() && next->second->constrained.empty()) {
        const std::shared_ptr<sluice::StepPlan> next_plan = next->second;
        q.waiting.erase(next);
        l.unlock();
        std::exception_ptr failed;
        try {
          eng.begin_step(*next_plan);
        } catch (...) {
          failed = std::current_exception();  // that step's promise rejects with it
        }
        l.lock();
        q.begun_early.emplace(ticket + 1, failed);
        break;
      }
      if (next != q.waiting.end() || eng.step_ready()) break;
      // Woken by a submission; the timeout bounds how late a finished step is noticed.
      q.cv.wait_for(l, std::chrono::microseconds(50));
    }
    l.unlock();
    return eng.end_step();
  }

  static const size_t kMaxPlanEntries = size_t(1) << 20;

  static Napi::Uint32Array uint32_field(Napi::Env env, const Napi::Object& o, const char* key, bool optional) {
    Napi::Value v = o.Get(key);
    if (optional && v.IsUndefined()) return Napi::Uint32Array();
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array)
      throw Napi::TypeError::New(env, std::string("plan.") + key + " must be a Uint32Array");
    Napi::Uint32Array a = v.As<Napi::Uint32Array>();
    if (a.ElementLength() > kMaxPlanEntries) throw make_error(env, "INVALID_ARGUMENT", std::string("plan.") + key + " is too long");
    return a;
  }

  static sluice::SamplingParams parse_sampling(Napi::Env env, const Napi::Object& s) {
    sluice::SamplingParams p;
    if (s.Get("temperature").IsNumber()) p.temperature = s.Get("temperature").As<Napi::Number>().FloatValue();
    if (s.Get("topP").IsNumber()) p.top_p = s.Get("topP").As<Napi::Number>().FloatValue();
    p.top_k = get_int32(env, s, "topK", 0, 0, INT32_MAX);
    if (s.Get("minP").IsNumber()) p.min_p = s.Get("minP").As<Napi::Number>().FloatValue();
    p.logprobs = get_int32(env, s, "logprobs", 0, 0, 20);
    Napi::Value seed = s.Get("seed");
    if (seed.IsBigInt()) {
      bool lossless;
      p.seed = seed.As<Napi::BigInt>().Uint64Value(&lossless);
    } else if (seed.IsNumber()) {
      p.seed = uint64_t(seed.As<Napi::Number>().Int64Value());
    }
    return p;
  }

  static sluice::StepPlan parse_plan(Napi::Env env, const Napi::Object& o) {
    sluice::StepPlan plan;
    Napi::Uint32Array ids = uint32_field(env, o, "seqIds", false), counts = uint32_field(env, o, "numTokens", false);
    plan.seq_ids.assign(ids.Data(), ids.Data() + ids.ElementLength());
    plan.num_tokens.assign(counts.Data(), counts.Data() + counts.ElementLength());
    Napi::Uint32Array frees = uint32_field(env, o, "frees", true);
    if (!frees.IsEmpty()) plan.frees.assign(frees.Data(), frees.Data() + frees.ElementLength());
    Napi::Uint32Array constrained = uint32_field(env, o, "constrained", true);
    if (!constrained.IsEmpty()) plan.constrained.assign(constrained.Data(), constrained.Data() + constrained.ElementLength());
    // Speculative decoding: numDrafts [n] and the drafts, flat (StepPlan::drafts).
    Napi::Uint32Array num_drafts = uint32_field(env, o, "numDrafts", true);
    if (!num_drafts.IsEmpty()) {
      plan.num_drafts.assign(num_drafts.Data(), num_drafts.Data() + num_drafts.ElementLength());
      Napi::Value d = o.Get("drafts");
      if (!d.IsTypedArray() || d.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
        throw Napi::TypeError::New(env, "plan.drafts must be an Int32Array with plan.numDrafts");
      Napi::Int32Array drafts = d.As<Napi::Int32Array>();
      if (drafts.ElementLength() > kMaxPlanEntries) throw make_error(env, "INVALID_ARGUMENT", "plan.drafts is too long");
      plan.drafts.assign(drafts.Data(), drafts.Data() + drafts.ElementLength());
    }
    Napi::Uint32Array next_drafts = uint32_field(env, o, "numNextDrafts", true);
    if (!next_drafts.IsEmpty()) plan.num_next_drafts.assign(next_drafts.Data(), next_drafts.Data() + next_drafts.ElementLength());
    Napi::Value adds_v = o.Get("adds");
    if (adds_v.IsUndefined()) return plan;
    if (!adds_v.IsArray()) throw Napi::TypeError::New(env, "plan.adds must be an array");
    Napi::Array adds = adds_v.As<Napi::Array>();
    if (adds.Length() > kMaxPlanEntries) throw make_error(env, "INVALID_ARGUMENT", "plan.adds is too long");
    plan.adds.resize(adds.Length());
    for (uint32_t i = 0; i < adds.Length(); i++) {
      Napi::Value av = adds.Get(i);
      if (!av.IsObject()) throw Napi::TypeError::New(env, "plan.adds[i] must be {seqId, promptTokens, sampling, keyed?, cacheScope?}");
      Napi::Object a = av.As<Napi::Object>();
      Napi::Value prompt = a.Get("promptTokens");
      if (!a.Get("seqId").IsNumber() || !prompt.IsTypedArray() ||
          prompt.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array || !a.Get("sampling").IsObject())
        throw Napi::TypeError::New(env, "plan.adds[i] must be {seqId, promptTokens: Int32Array, sampling, keyed?, cacheScope?}");
      sluice::SequenceAdd& add = plan.adds[i];
      add.seq_id = a.Get("seqId").As<Napi::Number>().Uint32Value();
      Napi::Int32Array tokens = prompt.As<Napi::Int32Array>();
      add.prompt.assign(tokens.Data(), tokens.Data() + tokens.ElementLength());
      add.params = parse_sampling(env, a.Get("sampling").As<Napi::Object>());
      add.keyed = a.Get("keyed").IsBoolean() && a.Get("keyed").As<Napi::Boolean>().Value();
      if (a.Get("cacheScope").IsString()) add.cache_scope = a.Get("cacheScope").As<Napi::String>().Utf8Value();
      if (!a.Get("images").IsUndefined()) add.images = parse_images(env, a.Get("images"));
      add.adapter = get_int32(env, a, "adapter", 0, 0, 1 << 16);
    }
    return plan;
  }

  // adds[i].images: [{offset, gridT?, gridH, gridW, embeds: Float32Array, hash: Uint8Array(32)}]
  // (sluice::SequenceImage; the engine validates the values).
  static std::vector<sluice::SequenceImage> parse_images(Napi::Env env, Napi::Value v) {
    const char* shape = "plan.adds[i].images must be [{offset, gridH, gridW, embeds: Float32Array, hash: Uint8Array(32)}]";
    if (!v.IsArray()) throw Napi::TypeError::New(env, shape);
    Napi::Array arr = v.As<Napi::Array>();
    if (arr.Length() > 1024) throw make_error(env, "INVALID_ARGUMENT", "plan.adds[i].images is too long");
    std::vector<sluice::SequenceImage> out(arr.Length());
    for (uint32_t k = 0; k < arr.Length(); k++) {
      if (!arr.Get(k).IsObject()) throw Napi::TypeError::New(env, shape);
      Napi::Object o = arr.Get(k).As<Napi::Object>();
      Napi::Value embeds = o.Get("embeds"), hash = o.Get("hash");
      if (!o.Get("offset").IsNumber() || !o.Get("gridH").IsNumber() || !o.Get("gridW").IsNumber() ||
          !embeds.IsTypedArray() || embeds.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
          !hash.IsTypedArray() || hash.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array ||
          hash.As<Napi::TypedArray>().ElementLength() != 32)
        throw Napi::TypeError::New(env, shape);
      sluice::SequenceImage& img = out[k];
      img.offset = o.Get("offset").As<Napi::Number>().Int64Value();
      img.grid_t = o.Get("gridT").IsNumber() ? o.Get("gridT").As<Napi::Number>().Int32Value() : 1;
      img.grid_h = o.Get("gridH").As<Napi::Number>().Int32Value();
      img.grid_w = o.Get("gridW").As<Napi::Number>().Int32Value();
      Napi::Float32Array e = embeds.As<Napi::Float32Array>();
      img.embeds.assign(e.Data(), e.Data() + e.ElementLength());
      const uint8_t* h = hash.As<Napi::Uint8Array>().Data();
      for (size_t w = 0; w < 4; w++) {
        uint64_t word = 0;
        for (size_t b = 0; b < 8; b++) word |= uint64_t(h[w * 8 + b]) << (8 * b);
        img.content_hash[w] = word;
      }
    }
    return out;
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
    auto copy_u8 = [&](const std::vector<uint8_t>& v) {
      auto a = Napi::Uint8Array::New(env, v.size());
      std::copy(v.begin(), v.end(), a.Data());
      return a;
    };
    auto copy_u32 = [&](const std::vector<uint32_t>& v) {
      auto a = Napi::Uint32Array::New(env, v.size());
      std::copy(v.begin(), v.end(), a.Data());
      return a;
    };
    o.Set("rowStatus", copy_u8(r.row_status));
    o.Set("rowComputed", copy_u32(r.row_computed));
    o.Set("rowPending", copy_u32(r.row_pending));
    o.Set("rowBlocks", copy_u32(r.row_blocks));
    o.Set("rowDrafted", copy_u32(r.row_drafted));
    o.Set("rowAccepted", copy_u32(r.row_accepted));
    if (!r.row_next_drafts.empty()) {
      o.Set("rowNextDrafts", copy_u32(r.row_next_drafts));
      auto nd = Napi::Int32Array::New(env, r.next_drafts.size());
      std::copy(r.next_drafts.begin(), r.next_drafts.end(), nd.Data());
      o.Set("nextDrafts", nd);
    }
    o.Set("addStatus", copy_u8(r.add_status));
    auto add_cached = Napi::Int32Array::New(env, r.add_cached.size());
    std::copy(r.add_cached.begin(), r.add_cached.end(), add_cached.Data());
    o.Set("addCached", add_cached);
    o.Set("numFreeBlocks", double(r.num_free_blocks));
    o.Set("numEvictableBlocks", double(r.num_evictable_blocks));
    o.Set("numCachedBlocks", double(r.num_cached_blocks));
    return o;
  }

  // provideMasks(maskSlot, masks: Uint32Array | null): the token masks of a submitted step's
  // constrained rows (plan.constrained order, ceil(vocab / 32) words each), or null when they
  // will not come (those rows then fail). Each slot takes one call.
  Napi::Value ProvideMasks(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      Napi::Env env = info.Env();
      if (!info[0].IsNumber()) throw Napi::TypeError::New(env, "provideMasks(maskSlot, masks | null)");
      auto it = mask_slots_.find(info[0].As<Napi::Number>().Uint32Value());
      if (it == mask_slots_.end()) throw make_error(env, "INVALID_ARGUMENT", "no step waits for masks in this slot");
      std::shared_ptr<MaskSlot> slot = it->second;
      mask_slots_.erase(it);
      if (info[1].IsNull() || info[1].IsUndefined()) {
        slot->settle(nullptr, 0);
        return env.Undefined();
      }
      if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
        slot->settle(nullptr, 0);
        throw Napi::TypeError::New(env, "masks must be a Uint32Array");
      }
      Napi::Uint32Array m = info[1].As<Napi::Uint32Array>();
      if (m.ElementLength() != slot->words()) {
        slot->settle(nullptr, 0);
        throw make_error(env, "INVALID_ARGUMENT", "masks must hold " + std::to_string(slot->words()) + " words (rows x ceil(vocab / 32))");
      }
      slot->settle(m.Data(), m.ElementLength());
      return env.Undefined();
    });
  }

  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    return guarded(info.Env(), [&]() -> Napi::Value {
      for (auto& [id, slot] : mask_slots_) slot->settle(nullptr, 0);  // steps waiting on masks finish
      mask_slots_.clear();
      if (in_flight_ > 0) dispose_pending_ = true;  // freed when the last submitted step settles
      else engine_.reset();
      return info.Env().Undefined();
    });
  }

  // Submitted steps run one at a time in submission order (tickets), each holding engine_mu.
  // A queued call's turn among the steps: take() waits for it and holds the engine; the turn
  // passes to the next ticket when this goes, taken or not (a call that failed before its turn
  // still waits for it, so that the queue keeps its order).
  struct Turn {
    StepQueue& q;
    uint64_t ticket;
    bool taken = false;
    std::unique_lock<std::mutex> engine;
    void take() {
      std::unique_lock<std::mutex> t(q.mu);
      q.cv.wait(t, [&] { return q.serving == ticket; });
      t.unlock();
      taken = true;
      engine = std::unique_lock<std::mutex>(q.engine_mu);
    }
    ~Turn() {
      if (!taken) take();
      engine.unlock();
      std::lock_guard<std::mutex> l(q.mu);
      q.serving++;
      q.cv.notify_all();
    }
  };

  // Runs work(turn) on the pool as the next ticket of the step queue (serial engines only: a
  // pipelined engine's workers begin steps ahead of their tickets).
  template <typename T, typename Work, typename ToJs>
  Napi::Value in_turn(Napi::Env env, Work work, ToJs to_js) {
    if (pipelined_) throw make_error(env, "INVALID_ARGUMENT", "adapters are loaded only into engines with serial steps");
    std::shared_ptr<StepQueue> queue = queue_;
    const uint64_t ticket = queue->next_ticket++;
    in_flight_++;
    auto* worker = new PromiseWorker<T>(
        env,
        [queue, ticket, work]() {
          Turn turn{*queue, ticket};
          return work(turn);
        },
        to_js, Value(),
        [this]() {
          if (--in_flight_ == 0 && dispose_pending_) engine_.reset();
        });
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
  }

  struct StepQueue {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t next_ticket = 0;  // JS thread only
    uint64_t serving = 0;      // under mu
    std::mutex engine_mu;      // held while the engine runs a step or answers a synchronous call
    // Pipelined engines only (run_pipelined), under mu: plans submitted and not yet begun, by
    // ticket; and steps begun by the worker before theirs, with begin_step's error (or null).
    std::map<uint64_t, std::shared_ptr<sluice::StepPlan>> waiting;
    std::map<uint64_t, std::exception_ptr> begun_early;
  };

  // Where a step's token masks meet it: provided on the JS thread, awaited by the step (after its
  // forward pass) on a pool thread. A step never waits forever: past kMaskWait its constrained
  // rows fail.
  class MaskSlot final : public sluice::TokenMaskSource {
   public:
    explicit MaskSlot(size_t words) : words_(words) {}
    size_t words() const { return words_; }
    void settle(const uint32_t* data, size_t n) {
      std::lock_guard<std::mutex> l(mu_);
      if (settled_) return;
      if (data) data_.assign(data, data + n);
      ok_ = data != nullptr;
      settled_ = true;
      cv_.notify_all();
    }
    const uint32_t* wait() override {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, std::chrono::seconds(60), [&] { return settled_; })) return nullptr;
      return ok_ ? data_.data() : nullptr;
    }

   private:
    const size_t words_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool settled_ = false, ok_ = false;
    std::vector<uint32_t> data_;
  };

  std::unique_ptr<Engine> engine_;
  size_t mask_words_ = 0;
  sluice::ModelConfig config_;  // the model's, for reading adapters off the engine's turn
  std::unordered_map<uint32_t, std::shared_ptr<MaskSlot>> mask_slots_;  // JS thread only
  std::shared_ptr<StepQueue> queue_ = std::make_shared<StepQueue>();
  int in_flight_ = 0;  // submitted steps not yet settled (JS thread only)
  bool pipelined_ = false;  // the engine begins and ends steps in halves (cuda_device_tokens)
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
  if (o.Get("quantization").IsString()) opts.quantization = o.Get("quantization").As<Napi::String>().Utf8Value();
  if (o.Get("kvCacheDtype").IsString()) opts.kv_cache_dtype = o.Get("kvCacheDtype").As<Napi::String>().Utf8Value();
  if (o.Get("cudaGemm").IsString()) opts.cuda_gemm = o.Get("cudaGemm").As<Napi::String>().Utf8Value();
  if (o.Get("cudaAttention").IsString()) opts.cuda_attention = o.Get("cudaAttention").As<Napi::String>().Utf8Value();
  if (o.Get("cudaSampler").IsString()) opts.cuda_sampler = o.Get("cudaSampler").As<Napi::String>().Utf8Value();
  if (o.Get("eagle3Dir").IsString()) opts.eagle3_dir = o.Get("eagle3Dir").As<Napi::String>().Utf8Value();
  if (!o.Get("loraAdapters").IsUndefined()) {
    if (!o.Get("loraAdapters").IsArray()) throw Napi::TypeError::New(env, "options.loraAdapters must be an array of directories");
    Napi::Array dirs = o.Get("loraAdapters").As<Napi::Array>();
    for (uint32_t i = 0; i < dirs.Length(); i++) {
      Napi::Value d = dirs[i];
      if (!d.IsString()) throw Napi::TypeError::New(env, "options.loraAdapters must be an array of directories");
      opts.lora_adapters.push_back(d.As<Napi::String>().Utf8Value());
    }
  }
  if (o.Get("loraReserveBytes").IsNumber()) {
    const double v = o.Get("loraReserveBytes").As<Napi::Number>().DoubleValue();
    if (!(v >= 0 && v <= 9007199254740991.0)) throw Napi::RangeError::New(env, "options.loraReserveBytes must be a byte count");
    opts.lora_reserve_bytes = size_t(v);
  }
  if (o.Get("prefixCaching").IsBoolean()) opts.prefix_caching = o.Get("prefixCaching").As<Napi::Boolean>().Value();
  if (o.Get("cudaDeviceTokens").IsBoolean()) opts.cuda_device_tokens = o.Get("cudaDeviceTokens").As<Napi::Boolean>().Value();
  if (o.Get("cudaGraphsAtLoad").IsBoolean()) opts.cuda_graphs_at_load = o.Get("cudaGraphsAtLoad").As<Napi::Boolean>().Value();
  if (o.Get("cudaMixedGraphs").IsBoolean()) opts.cuda_mixed_graphs = o.Get("cudaMixedGraphs").As<Napi::Boolean>().Value();
  opts.max_num_seqs = get_int32(env, o, "maxNumSeqs", 0, 0, 1 << 20);
  opts.max_batched_tokens = get_int32(env, o, "maxBatchedTokens", 0, 0, 1 << 24);
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
  size_t bytes = info[1].IsNumber() ? size_t(info[1].As<Napi::Number>().Int64Value()) : 0;  // 0: the native default
  int repeats = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : 5;
  bool keep = info[3].IsBoolean() && info[3].As<Napi::Boolean>().Value();
  auto* worker = new PromiseWorker<double>(
      env, [=]() { return sluice::measure_memory_bandwidth(threads, bytes, repeats, keep); },
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
  init_grammar(env, exports);
  init_vision(env, exports);
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
