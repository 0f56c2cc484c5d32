#include "cpu/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define SLUICE_PAUSE() _mm_pause()
#else
#define SLUICE_PAUSE() ((void)0)
#endif

namespace sluice::cpu {

// Workers wait for a new "generation" number. They spin for a short while first because a
// decode step issues hundreds of small parallel regions back to back, and a futex sleep/wake
// per region would cost more than the regions themselves; after the spin they block.
// NOTE: past kSpinsBeforeYield pauses a waiting thread (a worker between regions, the caller
// waiting for the workers) yields its core at each turn: on a machine shared with other
// processes, a pool thread is often descheduled mid-region, and a waiter that keeps spinning
// burns the time slice that thread needs to finish (batch-1 decode GEMVs on 2 threads with
// another process busy: about 10 -> 23 GB/s). On an idle machine yield returns at once.
constexpr int kSpinsBeforeYield = 500;
struct ThreadPool::Impl {
  int num_threads = 1;
  std::vector<std::thread> workers;
  const std::function<void(int, int)>* job = nullptr;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};
  // The first exception a worker's share of the current region threw; rethrown by run().
  std::mutex error_mu;
  std::exception_ptr worker_error;

  void worker_main(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation.load(std::memory_order_acquire);
      if (g == seen) {
        auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        int spins = 0;
        while ((g = generation.load(std::memory_order_acquire)) == seen && !stop.load(std::memory_order_relaxed)) {
          SLUICE_PAUSE();
          if (spins >= kSpinsBeforeYield) std::this_thread::yield();
          if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
            std::unique_lock<std::mutex> lock(mu);
            sleepers.fetch_add(1);
            cv.wait(lock, [&] { return generation.load(std::memory_order_acquire) != seen || stop.load(); });
            sleepers.fetch_sub(1);
            spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
          }
        }
      }
      if (stop.load(std::memory_order_relaxed)) return;
      seen = g;
      // NOTE: an exception must not escape the thread (std::terminate); it is handed to run().
      try {
        (*job)(index, num_threads);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!worker_error) worker_error = std::current_exception();
      }
      pending.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl) {
  if (num_threads <= 0) {
    long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    num_threads = n > 0 ? int(n) : 1;
  }
  impl_->num_threads = num_threads;
  for (int i = 1; i < num_threads; i++) impl_->workers.emplace_back([this, i] { impl_->worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop.store(true);
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

int ThreadPool::size() const { return impl_->num_threads; }

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  Impl& p = *impl_;
  if (p.num_threads == 1) {
    fn(0, 1);
    return;
  }
  p.job = &fn;
  p.pending.store(p.num_threads - 1, std::memory_order_release);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check (no lost wake-up).
    std::lock_guard<std::mutex> lock(p.mu);
    p.generation.fetch_add(1, std::memory_order_acq_rel);
  }
  if (p.sleepers.load() > 0) p.cv.notify_all();
  std::exception_ptr caller_error;
  try {
    fn(0, p.num_threads);
  } catch (...) {
    caller_error = std::current_exception();
  }
  // Wait even when our share threw: the workers are still running `fn`, which the caller owns.
  for (int spins = 0; p.pending.load(std::memory_order_acquire) != 0; spins++) {
    SLUICE_PAUSE();
    if (spins >= kSpinsBeforeYield) std::this_thread::yield();
  }
  p.job = nullptr;
  std::exception_ptr worker_error;
  {
    std::lock_guard<std::mutex> lock(p.error_mu);
    std::swap(worker_error, p.worker_error);
  }
  if (caller_error) std::rethrow_exception(caller_error);
  if (worker_error) std::rethrow_exception(worker_error);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = int(std::min<int64_t>(size(), max_chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  run([&](int index, int num) {
    if (index >= threads) return;
    const int64_t begin = n * index / threads, end = n * (index + 1) / threads;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace sluice::cpu
