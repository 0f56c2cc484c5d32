// The CUDA entry points of a build without the CUDA backend.
#ifndef SLUICE_WITH_CUDA
#include "engine/backend.h"
#include "sluice/error.h"

namespace sluice {

bool cuda_backend_available(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configure with SLUICE_CUDA=ON and a CUDA compiler)";
  return false;
}

double measure_device_bandwidth(size_t, int) {
  std::string why;
  cuda_backend_available(&why);
  throw Error(ErrorCode::kBackendUnavailable, why);
}

std::unique_ptr<Backend> create_cuda_backend(const ModelConfig&, const ModelWeights&, const EngineOptions&) {
  std::string why;
  cuda_backend_available(&why);
  throw Error(ErrorCode::kBackendUnavailable, why);
}

}  // namespace sluice
#endif
