// The native grammar engine (native/src/grammar) for Node: a vocabulary indexed once per model,
// grammars compiled on two threads of their own (off libuv's pool, which the engine's steps
// use), and matchers whose masks for a whole step are filled on the pool in one call while the
// event loop goes on.
//
//   grammarVocabulary(bytes, offsets, stopIds) -> Promise<External>   (new GrammarVocabulary(ext))
//   compileGrammar(vocabulary, text, timeoutMs) -> Promise<External>  (new CompiledGrammar(ext))
//   new GrammarMatcher(compiled): accept(id), canEnd(), ended(), fillMask(out, offset),
//                                 fillMaskIfUnchanged(out, offset) -> boolean,
//                                 countAhead(tokens: Int32Array) -> number (speculative drafts)
//   fillGrammarMasks(matchers[], out, offsets[, tokens, counts]) -> Promise<Int32Array of the rows
//     that failed>; with tokens (Int32Array, flat) and counts (Uint32Array, one per matcher), row r
//     fills 1 + counts[r] masks from offsets[r]: those after each prefix of its drafts
//     (TokenMatcher::fill_masks_ahead)
// Grammar errors reject with code INVALID_ARGUMENT.
#include <napi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "grammar/token_matcher.h"
#include "dedicated_threads.h"
#include "promise_worker.h"
#include "sluice/error.h"

namespace sluice_addon {
namespace {

using sluice::grammar::CompiledGrammar;
using sluice::grammar::GrammarError;
using sluice::grammar::TokenMatcher;
using sluice::grammar::TokenVocabulary;

template <typename T>
Napi::Value external_of(Napi::Env env, std::shared_ptr<T> value) {
  return Napi::External<std::shared_ptr<T>>::New(env, new std::shared_ptr<T>(std::move(value)),
                                                 [](Napi::Env, std::shared_ptr<T>* p) { delete p; });
}

template <typename T>
std::shared_ptr<T> from_external(const Napi::Value& v, const char* what) {
  if (!v.IsExternal()) throw Napi::TypeError::New(v.Env(), std::string("expected ") + what);
  return *v.As<Napi::External<std::shared_ptr<T>>>().Data();
}

template <typename F>
auto rethrow_grammar_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const GrammarError& e) {
    throw sluice::Error(sluice::ErrorCode::kInvalidArgument, e.what());
  }
}

class VocabularyWrap : public Napi::ObjectWrap<VocabularyWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "GrammarVocabulary", {InstanceAccessor<&VocabularyWrap::Size>("size")});
  }
  explicit VocabularyWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<VocabularyWrap>(info) {
    vocab = from_external<const TokenVocabulary>(info[0], "a vocabulary from grammarVocabulary()");
  }
  std::shared_ptr<const TokenVocabulary> vocab;

 private:
  Napi::Value Size(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(vocab->size())); }
};

class CompiledGrammarWrap : public Napi::ObjectWrap<CompiledGrammarWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "CompiledGrammar", {InstanceAccessor<&CompiledGrammarWrap::Bytes>("bytes"),
                                                InstanceAccessor<&CompiledGrammarWrap::Positions>("positions")});
  }
  explicit CompiledGrammarWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CompiledGrammarWrap>(info) {
    grammar = from_external<const CompiledGrammar>(info[0], "a grammar from compileGrammar()");
  }
  std::shared_ptr<const CompiledGrammar> grammar;

 private:
  Napi::Value Bytes(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(grammar->bytes())); }
  Napi::Value Positions(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(grammar->positions())); }
};

class MatcherWrap : public Napi::ObjectWrap<MatcherWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "GrammarMatcher",
                       {InstanceMethod<&MatcherWrap::Accept>("accept"), InstanceMethod<&MatcherWrap::CanEnd>("canEnd"),
                        InstanceMethod<&MatcherWrap::FillMaskIfUnchanged>("fillMaskIfUnchanged"),
                        InstanceMethod<&MatcherWrap::FillMaskWithin>("fillMaskWithin"),
                        InstanceMethod<&MatcherWrap::Ended>("ended"), InstanceMethod<&MatcherWrap::FillMask>("fillMask"),
                        InstanceMethod<&MatcherWrap::CountAhead>("countAhead")});
  }
  explicit MatcherWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<MatcherWrap>(info) {
    if (!info[0].IsObject()) throw Napi::TypeError::New(info.Env(), "expected a CompiledGrammar");
    auto* g = Napi::ObjectWrap<CompiledGrammarWrap>::Unwrap(info[0].As<Napi::Object>());
    try {
      matcher = std::make_unique<TokenMatcher>(g->grammar);
    } catch (const std::exception& e) {
      throw make_error(info.Env(), "INVALID_ARGUMENT", e.what());
    }
  }

  std::unique_ptr<TokenMatcher> matcher;
  /** A fillGrammarMasks call is using the matcher on the pool. */
  std::atomic<bool> busy{false};

 private:
  void check_idle(Napi::Env env) {
    if (busy.load()) throw Napi::Error::New(env, "the grammar matcher is filling a mask");
  }
  Napi::Value Accept(const Napi::CallbackInfo& info) {
    check_idle(info.Env());
    try {
      return Napi::Boolean::New(info.Env(), matcher->accept(info[0].As<Napi::Number>().Int32Value()));
    } catch (const std::exception& e) {  // a grammar too ambiguous to follow
      throw make_error(info.Env(), "INVALID_ARGUMENT", e.what());
    }
  }
  /** countAhead(tokens: Int32Array): how many of the tokens the grammar accepts in a row (state unchanged). */
  Napi::Value CountAhead(const Napi::CallbackInfo& info) {
    check_idle(info.Env());
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      throw Napi::TypeError::New(info.Env(), "countAhead(tokens: Int32Array)");
    auto tokens = info[0].As<Napi::Int32Array>();
    if (tokens.ElementLength() > 64) throw Napi::RangeError::New(info.Env(), "countAhead takes at most 64 tokens");
    try {
      return Napi::Number::New(info.Env(), double(matcher->count_ahead(tokens.Data(), int64_t(tokens.ElementLength()))));
    } catch (const std::exception& e) {
      throw make_error(info.Env(), "INVALID_ARGUMENT", e.what());
    }
  }
  Napi::Value CanEnd(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), matcher->can_end()); }
  Napi::Value Ended(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), matcher->ended()); }
  /**
   * fillMaskIfUnchanged(out, offset): true after copying the last mask when the matcher's state has
   * not moved since (a memcpy: fine on the JS thread); false, writing nothing, when the mask must be
   * computed (fillGrammarMasks) or the matcher is busy on the pool.
   */
  Napi::Value FillMaskIfUnchanged(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy.load()) return Napi::Boolean::New(env, false);
    auto out = info[0].As<Napi::Uint32Array>();
    size_t offset = info[1].IsNumber() ? size_t(info[1].As<Napi::Number>().Int64Value()) : 0;
    size_t words = matcher->compiled().vocab().words();
    if (offset + words > out.ElementLength()) throw Napi::RangeError::New(env, "the mask buffer is too small");
    return Napi::Boolean::New(env, matcher->fill_mask_if_unchanged(out.Data() + offset));
  }
  /**
   * fillMaskWithin(out, offset, budget): the mask filled here on the JS thread when that is cheap
   * (see TokenMatcher::fill_mask_within): the work done, or -1 (nothing written: use the pool).
   */
  Napi::Value FillMaskWithin(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (busy.load()) return Napi::Number::New(env, -1);
    auto out = info[0].As<Napi::Uint32Array>();
    size_t offset = size_t(info[1].As<Napi::Number>().Int64Value());
    double budget = info[2].As<Napi::Number>().DoubleValue();
    size_t words = matcher->compiled().vocab().words();
    if (offset + words > out.ElementLength()) throw Napi::RangeError::New(env, "the mask buffer is too small");
    try {
      return Napi::Number::New(env, double(matcher->fill_mask_within(out.Data() + offset, budget > 0 ? size_t(budget) : 0)));
    } catch (const std::exception& e) {
      throw make_error(env, "INVALID_ARGUMENT", e.what());
    }
  }
  /** fillMask(out: Uint32Array, offset: number): synchronous (tests and benches). */
  Napi::Value FillMask(const Napi::CallbackInfo& info) {
    check_idle(info.Env());
    auto out = info[0].As<Napi::Uint32Array>();
    size_t offset = info[1].IsNumber() ? size_t(info[1].As<Napi::Number>().Int64Value()) : 0;
    size_t words = matcher->compiled().vocab().words();
    if (offset + words > out.ElementLength()) throw Napi::RangeError::New(info.Env(), "the mask buffer is too small");
    try {
      matcher->fill_mask(out.Data() + offset);
    } catch (const std::exception& e) {
      throw make_error(info.Env(), "INVALID_ARGUMENT", e.what());
    }
    return info.Env().Undefined();
  }
};

Napi::Value GrammarVocabulary(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto bytes = info[0].As<Napi::Uint8Array>();
  auto offsets = info[1].As<Napi::Uint32Array>();
  auto stops = info[2].As<Napi::Int32Array>();
  size_t n = offsets.ElementLength();
  if (n == 0) throw Napi::RangeError::New(env, "offsets must hold the vocabulary size + 1 entries");
  std::vector<std::string> tokens(n - 1);
  for (size_t i = 0; i + 1 < n; i++) {
    uint32_t a = offsets[i], b = offsets[i + 1];
    if (a > b || b > bytes.ByteLength()) throw Napi::RangeError::New(env, "token offsets out of order or past the bytes");
    tokens[i].assign(reinterpret_cast<const char*>(bytes.Data()) + a, b - a);
  }
  std::vector<int32_t> stop_ids(stops.Data(), stops.Data() + stops.ElementLength());
  auto* worker = new PromiseWorker<std::shared_ptr<const TokenVocabulary>>(
      env,
      [tokens = std::move(tokens), stop_ids = std::move(stop_ids)]() mutable {
        return rethrow_grammar_errors([&] {
          return std::shared_ptr<const TokenVocabulary>(std::make_shared<TokenVocabulary>(std::move(tokens), std::move(stop_ids)));
        });
      },
      [](Napi::Env e, std::shared_ptr<const TokenVocabulary>& v) { return external_of(e, v); });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

Napi::Value CompileGrammar(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw Napi::TypeError::New(env, "expected a GrammarVocabulary");
  auto vocab = Napi::ObjectWrap<VocabularyWrap>::Unwrap(info[0].As<Napi::Object>())->vocab;
  std::string text = info[1].As<Napi::String>().Utf8Value();
  double timeout_ms = info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : 0;
  int64_t deadline = 0;
  if (timeout_ms > 0) {
    deadline = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count() +
               int64_t(timeout_ms);
  }
  // A tenant's schema decides how long this runs: on threads of its own, never on libuv's pool,
  // where the engine's steps wait for a thread (dedicated_threads.h).
  return DedicatedThreads::grammar().run<std::shared_ptr<const CompiledGrammar>>(
      env,
      [vocab, text = std::move(text), deadline]() {
        return rethrow_grammar_errors([&] {
          return std::shared_ptr<const CompiledGrammar>(
              std::make_shared<CompiledGrammar>(sluice::grammar::parse_grammar(text), vocab, deadline));
        });
      },
      [](Napi::Env e, std::shared_ptr<const CompiledGrammar>& g) { return external_of(e, g); });
}

Napi::Value FillGrammarMasks(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto list = info[0].As<Napi::Array>();
  auto out = info[1].As<Napi::Uint32Array>();
  auto offsets = info[2].As<Napi::Uint32Array>();
  size_t rows = list.Length();
  if (offsets.ElementLength() != rows) throw Napi::RangeError::New(env, "one offset per matcher");
  std::vector<MatcherWrap*> wraps(rows);
  std::vector<size_t> at(rows);
  // Speculative drafts: row r's are tokens[first[r], first[r] + counts[r]).
  std::vector<int32_t> tokens;
  std::vector<size_t> first(rows, 0), count(rows, 0);
  if (info.Length() > 3 && !info[3].IsUndefined()) {
    if (!info[3].IsTypedArray() || info[3].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array || !info[4].IsTypedArray() ||
        info[4].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array)
      throw Napi::TypeError::New(env, "fillGrammarMasks(matchers, out, offsets, tokens: Int32Array, counts: Uint32Array)");
    auto t = info[3].As<Napi::Int32Array>();
    auto c = info[4].As<Napi::Uint32Array>();
    if (c.ElementLength() != rows) throw Napi::RangeError::New(env, "one draft count per matcher");
    tokens.assign(t.Data(), t.Data() + t.ElementLength());
    size_t sum = 0;
    for (size_t r = 0; r < rows; r++) {
      if (c[r] > 64) throw Napi::RangeError::New(env, "at most 64 drafts per matcher");
      first[r] = sum;
      count[r] = c[r];
      sum += c[r];
    }
    if (sum != tokens.size()) throw Napi::RangeError::New(env, "the draft counts do not add up to the tokens");
  }
  for (size_t r = 0; r < rows; r++) {
    Napi::Value v = list[uint32_t(r)];
    wraps[r] = Napi::ObjectWrap<MatcherWrap>::Unwrap(v.As<Napi::Object>());
    at[r] = offsets[r];
    size_t words = wraps[r]->matcher->compiled().vocab().words();
    if (at[r] + (count[r] + 1) * words > out.ElementLength()) throw Napi::RangeError::New(env, "the mask buffer is too small");
    if (wraps[r]->busy.load()) throw Napi::Error::New(env, "a grammar matcher is already filling a mask");
  }
  for (auto* w : wraps) w->busy = true;
  uint32_t* data = out.Data();
  Napi::Object keep = Napi::Object::New(env);
  keep.Set("matchers", list);
  keep.Set("out", out);
  auto* worker = new PromiseWorker<std::vector<int32_t>>(
      env,
      [wraps, at, data, tokens = std::move(tokens), first, count]() {
        std::vector<int32_t> failed;
        for (size_t r = 0; r < wraps.size(); r++) {
          TokenMatcher& m = *wraps[r]->matcher;
          try {
            if (count[r] > 0) m.fill_masks_ahead(tokens.data() + first[r], int64_t(count[r]), data + at[r]);
            else m.fill_mask(data + at[r]);
          } catch (const std::exception&) {
            failed.push_back(int32_t(r));
          }
        }
        return failed;
      },
      [](Napi::Env e, std::vector<int32_t>& failed) -> Napi::Value {
        auto arr = Napi::Int32Array::New(e, failed.size());
        for (size_t k = 0; k < failed.size(); k++) arr[k] = failed[k];
        return arr;
      },
      keep, [wraps]() {
        for (auto* w : wraps) w->busy = false;
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

}  // namespace

void init_grammar(Napi::Env env, Napi::Object exports) {
  exports.Set("GrammarVocabulary", VocabularyWrap::Init(env));
  exports.Set("CompiledGrammar", CompiledGrammarWrap::Init(env));
  exports.Set("GrammarMatcher", MatcherWrap::Init(env));
  exports.Set("grammarVocabulary", Napi::Function::New(env, GrammarVocabulary));
  exports.Set("compileGrammar", Napi::Function::New(env, CompileGrammar));
  exports.Set("fillGrammarMasks", Napi::Function::New(env, FillGrammarMasks));
}

}  // namespace sluice_addon
