// Every CUDA runtime call and kernel launch is checked; a failure becomes sluice::Error naming
// the call, the CUDA error and where it happened.
#pragma once
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "sluice/error.h"

namespace sluice::cuda {

// Errors after which the CUDA context is unusable until the process exits ("sticky" errors: a
// kernel faulted, the device fell off the bus, ECC...). Every later call fails the same way, so
// the engine must stop taking work rather than fail every step anew.
inline bool is_sticky_cuda_error(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorAssert:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

// Whether a device query's failure only means that this host has no CUDA device: none found, or
// no NVIDIA driver installed at all (the runtime reports a missing libcuda as an insufficient
// driver, the same error as a driver too old for it, which must not pass for "no GPU").
inline bool means_no_cuda_device(cudaError_t err) {
  if (err == cudaErrorNoDevice) return true;
  if (err != cudaErrorInsufficientDriver) return false;
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) return true;
  dlclose(driver);
  return false;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory
                         : is_sticky_cuda_error(err)      ? ErrorCode::kDeviceFault
                                                          : ErrorCode::kInternal;
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
