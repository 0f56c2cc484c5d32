// An independent check of the CPU memory-bandwidth probe (sluice::measure_memory_bandwidth),
// sharing none of its code: N std::threads each sum their contiguous slice of one buffer with
// plain 64-bit loads, timed together; best of --repeats. The buffer is anonymous memory advised
// for transparent huge pages (--pages huge, the default: the memory the CPU backend keeps its
// weights in) or left in 4 KiB pages (--pages small). Prints one JSON line:
//   sluice_stream_read [--threads N] [--bytes B] [--repeats R] [--pages huge|small]
//   {"threads":2,"bytes":1073741824,"repeats":5,"bestBytesPerS":...,"samplesBytesPerS":[...]}
// bench/engine.ts runs it beside the probe, in the same sitting, and reports both.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = 0, repeats = 5;
  bool huge = true;
  size_t bytes = size_t(1) << 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--bytes") bytes = size_t(std::atoll(argv[i + 1]));
    else if (a == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (a == "--pages" && (std::strcmp(argv[i + 1], "huge") == 0 || std::strcmp(argv[i + 1], "small") == 0))
      huge = std::strcmp(argv[i + 1], "huge") == 0;
    else {
      std::fprintf(stderr, "usage: sluice_stream_read [--threads N] [--bytes B] [--repeats R] [--pages huge|small]\n");
      return 2;
    }
  }
  if (threads <= 0) threads = int(sysconf(_SC_NPROCESSORS_ONLN));
  const size_t n = bytes / sizeof(uint64_t);
  const size_t huge_page = size_t(2) << 20, mapped = n * sizeof(uint64_t) + huge_page;
  void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  uint64_t* buf = reinterpret_cast<uint64_t*>((uintptr_t(mem) + huge_page - 1) / huge_page * huge_page);
  if (huge) madvise(buf, n * sizeof(uint64_t), MADV_HUGEPAGE);  // a hint the kernel may ignore
  for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;  // every page written: no zero page
  std::vector<uint64_t> sums(size_t(threads) * 8);
  std::vector<double> samples;
  double best = 0;
  for (int r = 0; r < repeats; r++) {
    // The threads start together and the clock runs from the first start to the last finish.
    std::vector<std::thread> pool;
    std::atomic<bool> go{false};
    for (int t = 0; t < threads; t++) {
      pool.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire)) {
        }
        const size_t begin = n * size_t(t) / size_t(threads), end = n * size_t(t + 1) / size_t(threads);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        size_t i = begin;
        for (; i + 8 <= end; i += 8) {
          s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
          s4 += buf[i + 4], s5 += buf[i + 5], s6 += buf[i + 6], s7 += buf[i + 7];
        }
        for (; i < end; i++) s0 += buf[i];
        sums[size_t(t) * 8] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
      });
    }
    const auto start = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate = double(n * sizeof(uint64_t)) / dt;
    samples.push_back(rate);
    if (rate > best) best = rate;
  }
  uint64_t check = 0;
  for (int t = 0; t < threads; t++) check ^= sums[size_t(t) * 8];
  std::printf("{\"threads\":%d,\"bytes\":%zu,\"pages\":\"%s\",\"repeats\":%d,\"bestBytesPerS\":%.0f,\"samplesBytesPerS\":[", threads,
              n * sizeof(uint64_t), huge ? "huge" : "small", repeats, best);
  for (size_t i = 0; i < samples.size(); i++) std::printf("%s%.0f", i ? "," : "", samples[i]);
  std::printf("],\"checksum\":%llu}\n", (unsigned long long)(check & 0xffff));
  munmap(mem, mapped);
  return 0;
}
