// Device memory bandwidth, for the decode roofline: a device-to-device copy timed with events,
// counting the bytes read plus the bytes written.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/device_weights.h"
#include "sluice/engine.h"

namespace sluice {

double measure_device_bandwidth(size_t bytes, int repeats) {
  cuda::DeviceBuffer a(bytes), b(bytes);
  cudaEvent_t start, stop;
  SLUICE_CUDA_CHECK(cudaEventCreate(&start));
  SLUICE_CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 0;
  for (int r = 0; r < repeats + 1; r++) {  // the first copy warms up
    SLUICE_CUDA_CHECK(cudaEventRecord(start));
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    SLUICE_CUDA_CHECK(cudaEventRecord(stop));
    SLUICE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SLUICE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) best_ms = best_ms == 0 ? ms : std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(bytes) / (double(best_ms) / 1e3);
}

}  // namespace sluice
