// One reusable AsyncWorker: runs a C++ callable on the libuv pool and settles a promise.
// sluice::Error codes become the `code` property of the rejected Error.
#pragma once
#include <napi.h>

#include <functional>
#include <string>

#include "sluice/error.h"

namespace sluice_addon {

inline Napi::Error make_error(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error err = Napi::Error::New(env, message);
  err.Set("code", Napi::String::New(env, code));
  return err;
}

template <typename Result>
class PromiseWorker : public Napi::AsyncWorker {
 public:
  using Work = std::function<Result()>;
  using Convert = std::function<Napi::Value(Napi::Env, Result&)>;
  using Done = std::function<void()>;

  // keep_alive: the JS object whose native state `work` uses; referenced until settled.
  PromiseWorker(Napi::Env env, Work work, Convert convert, Napi::Object keep_alive = Napi::Object(), Done done = nullptr)
      : Napi::AsyncWorker(env, "sluice"),
        deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)),
        convert_(std::move(convert)),
        done_(std::move(done)) {
    if (!keep_alive.IsEmpty()) keep_alive_ = Napi::Persistent(keep_alive);
  }

  Napi::Promise promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      result_ = work_();
    } catch (const sluice::Error& e) {
      code_ = sluice::error_code_name(e.code());
      SetError(e.what());
    } catch (const std::bad_alloc&) {
      code_ = "OUT_OF_MEMORY";
      SetError("out of memory");
    } catch (const std::exception& e) {
      code_ = "INTERNAL";
      SetError(e.what());
    } catch (...) {
      code_ = "INTERNAL";
      SetError("unknown native exception");
    }
  }
  void OnOK() override {
    Napi::HandleScope scope(Env());
    if (done_) done_();
    try {
      deferred_.Resolve(convert_(Env(), result_));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override {
    Napi::HandleScope scope(Env());
    if (done_) done_();
    deferred_.Reject(make_error(Env(), code_, e.Message()).Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  Work work_;
  Convert convert_;
  Done done_;
  Napi::ObjectReference keep_alive_;
  Result result_{};
  std::string code_ = "INTERNAL";
};

}  // namespace sluice_addon
