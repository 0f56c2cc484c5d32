// A fixed pool of worker threads for data-parallel kernels. The calling thread takes part,
// so a pool of size N runs N-way parallel with N-1 workers.
#pragma once
#include <cstdint>
#include <functional>

namespace sluice::cpu {

class ThreadPool {
 public:
  // num_threads <= 0 picks the number of online CPUs.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  // Calls fn(thread_index, num_threads) once on each thread and waits for all. If any call
  // throws, run() still waits for every thread to finish, then rethrows one of the exceptions
  // (the caller's own first); the pool stays usable.
  // NOTE: not reentrant; one parallel region at a time per pool.
  void run(const std::function<void(int thread_index, int num_threads)>& fn);
  // Splits [0, n) into contiguous ranges of at least `grain` items and calls fn(begin, end).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace sluice::cpu
