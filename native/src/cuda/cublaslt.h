// cuBLASLt, loaded at run time (dlopen) where the host has it: the build links cudart only, so a
// host without cuBLAS still loads the backend and keeps our own GEMM kernels.
//
// What it computes is exactly cuda::gemm's contract (y = x · W^T + bias, then the epilogue):
//   kStore / kAddTo: one cublasLtMatmul with f32 C/D (beta 1 adds the residual in place) and the
//     bias fused as cuBLASLt's BIAS epilogue where the library offers one, else a bias kernel;
//   kGatedMul: the matmul into f32 scratch (T cut into chunks that fit it), then our gated activation
//     kernel reads the interleaved [gate 8 | up 8] rows and writes h.
// One algorithm is chosen per problem (heuristic, cached), so a shape always runs the same
// kernel with the same fixed-order reduction: results are deterministic run to run.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "cuda/kernels.h"

namespace sluice::cuda {

class CublasLt {
 public:
  // Loads the library and creates a handle; nullptr (with *why set) when the host has none.
  static std::unique_ptr<CublasLt> open(std::string* why);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // "cuBLASLt 130100 (libcublasLt.so.13)".
  const std::string& describe() const { return describe_; }

  // Runs `a` (T > 0, any epilogue). `workspace` is cuBLASLt's (32 MiB is what Hopper kernels
  // want); `scratch` holds the f32 pre-activation of gated-activation chunks. Returns false, having
  // launched nothing, when cuBLASLt has no algorithm for the problem (the caller runs its own).
  bool gemm(const GemmArgs& a, DType e, void* workspace, size_t workspace_bytes, float* scratch,
            size_t scratch_floats, cudaStream_t stream);

  size_t num_plans() const { return plans_.size(); }

 private:
  struct Api;
  struct Plan;
  CublasLt() = default;
  const Plan* plan_for(DType e, int rows_n, int cols_t, int k, int ld_w, int ld_x, int ld_d, bool add, bool bias,
                       size_t workspace_bytes);

  void* lib_ = nullptr;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  std::string describe_;
  // Plans by problem, least recently used first out once kMaxPlans are held (T varies per step).
  static constexpr size_t kMaxPlans = 4096;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::unique_ptr<Plan>, std::list<std::string>::iterator>> plans_;
};

}  // namespace sluice::cuda
