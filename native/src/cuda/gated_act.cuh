// The gated activations of the MLP (kernels.h GateAct), shared by the GEMM epilogue, the GEMV and
// the cuBLASLt path's separate epilogue so that every path rounds alike. The arithmetic is the
// CPU kernels' (cpu/kernels.cpp): silu_mul, gelu_tanh_mul and swiglu_clamped_mul.
#pragma once
#include "cuda/kernels.h"

namespace sluice::cuda {

__device__ __forceinline__ float gated_value(float gate, float up, GateAct act, float limit) {
  switch (act) {
    case GateAct::kGeluTanh: {
      const float c = 0.7978845608028654f;  // sqrt(2 / pi)
      return 0.5f * gate * (1.f + tanhf(c * (gate + 0.044715f * gate * gate * gate))) * up;
    }
    case GateAct::kSwigluClamped: {
      const float g = fminf(gate, limit);
      const float u = fminf(fmaxf(up, -limit), limit);
      return (u + 1.f) * (g / (1.f + __expf(-1.702f * g)));
    }
    default: return gate / (1.f + __expf(-gate)) * up;
  }
}

}  // namespace sluice::cuda
