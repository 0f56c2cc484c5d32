// Promise-returning work on threads of its own, off libuv's pool.
//
// Why: libuv's pool (UV_THREADPOOL_SIZE threads, 16 under the CLI) also runs the engine's steps
// (PromiseWorker). Work whose length an untrusted request decides, such as compiling a tenant's
// schema into a grammar, must never hold those threads: sixteen slow compiles would stall every
// organization's generation. DedicatedThreads runs such work on a fixed set of threads that
// nothing else uses, and settles each promise on the JS thread through a thread-safe function.
//
// Contract: run() is called on the JS thread of `env`; `work` runs on a dedicated thread and must
// not touch N-API; `convert` runs on the JS thread. If the environment is torn down before the
// work ends (a worker thread exiting), the result is dropped. The threads live as long as the
// process (a leaked singleton, detached): joining them at static destruction could block exit.
#pragma once
#include <napi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "promise_worker.h"
#include "sluice/error.h"

namespace sluice_addon {

class DedicatedThreads {
 public:
  // The pool for grammar compiles; `count` threads, fixed at first use.
  static DedicatedThreads& grammar(int count = 2) {
    static DedicatedThreads* pool = new DedicatedThreads(count);  // never destroyed (see above)
    return *pool;
  }
  // The thread that runs vision encodes (seconds each on a CPU, one at a time: each encode
  // already spreads over the encoder's own compute threads), so that queued images never hold
  // libuv's pool.
  static DedicatedThreads& vision() {
    static DedicatedThreads* pool = new DedicatedThreads(1);  // never destroyed (see above)
    return *pool;
  }

  template <typename Result>
  Napi::Promise run(Napi::Env env, std::function<Result()> work, std::function<Napi::Value(Napi::Env, Result&)> convert) {
    struct Outcome {
      Result value{};
      std::string code;  // empty: ok
      std::string message;
    };
    auto deferred = std::make_shared<Napi::Promise::Deferred>(Napi::Promise::Deferred::New(env));
    Napi::Promise promise = deferred->Promise();
    // A no-op JS function: the thread-safe function only carries the settlement back.
    auto tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}),
                                              "sluice-dedicated", 0, 1);
    post([work = std::move(work), convert = std::move(convert), deferred, tsfn]() mutable {
      auto outcome = new Outcome();
      try {
        outcome->value = work();
      } catch (const sluice::Error& e) {
        outcome->code = sluice::error_code_name(e.code());
        outcome->message = e.what();
      } catch (const std::bad_alloc&) {
        outcome->code = "OUT_OF_MEMORY";
        outcome->message = "out of memory";
      } catch (const std::exception& e) {
        outcome->code = "INTERNAL";
        outcome->message = e.what();
      } catch (...) {
        outcome->code = "INTERNAL";
        outcome->message = "unknown native exception";
      }
      const napi_status status = tsfn.BlockingCall(outcome, [deferred, convert](Napi::Env e, Napi::Function, Outcome* o) {
        std::unique_ptr<Outcome> owned(o);
        Napi::HandleScope scope(e);
        if (!o->code.empty()) {
          deferred->Reject(make_error(e, o->code, o->message).Value());
          return;
        }
        try {
          deferred->Resolve(convert(e, o->value));
        } catch (const Napi::Error& err) {
          deferred->Reject(err.Value());
        }
      });
      if (status != napi_ok) delete outcome;  // the environment is closing: nobody waits for it
      tsfn.Release();
    });
    return promise;
  }

 private:
  explicit DedicatedThreads(int count) {
    for (int i = 0; i < count; i++) std::thread([this] { loop(); }).detach();
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
};

}  // namespace sluice_addon
