// Ad-hoc matmul microbench for tuning (not part of the build):
//   g++ -O3 -std=c++17 -Inative/include -Inative/src native/tools/kernel_bench.cpp build/libsluice_core.a -lpthread -o /tmp/kb
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/kernels.h"

using namespace sluice;
int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto prec = argc > 2 && argv[2][0] == 'b' ? cpu::MatmulPrecision::BF16 : cpu::MatmulPrecision::F32;
  cpu::ThreadPool pool(threads);
  struct Shape { int64_t T, K, N, copies; };
  Shape shapes[] = {{1, 896, 4864, 24}, {1, 4864, 896, 24}, {8, 896, 4864, 24}, {32, 896, 4864, 24}, {512, 896, 4864, 2}, {512, 4864, 896, 2}, {32, 896, 151936, 1}};
  for (auto s : shapes) {
    std::vector<std::vector<uint16_t>> ws(size_t(s.copies), std::vector<uint16_t>(size_t(s.N * s.K)));
    for (auto& w : ws) for (size_t i = 0; i < w.size(); i++) w[i] = f32_to_bf16(float(int(i % 13) - 6) * 0.01f);
    std::vector<float> x(size_t(s.T * s.K), 0.5f), y(size_t(s.T * s.N));
    int iters = s.T >= 512 ? 4 : 20;
    for (int c = 0; c < s.copies; c++) cpu::matmul(pool, x.data(), s.T, s.K, ws[size_t(c)].data(), DType::BF16, s.N, nullptr, DType::F32, y.data(), prec);
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; it++)
      for (int c = 0; c < s.copies; c++) cpu::matmul(pool, x.data(), s.T, s.K, ws[size_t(c)].data(), DType::BF16, s.N, nullptr, DType::F32, y.data(), prec);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (iters * s.copies);
    std::printf("T=%4ld K=%5ld N=%6ld  %8.3f ms  %7.1f GB/s  %7.1f GFLOP/s\n", (long)s.T, (long)s.K, (long)s.N, dt * 1e3,
                double(s.N * s.K * 2) / dt / 1e9, 2.0 * double(s.T * s.N * s.K) / dt / 1e9);
  }
}
