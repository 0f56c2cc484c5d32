// Weight-only 4-bit matmul (W4A16) on the GPU for the Q4 weights of AWQ / GPTQ checkpoints: the
// host Q4 buffer (cpu/gemm_q4.h) is copied to the device byte for byte, and two kernels read it.
//
//   q4_gemv        decode (1..8 tokens): y = x · W^T (+ bias), activations kept in 16 bits (no
//                  activation quantization), every weight dequantized in registers to the exact
//                  f32 value scale * (code - zero), products summed in f32.
//   q4_dequantize  prefill: W to bf16 / f16 in the model's column order (each value rounded once
//                  from the exact f32 one), for the tensor-core GEMM (kernels.h gemm).
//
// Both only enqueue kernels on `stream` (no allocation, no synchronisation): graph-capturable.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sluice/dtype.h"

namespace sluice::cuda {

// A Q4 matrix [N, K] in device memory, in gemm_q4.h's layout (the sections of the host buffer,
// unchanged): per row Kp / 2 bytes of codes in 128-column chunks (byte j of a chunk holds column
// j in its low nibble and column 64 + j in its high one), f32 scales and u8 zeros per group of
// `group` packed columns, and, for act-order checkpoints, perm (packed column j multiplies model
// input feature perm[j]). w[n, j] = scales[n, j / group] * (code[n, j] - zeros[n, j / group]).
struct Q4DeviceWeights {
  const uint8_t* codes = nullptr;  // [N, Kp / 2], 16-byte aligned
  const float* scales = nullptr;   // [N, ng]
  const uint8_t* zeros = nullptr;  // [N, ng], 0..16
  const int32_t* perm = nullptr;   // [K] or nullptr
  int64_t N = 0, K = 0, Kp = 0, group = 0, ng = 0;
};

// Bytes of the device copy of a host Q4 buffer (its q4_bytes: header and sections).
size_t q4_device_bytes(const void* host_q4);
// Copies the host Q4 buffer `host_q4` (synchronously) to `device_dst` (q4_device_bytes of it,
// 16-byte aligned, e.g. straight from cudaMalloc) and returns the view of the copy.
Q4DeviceWeights q4_upload(const void* host_q4, void* device_dst);
// The view of a Q4 buffer already in device memory at `device_base`, given (a host copy of) its
// header: the sections sit at gemm_q4.h's offsets from the base. Throws kInvalidArgument for a
// group that is not a positive multiple of 32 or a base that is not 16-byte aligned.
Q4DeviceWeights q4_device_view(const void* host_header, const void* device_base);

enum class Q4Out : uint8_t {
  kStore16,   // y: E [rows, ld_y], the f32 sum (+ bias) rounded once (round to nearest even)
  kStoreF32,  // y: f32 [rows, ld_y], the f32 sum (+ bias)
  kAddF32,    // y: f32 [rows, ld_y] += the f32 sum (+ bias) (residual add)
};

struct Q4GemvArgs {
  const void* x = nullptr;      // [rows, ld_x] E (bf16 or f16), model column order, ld_x >= K
  int ld_x = 0;
  int rows = 0;                 // tokens, 1..8
  const float* bias = nullptr;  // [N] or nullptr
  void* y = nullptr;            // [rows, ld_y], E or f32 as `out` says
  int ld_y = 0;
  Q4Out out = Q4Out::kStore16;
  int num_sms = 0;              // the device's SMs (picks 2 or 4 weight rows per warp); 0 takes 4
};

// y[t, n] = sum over packed columns j < K of x[t, perm ? perm[j] : j] * w[n, j] (+ bias[n]).
//
// Batch invariant: y[t] depends only on x[t], W and the bias, never on `rows` or on the other
// tokens. Each lane of the warp owning a weight row sums the 16-byte code pieces lane, lane + 32,
// lane + 64, ... of the row in that order with one f32 FMA per column, and the warp's 32 partial
// sums are added by a fixed butterfly; none of that depends on the token count. Throws
// kInvalidArgument for rows outside 1..8.
void q4_gemv(const Q4DeviceWeights& w, const Q4GemvArgs& a, DType e, cudaStream_t stream);

// Where q4_dequantize puts weight row n: row n (kRows), or gate / up row n of a fused gate-up
// matrix interleaved in 16-row groups [gate 8 | up 8] as kernels.h's kGatedMul reads it: row
// (n / 8) * 16 + n % 8 (kGateRows), 8 rows further (kUpRows).
enum class Q4Rows : uint8_t { kRows, kGateRows, kUpRows };

// out[row(n), perm ? perm[j] : j] = E(w[n, j]) for every packed column j < K: out [*, ld_out] E in
// the model's column order (ld_out >= K), row(n) as `rows` says. Columns K..ld_out and rows no
// weight row maps to are not written (a zero-filled buffer keeps the GEMM's zero padding).
void q4_dequantize(const Q4DeviceWeights& w, void* out, int ld_out, DType e, cudaStream_t stream,
                   Q4Rows rows = Q4Rows::kRows);

}  // namespace sluice::cuda
