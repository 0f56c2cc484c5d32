// Q4 (AWQ / GPTQ 4-bit) weights on the GPU: the decode GEMV and the dequantization for prefill
// (contracts in q4_gemm.h, layout in cpu/gemm_q4.h).
//
// A row's codes are read in 16-byte pieces: piece p is bytes 16p..16p+15 of the row, i.e. bytes
// 16 (p % 4).. of 128-column chunk p / 4, so byte i (word i / 4, byte i % 4 of a uint4) holds
// packed column piece_col(p) + i in its low nibble and piece_col(p) + 64 + i in its high nibble.
// Each half of a piece (16 columns starting at a multiple of 16) lies in one group, as groups are
// multiples of 32 columns: a piece needs two (scale, zero) pairs.
//
// Dequantization in registers, exact: with magic(v) = the float 2^23 + v (bits 0x4B000000 | v),
// magic(q) - magic(zero) is exactly q - zero (both operands are integers below 2^24), and
// scale * (q - zero) is then rounded once, as q4_dequantize_row computes it on the host. A byte
// permute puts a nibble under the 0x4B exponent byte in one instruction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cpu/gemm_q4.h"
#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/q4_gemm.h"

namespace sluice::cuda {

namespace {

constexpr int kPieceCols = 32;                  // packed columns of one 16-byte piece of codes
constexpr int kGemvWarps = 8;                   // warps of a GEMV block (they share its x tile)
constexpr size_t kGemvSmemBytes = 48 * 1024;    // x tile budget: the default dynamic shared limit
constexpr int kDequantThreads = 256;

__host__ __device__ __forceinline__ int64_t piece_col(int64_t p) { return (p >> 2) * 128 + (p & 3) * 16; }

__device__ __forceinline__ float magic(uint32_t v) { return __uint_as_float(0x4B000000u | v); }

// The weight of byte K's nibble of `nibbles` (one code per byte, already masked to 4 bits):
// scale * (q - zero), mz = magic(zero).
template <int K>
__device__ __forceinline__ float dequant(uint32_t nibbles, float scale, float mz) {
  const float q = __uint_as_float(__byte_perm(nibbles, 0x4B000000u, 0x7440u | K));  // magic(byte K)
  return __fmul_rn(scale, __fsub_rn(q, mz));  // explicit roundings: never contracted
}

// out[k] = the weight of byte k's nibble of `nibbles` (codes masked to one per byte).
__device__ __forceinline__ void dequant4(uint32_t nibbles, float scale, float mz, float* out) {
  out[0] = dequant<0>(nibbles, scale, mz);
  out[1] = dequant<1>(nibbles, scale, mz);
  out[2] = dequant<2>(nibbles, scale, mz);
  out[3] = dequant<3>(nibbles, scale, mz);
}
__device__ __forceinline__ uint32_t low_nibbles(uint32_t word) { return word & 0x0F0F0F0Fu; }
__device__ __forceinline__ uint32_t high_nibbles(uint32_t word) { return (word >> 4) & 0x0F0F0F0Fu; }

__device__ __forceinline__ uint32_t word_of(const uint4& v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// The x tile of pieces p0 .. p0 + tile_p in shared memory, as f32 in packed column order:
// xs[(t * 8 + part) * tile_p + pl] holds the 4 columns piece_col(p0 + pl) + 64 (part / 4) +
// 4 (part % 4) + 0..3 of token t, i.e. what word part % 4 of the piece's codes multiplies (low
// nibbles for part < 4, high ones after). Lane l reads entry pl = l + 32 i of a part: 16-byte
// reads of consecutive addresses, free of bank conflicts. Columns past K and tokens past `rows`
// are zero.
template <typename E, int TMAX>
__device__ __forceinline__ void gather_tile(const Q4DeviceWeights& w, const Q4GemvArgs& a, int64_t p0, int tile_p,
                                            float4* xs) {
  const E* x = static_cast<const E*>(a.x);
  const int entries = TMAX * 8 * tile_p;
  for (int i = threadIdx.x; i < entries; i += blockDim.x) {
    const int pl = i % tile_p, part = (i / tile_p) % 8, t = i / (tile_p * 8);
    const int64_t col = piece_col(p0 + pl) + (part >> 2) * 64 + (part & 3) * 4;
    float f[4] = {0.f, 0.f, 0.f, 0.f};
    if (t < a.rows) {
      const E* xr = x + size_t(t) * size_t(a.ld_x);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const int64_t j = col + k;
        if (j < w.K) f[k] = to_float<E>(xr[w.perm ? __ldg(w.perm + j) : j]);
      }
    }
    xs[i] = make_float4(f[0], f[1], f[2], f[3]);
  }
}

// One warp per ROWS weight rows, TMAX >= rows tokens, U pieces per row in flight. The block's
// warps walk the row in tiles of tile_p pieces (a multiple of 32) whose x they gather first; lane
// l takes pieces l, l + 32, ... of every tile, so over the whole row it takes l, l + 32, l + 64,
// ... in that order whatever tile_p, TMAX or ROWS: a token's sum is the same chain of FMAs (per
// piece: word 0's 4 low then 4 high columns, then words 1..3) followed by the same butterfly.
template <typename E, int TMAX, int ROWS, int U>
__global__ void __launch_bounds__(kGemvWarps * 32) q4_gemv_kernel(Q4DeviceWeights w, Q4GemvArgs a, int tile_p) {
  extern __shared__ float4 xs[];  // [TMAX, 8, tile_p]: gather_tile
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5)) * ROWS;
  const int64_t P = w.Kp / kPieceCols;  // pieces per row
  const uint4* codes = reinterpret_cast<const uint4*>(w.codes);

  bool row_ok[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; r++) row_ok[r] = row0 + r < w.N;
  float acc[ROWS][TMAX];
#pragma unroll
  for (int r = 0; r < ROWS; r++)
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[r][t] = 0.f;

  for (int64_t p0 = 0; p0 < P; p0 += tile_p) {
    __syncthreads();  // every warp is done with the previous tile
    gather_tile<E, TMAX>(w, a, p0, tile_p, xs);
    __syncthreads();
    const int pend = P - p0 < tile_p ? int(P - p0) : tile_p;  // pieces of this tile
    for (int pl0 = lane; pl0 < pend; pl0 += 32 * U) {
      uint4 cw[U][ROWS];
      float s_lo[U][ROWS], mz_lo[U][ROWS], s_hi[U][ROWS], mz_hi[U][ROWS];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t p = p0 + pl0 + 32 * u;
        const int64_t col = piece_col(p), g_lo = col / w.group, g_hi = (col + 64) / w.group;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
          if (pl0 + 32 * u < pend && row_ok[r]) {
            const int64_t n = row0 + r;
            cw[u][r] = __ldg(codes + size_t(n) * size_t(P) + size_t(p));
            s_lo[u][r] = __ldg(w.scales + n * w.ng + g_lo);
            s_hi[u][r] = __ldg(w.scales + n * w.ng + g_hi);
            mz_lo[u][r] = magic(__ldg(w.zeros + n * w.ng + g_lo));
            mz_hi[u][r] = magic(__ldg(w.zeros + n * w.ng + g_hi));
          } else {  // weight 0: no NaN from stale registers
            cw[u][r] = make_uint4(0, 0, 0, 0);
            s_lo[u][r] = s_hi[u][r] = 0.f;
            mz_lo[u][r] = mz_hi[u][r] = magic(0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int pl = pl0 + 32 * u;
        if (pl >= pend) break;
#pragma unroll
        for (int q = 0; q < 4; q++) {
          float wv[ROWS][8];
#pragma unroll
          for (int r = 0; r < ROWS; r++) {
            const uint32_t word = word_of(cw[u][r], q);
            dequant4(low_nibbles(word), s_lo[u][r], mz_lo[u][r], &wv[r][0]);
            dequant4(high_nibbles(word), s_hi[u][r], mz_hi[u][r], &wv[r][4]);
          }
#pragma unroll
          for (int t = 0; t < TMAX; t++) {
            const float4 xl = xs[(t * 8 + q) * tile_p + pl], xh = xs[(t * 8 + 4 + q) * tile_p + pl];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
              float s = acc[r][t];
              s = fmaf(wv[r][0], xl.x, s);
              s = fmaf(wv[r][1], xl.y, s);
              s = fmaf(wv[r][2], xl.z, s);
              s = fmaf(wv[r][3], xl.w, s);
              s = fmaf(wv[r][4], xh.x, s);
              s = fmaf(wv[r][5], xh.y, s);
              s = fmaf(wv[r][6], xh.z, s);
              s = fmaf(wv[r][7], xh.w, s);
              acc[r][t] = s;
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; r++)
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[r][t] = warp_sum(acc[r][t]);

  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < TMAX; t++) {
    if (t >= a.rows) break;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      if (!row_ok[r]) continue;
      const int64_t n = row0 + r;
      const float v = a.bias ? acc[r][t] + a.bias[n] : acc[r][t];
      const size_t at = size_t(t) * size_t(a.ld_y) + size_t(n);
      if (a.out == Q4Out::kStore16) static_cast<E*>(a.y)[at] = from_float<E>(v);
      else if (a.out == Q4Out::kStoreF32) static_cast<float*>(a.y)[at] = v;
      else static_cast<float*>(a.y)[at] += v;
    }
  }
}

// Pieces per x tile: as many as TMAX tokens' f32 tile fits in kGemvSmemBytes, in multiples of
// 32 (lanes), no more than the row has (rounded up to 32).
int gemv_tile_pieces(int tmax, int64_t Kp) {
  const int64_t fit = int64_t(kGemvSmemBytes / (size_t(tmax) * 8 * sizeof(float4))) / 32 * 32;
  const int64_t need = (Kp / kPieceCols + 31) / 32 * 32;
  return int(std::min(fit, need));
}

template <typename E, int TMAX, int ROWS>
void launch(const Q4DeviceWeights& w, const Q4GemvArgs& a, cudaStream_t stream) {
  constexpr int U = TMAX <= 2 ? 2 : 1;
  const int tile_p = gemv_tile_pieces(TMAX, w.Kp);
  const size_t smem = size_t(TMAX) * 8 * size_t(tile_p) * sizeof(float4);
  const int64_t warps = (w.N + ROWS - 1) / ROWS;
  const int64_t blocks = (warps + kGemvWarps - 1) / kGemvWarps;
  q4_gemv_kernel<E, TMAX, ROWS, U><<<unsigned(blocks), kGemvWarps * 32, smem, stream>>>(w, a, tile_p);
  SLUICE_CUDA_LAUNCH_CHECK("q4_gemv_kernel");
}

template <typename E, int TMAX>
void launch_rows(const Q4DeviceWeights& w, const Q4GemvArgs& a, cudaStream_t stream) {
  // Four rows per warp share each x read from shared memory among more FMAs, but take about 130
  // registers at TMAX 1 and 2 and about 160 at 4 and 8 (two rows: 75..100): four only for one or
  // two tokens and when the device still gets two blocks per SM (num_sms 0: always). Not yet
  // measured on a device. Either way a row's sum is the same.
  const int64_t blocks4 = (w.N + 4 * kGemvWarps - 1) / (4 * kGemvWarps);
  if (a.num_sms <= 0 || (TMAX <= 2 && blocks4 >= 2 * int64_t(a.num_sms))) launch<E, TMAX, 4>(w, a, stream);
  else launch<E, TMAX, 2>(w, a, stream);
}

template <typename E>
void gemv_typed(const Q4DeviceWeights& w, const Q4GemvArgs& a, cudaStream_t stream) {
  if (a.rows == 1) launch_rows<E, 1>(w, a, stream);
  else if (a.rows == 2) launch_rows<E, 2>(w, a, stream);
  else if (a.rows <= 4) launch_rows<E, 4>(w, a, stream);
  else launch_rows<E, 8>(w, a, stream);
}

// One thread per (row, piece): 32 weights from one 16-byte load, written as two runs of 16
// columns (two 16-byte stores each when `vec`: no permutation, out 16-byte aligned, ld_out % 8
// == 0, the run inside K), else element by element through perm.
template <typename E>
__global__ void __launch_bounds__(kDequantThreads) q4_dequantize_kernel(Q4DeviceWeights w, E* out, int ld_out,
                                                                        bool vec, Q4Rows rows) {
  const int64_t P = w.Kp / kPieceCols;
  const int64_t i = int64_t(blockIdx.x) * kDequantThreads + threadIdx.x;  // = n * P + p
  if (i >= w.N * P) return;
  const int64_t n = i / P, p = i - n * P;
  const uint4 cw = __ldg(reinterpret_cast<const uint4*>(w.codes) + i);
  const int64_t out_row = rows == Q4Rows::kRows ? n : (n / 8) * 16 + n % 8 + (rows == Q4Rows::kUpRows ? 8 : 0);
  E* row = out + size_t(out_row) * size_t(ld_out);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t c0 = piece_col(p) + 64 * h, g = c0 / w.group;
    const float s = __ldg(w.scales + n * w.ng + g), mz = magic(__ldg(w.zeros + n * w.ng + g));
    alignas(16) E v[16];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const uint32_t word = word_of(cw, q);
      float f[4];
      dequant4(h == 0 ? low_nibbles(word) : high_nibbles(word), s, mz, f);
#pragma unroll
      for (int k = 0; k < 4; k++) v[4 * q + k] = from_float<E>(f[k]);
    }
    if (vec && c0 + 16 <= w.K) {
      uint4* dst = reinterpret_cast<uint4*>(row + c0);
      dst[0] = *reinterpret_cast<const uint4*>(&v[0]);
      dst[1] = *reinterpret_cast<const uint4*>(&v[8]);
    } else {
#pragma unroll
      for (int m = 0; m < 16; m++) {
        const int64_t j = c0 + m;
        if (j < w.K) row[w.perm ? __ldg(w.perm + j) : j] = v[m];
      }
    }
  }
}

template <typename E>
void dequantize_typed(const Q4DeviceWeights& w, void* out, int ld_out, Q4Rows rows, cudaStream_t stream) {
  const int64_t threads = w.N * (w.Kp / kPieceCols);
  if (threads == 0) return;
  const bool vec = !w.perm && reinterpret_cast<uintptr_t>(out) % 16 == 0 && ld_out % 8 == 0;
  const int64_t blocks = (threads + kDequantThreads - 1) / kDequantThreads;
  q4_dequantize_kernel<E><<<unsigned(blocks), kDequantThreads, 0, stream>>>(w, static_cast<E*>(out), ld_out, vec, rows);
  SLUICE_CUDA_LAUNCH_CHECK("q4_dequantize_kernel");
}

void check_dtype(DType e, const char* what) {
  if (e != DType::BF16 && e != DType::F16)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": activations must be bf16 or f16, not " + dtype_name(e));
}

}  // namespace

size_t q4_device_bytes(const void* host_q4) {
  const auto* h = static_cast<const cpu::Q4Header*>(host_q4);
  return cpu::q4_bytes(h->N, h->K, h->group, (h->flags & cpu::kQ4Perm) != 0);
}

Q4DeviceWeights q4_device_view(const void* host_header, const void* device_base) {
  const auto* h = static_cast<const cpu::Q4Header*>(host_header);
  if (h->group <= 0 || h->group % 32 != 0)
    throw Error(ErrorCode::kInvalidArgument, "q4: group " + std::to_string(h->group) + " is not a positive multiple of 32");
  if (h->Kp != cpu::q4_padded_k(h->K) || h->N < 0)
    throw Error(ErrorCode::kInvalidArgument, "q4: inconsistent header (N " + std::to_string(h->N) + ", K " +
                                                 std::to_string(h->K) + ", Kp " + std::to_string(h->Kp) + ")");
  if (reinterpret_cast<uintptr_t>(device_base) % 16 != 0)
    throw Error(ErrorCode::kInvalidArgument, "q4: device copy not 16-byte aligned");
  const bool perm = (h->flags & cpu::kQ4Perm) != 0;
  const cpu::Q4Sections s = cpu::q4_sections(h->N, h->K, h->group, perm);
  const auto* base = static_cast<const uint8_t*>(device_base);
  Q4DeviceWeights w;
  w.codes = base + s.codes;
  w.scales = reinterpret_cast<const float*>(base + s.scales);
  w.zeros = base + s.zeros;
  w.perm = perm ? reinterpret_cast<const int32_t*>(base + s.perm) : nullptr;
  w.N = h->N;
  w.K = h->K;
  w.Kp = h->Kp;
  w.group = h->group;
  w.ng = cpu::q4_groups(h->Kp, h->group);
  return w;
}

Q4DeviceWeights q4_upload(const void* host_q4, void* device_dst) {
  const Q4DeviceWeights w = q4_device_view(host_q4, device_dst);
  SLUICE_CUDA_CHECK(cudaMemcpy(device_dst, host_q4, q4_device_bytes(host_q4), cudaMemcpyHostToDevice));
  return w;
}

void q4_gemv(const Q4DeviceWeights& w, const Q4GemvArgs& a, DType e, cudaStream_t stream) {
  check_dtype(e, "q4_gemv");
  if (a.rows < 1 || a.rows > 8)
    throw Error(ErrorCode::kInvalidArgument, "q4_gemv: rows " + std::to_string(a.rows) + " outside 1..8");
  if (a.ld_x < w.K || (a.rows > 1 && a.ld_y < w.N))
    throw Error(ErrorCode::kInvalidArgument, "q4_gemv: ld_x below K or ld_y below N");
  if (w.N == 0) return;
  if (e == DType::BF16) gemv_typed<__nv_bfloat16>(w, a, stream);
  else gemv_typed<__half>(w, a, stream);
}

void q4_dequantize(const Q4DeviceWeights& w, void* out, int ld_out, DType e, cudaStream_t stream, Q4Rows rows) {
  check_dtype(e, "q4_dequantize");
  if (ld_out < w.K) throw Error(ErrorCode::kInvalidArgument, "q4_dequantize: ld_out below K");
  if (e == DType::BF16) dequantize_typed<__nv_bfloat16>(w, out, ld_out, rows, stream);
  else dequantize_typed<__half>(w, out, ld_out, rows, stream);
}

}  // namespace sluice::cuda
