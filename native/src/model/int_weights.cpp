#include "model/int_weights.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cpu/gemm_q4.h"
#include "cpu/gemm_q8.h"
#include "cpu/thread_pool.h"
#include "sluice/error.h"

namespace sluice {

namespace {

// AWQ packs eight outputs per word in the order 0, 2, 4, 6, 1, 3, 5, 7: output 8c + m sits in
// nibble kAwqNibble[m] of word c.
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Reads codes, zeros, scales and groups of one stored linear.
class Unpacked {
 public:
  Unpacked(const IntLinear& t, const QuantizationConfig& q, int64_t out, int64_t in)
      : t_(t), awq_(q.int_format == IntFormat::Awq), bits_(int(q.bits)), per_word_(32 / int(q.bits)),
        mask_((1u << q.bits) - 1), offset_(q.zero_offset ? 1 : 0), N_(out), K_(in),
        G_(q.group_size > 0 ? q.group_size : in), ng_((in + G_ - 1) / G_),
        qw_(static_cast<const uint32_t*>(t.qweight.data)), qz_(static_cast<const uint32_t*>(t.qzeros.data)),
        gidx_(t.g_idx.data ? static_cast<const int32_t*>(t.g_idx.data) : nullptr) {}

  int code(int64_t j, int64_t k) const {
    if (awq_) return int(qw_[k * (N_ / 8) + j / 8] >> (4 * kAwqNibble[j % 8])) & 0xf;
    return int((qw_[(k / per_word_) * N_ + j] >> (bits_ * (k % per_word_))) & mask_);
  }
  // GPTQ's original format stores zero - 1 (so a zero of 0 reads back as 2^bits).
  int zero(int64_t g, int64_t j) const {
    if (awq_) return int(qz_[g * (N_ / 8) + j / 8] >> (4 * kAwqNibble[j % 8])) & 0xf;
    return int((qz_[g * (N_ / per_word_) + j / per_word_] >> (bits_ * (j % per_word_))) & mask_) + offset_;
  }
  float scale(int64_t g, int64_t j) const { return t_.scales.float_at(g * N_ + j); }
  int64_t group(int64_t k) const { return gidx_ ? gidx_[k] : k / G_; }
  int64_t G() const { return G_; }
  int64_t ng() const { return ng_; }
  const int32_t* g_idx() const { return gidx_; }

 private:
  const IntLinear& t_;
  bool awq_;
  int bits_, per_word_;
  uint32_t mask_;
  int offset_;
  int64_t N_, K_, G_, ng_;
  const uint32_t* qw_;
  const uint32_t* qz_;
  const int32_t* gidx_;
};

TensorView view_of(const TensorView& from, const std::string& name, DType dtype, int64_t out, int64_t in,
                   void* data, size_t nbytes) {
  TensorView v;
  v.name = name;
  v.file = from.file;
  v.dtype = dtype;
  v.shape = {out, in};
  v.data = data;
  v.nbytes = nbytes;
  return v;
}

// Packed column order for Q4: identity when every input k is in group k / G; else the inputs
// sorted by group, when that makes each group the contiguous run [g * G, (g + 1) * G) (GPTQ's
// act-order); else none (empty `ok`).
struct Order {
  bool ok = true;
  std::vector<int32_t> perm;  // empty: identity
};
Order packed_order(const Unpacked& u, int64_t K) {
  Order o;
  if (!u.g_idx()) return o;
  bool identity = true;
  for (int64_t k = 0; k < K && identity; k++) identity = u.group(k) == k / u.G();
  if (identity) return o;
  o.perm.resize(size_t(K));
  std::iota(o.perm.begin(), o.perm.end(), 0);
  std::stable_sort(o.perm.begin(), o.perm.end(), [&](int32_t a, int32_t b) { return u.group(a) < u.group(b); });
  for (int64_t j = 0; j < K && o.ok; j++) o.ok = u.group(o.perm[size_t(j)]) == j / u.G();
  return o;
}

}  // namespace

IntLinearShapes int_linear_shapes(const QuantizationConfig& q, int64_t out, int64_t in) {
  const int64_t G = q.group_size > 0 ? q.group_size : in, ng = (in + G - 1) / G, per_word = 32 / q.bits;
  if (q.int_format == IntFormat::Awq) return {{in, out / 8}, {ng, out / 8}, {ng, out}};
  return {{in / per_word, out}, {ng, out / per_word}, {ng, out}};
}

TensorView repack_int_linear(const IntLinear& t, const QuantizationConfig& q, int64_t out, int64_t in,
                             const std::string& name, std::vector<std::shared_ptr<HostBuffer>>& owned,
                             cpu::ThreadPool& pool) {
  const int64_t N = out, K = in;
  const Unpacked u(t, q, out, in);
  if (u.g_idx())
    for (int64_t k = 0; k < K; k++)
      if (u.group(k) < 0 || u.group(k) >= u.ng())
        throw Error(ErrorCode::kModelFileInvalid,
                    t.g_idx.file + ": tensor \"" + t.g_idx.name + "\" names group " + std::to_string(u.group(k)) +
                        " for input " + std::to_string(k) + " (the scales hold " + std::to_string(u.ng()) + ")");
  const Order order = packed_order(u, K);

  if (q.bits == 4 && order.ok) {
    // One group over all inputs is one group over the padded row.
    const int64_t group = q.group_size > 0 ? q.group_size : cpu::q4_padded_k(K);
    const int32_t* perm = order.perm.empty() ? nullptr : order.perm.data();
    const size_t bytes = cpu::q4_bytes(N, K, group, perm != nullptr);
    auto buf = std::make_shared<HostBuffer>(bytes);
    void* dst = buf->data();
    cpu::q4_init(dst, N, K, group, perm);
    pool.parallel_for(N, 16, [&](int64_t b, int64_t e) {
      std::vector<uint8_t> codes(static_cast<size_t>(K));
      for (int64_t j = b; j < e; j++) {
        for (int64_t c = 0; c < K; c++) codes[size_t(c)] = uint8_t(u.code(j, perm ? perm[c] : c));
        cpu::q4_set_row(dst, j, codes.data());
        // Packed groups are the stored ones (act-order: the sort keeps group g at g * G).
        for (int64_t g = 0; g < u.ng(); g++) cpu::q4_set_group(dst, j, g, u.scale(g, j), uint8_t(u.zero(g, j)));
      }
    });
    owned.push_back(buf);
    return view_of(t.qweight, name, DType::Q4, N, K, dst, bytes);
  }

  // 8-bit symmetric (every zero 128), groups in order, scales exact in f16: Q8_0 as stored.
  bool q8 = q.bits == 8 && order.ok && order.perm.empty();
  for (int64_t g = 0; g < u.ng() && q8; g++)
    for (int64_t j = 0; j < N && q8; j++)
      q8 = u.zero(g, j) == 128 && f16_to_f32(f32_to_f16(u.scale(g, j))) == u.scale(g, j);
  if (q8) {
    const int64_t Kp = cpu::q8_padded_k(K), nb = Kp / cpu::kQ8Block;
    const size_t bytes = cpu::q8_bytes(N, K);
    auto buf = std::make_shared<HostBuffer>(bytes);
    int8_t* values = reinterpret_cast<int8_t*>(buf->data());
    uint16_t* scales = reinterpret_cast<uint16_t*>(buf->data() + size_t(N) * size_t(Kp));
    pool.parallel_for(N, 16, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; j++) {
        for (int64_t k = 0; k < Kp; k++) values[j * Kp + k] = k < K ? int8_t(u.code(j, k) - 128) : 0;
        for (int64_t blk = 0; blk < nb; blk++)
          scales[j * nb + blk] = blk * cpu::kQ8Block < K ? f32_to_f16(u.scale(blk * cpu::kQ8Block / u.G(), j)) : 0;
      }
    });
    owned.push_back(buf);
    return view_of(t.qweight, name, DType::Q8_0, N, K, buf->data(), bytes);
  }

  // f32: a 16-bit float scale times an integer of at most 9 bits is exact.
  const size_t bytes = size_t(N) * size_t(K) * sizeof(float);
  auto buf = std::make_shared<HostBuffer>(bytes);
  float* w = reinterpret_cast<float*>(buf->data());
  pool.parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; j++)
      for (int64_t k = 0; k < K; k++) {
        const int64_t g = u.group(k);
        w[j * K + k] = u.scale(g, j) * float(u.code(j, k) - u.zero(g, j));
      }
  });
  owned.push_back(buf);
  return view_of(t.qweight, name, DType::F32, N, K, w, bytes);
}

}  // namespace sluice
