// Every CUDA runtime call and kernel launch is checked; a failure becomes sluice::Error naming
// the call, the CUDA error and where it happened.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "sluice/error.h"

namespace sluice::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  throw Error(code, std::string("CUDA: ") + what + " failed: " + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace sluice::cuda

#define SLUICE_CUDA_CHECK(call)                                                              \
  do {                                                                                       \
    const cudaError_t sluice_err_ = (call);                                                  \
    if (sluice_err_ != cudaSuccess) ::sluice::cuda::throw_cuda_error(sluice_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: catches bad configurations (and, asynchronously, earlier faults).
#define SLUICE_CUDA_LAUNCH_CHECK(kernel_name)                                                \
  do {                                                                                       \
    const cudaError_t sluice_err_ = cudaGetLastError();                                      \
    if (sluice_err_ != cudaSuccess) ::sluice::cuda::throw_cuda_error(sluice_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)
