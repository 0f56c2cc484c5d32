#include "cuda/vision_tower.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/check.h"
#include "cuda/device_weights.h"
#include "cuda/flash_attention.h"
#include "cuda/kernels.h"
#include "cuda/vision_kernels.h"
#include "sluice/dtype.h"
#include "sluice/error.h"
#include "vision/qwen2_vl_encoder.h"
#include "vision/qwen2_vl_layout.h"
#include "vision/siglip_encoder.h"

namespace sluice::cuda {

namespace {

using vision::EncoderImage;

constexpr float kQwenNormEps = 1e-6f;  // the Qwen2.5-VL tower's RMSNorms (as the CPU tower)

// The flash kernel's head dim for a head of hd (0: none).
int padded_head_dim(int64_t hd) { return hd <= 64 ? 64 : hd <= 128 ? 128 : hd <= 256 ? 256 : 0; }

// The tower's element type: the checkpoint's f16, else bf16 (f32 checkpoints are rounded).
DType tower_dtype(DType checkpoint) { return checkpoint == DType::F16 ? DType::F16 : DType::BF16; }

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); i++) v[size_t(i)] = t.float_at(i);
  return v;
}

// One [rows, ld] matrix of E built in host memory (zero padded), then uploaded in one copy.
class HostMatrix {
 public:
  HostMatrix(int64_t rows, int64_t ld, DType e) : ld_(ld), e_(e), h_(size_t(rows * ld), 0) {}

  // Source row `src` of `t` (its first dimension; the rest flattened: cols values) to row `dst`,
  // column c to col(c) (c itself without a map).
  void row(const TensorView& t, int64_t src, int64_t dst, const std::function<int64_t(int64_t)>& col = nullptr) {
    const int64_t cols = t.numel() / t.shape[0];
    uint16_t* out = h_.data() + dst * ld_;
    for (int64_t c = 0; c < cols; c++) out[col ? col(c) : c] = bits(t.float_at(src * cols + c));
  }
  void rows(const TensorView& t, int64_t dst0, const std::function<int64_t(int64_t)>& col = nullptr) {
    for (int64_t r = 0; r < t.shape[0]; r++) row(t, r, dst0 + r, col);
  }
  // Row r of a row-major f32 matrix with `cols` columns.
  void row(const std::vector<float>& m, int64_t cols, int64_t src, int64_t dst) {
    for (int64_t c = 0; c < cols; c++) h_[size_t(dst * ld_ + c)] = bits(m[size_t(src * cols + c)]);
  }
  DeviceBuffer upload(size_t* total) const {
    DeviceBuffer b(h_.size() * 2);
    SLUICE_CUDA_CHECK(cudaMemcpy(b.get(), h_.data(), h_.size() * 2, cudaMemcpyHostToDevice));
    *total += b.bytes();
    return b;
  }

 private:
  uint16_t bits(float f) const { return e_ == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
  int64_t ld_;
  DType e_;
  std::vector<uint16_t> h_;
};

// A pass's host array on the device (the host copy stays alive until the pass synchronises).
template <typename T>
void upload_async(DeviceBuffer& dst, const std::vector<T>& src, cudaStream_t stream) {
  if (dst.bytes() < src.size() * sizeof(T)) dst.allocate(src.size() * sizeof(T), stream);
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}

// Grows `b` to at least `bytes` (zero filled, so padding columns nobody writes stay zero).
void ensure(DeviceBuffer& b, size_t bytes, cudaStream_t stream) {
  if (b.bytes() < bytes) b.allocate(bytes, stream);
}

// Attention segments (windows, frames, images) as the attention kernels' sequences: token t of
// segment s is at position t - start(s) and sees its whole segment (last = the segment's end);
// with one-slot blocks, the block table of s lists the rows start(s) .. end(s) - 1.
struct Segments {
  std::vector<int32_t> seq, pos, last, table;
  int32_t stride = 0;
  DeviceBuffer seq_d, pos_d, last_d, table_d, stride_d;

  void build(const std::vector<int64_t>& cu, cudaStream_t stream) {
    const int64_t rows = cu.back();
    stride = 1;
    for (size_t s = 0; s + 1 < cu.size(); s++) stride = std::max<int32_t>(stride, int32_t(cu[s + 1] - cu[s]));
    seq.resize(size_t(rows));
    pos.resize(size_t(rows));
    last.resize(size_t(rows));
    table.assign(size_t(cu.size() - 1) * size_t(stride), 0);
    for (size_t s = 0; s + 1 < cu.size(); s++)
      for (int64_t r = cu[s]; r < cu[s + 1]; r++) {
        seq[size_t(r)] = int32_t(s);
        pos[size_t(r)] = int32_t(r - cu[s]);
        last[size_t(r)] = int32_t(cu[s + 1] - cu[s] - 1);
        table[s * size_t(stride) + size_t(r - cu[s])] = int32_t(r);
      }
    upload_async(seq_d, seq, stream);
    upload_async(pos_d, pos, stream);
    upload_async(last_d, last, stream);
    upload_async(table_d, table, stream);
    ensure(stride_d, sizeof(int32_t), stream);
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(stride_d.get(), &stride, sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  size_t bytes() const { return seq_d.bytes() + pos_d.bytes() + last_d.bytes() + table_d.bytes() + stride_d.bytes(); }
};

// What both towers share: the device, stream and GEMM workspace, and the attention step.
class TowerBase : public VisionTower {
 protected:
  TowerBase(int device, DType e, bool flash) : device_(device), e_(e), flash_(flash) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (means_no_cuda_device(err) || (err == cudaSuccess && (device < 0 || device >= count)))
      throw Error(ErrorCode::kBackendUnavailable, "the vision tower cannot run on CUDA device " + std::to_string(device) +
                                                      ": this host has " + std::to_string(err == cudaSuccess ? count : 0) +
                                                      " CUDA device(s)");
    SLUICE_CUDA_CHECK(err);
    SLUICE_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    SLUICE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    SLUICE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    partials_.allocate(sizeof(float) * (size_t(4) << 20), stream_);
    tickets_.allocate(sizeof(int) * 16384, stream_);
    ws_ = GemmWorkspace{partials_.get<float>(), partials_.bytes() / 4, tickets_.get<int>(), int(tickets_.bytes() / 4),
                        prop.multiProcessorCount};
  }
  ~TowerBase() override {
    if (stream_) {
      cudaSetDevice(device_);
      cudaStreamSynchronize(stream_);  // NOTE: unchecked: a destructor; buffers free after this
      cudaStreamDestroy(stream_);
    }
  }

  // y (f32, ld_y) = x (E [T, ld_x]) W^T + bias, stored or added (residual).
  void linear(const void* x, int ld_x, const DeviceBuffer& w, int ld_w, const DeviceBuffer& bias, int T, int N, int K,
              float* y, int ld_y, bool add) {
    GemmArgs g;
    g.x = x;
    g.ld_x = ld_x;
    g.w = w.get();
    g.ld_w = ld_w;
    g.bias = bias.bytes() ? bias.get<float>() : nullptr;
    g.T = T;
    g.N = N;
    g.K = K;
    g.epilogue = add ? Epilogue::kAddTo : Epilogue::kStore;
    g.y = y;
    g.ld_y = ld_y;
    gemm(g, e_, ws_, stream_);
  }

  // attn [T, nh * hp] (E) = each segment's bidirectional attention over q [T, nh, hp] f32 and
  // k, v [T, nh, hp] (E), heads of hd values zero padded to hp.
  void attention(const Segments& s, int T, int nh, int hd, int hp, const float* q, const void* k, const void* v, void* attn) {
    AttentionArgs a;
    a.q = q;
    a.T = T;
    a.nq = nh;
    a.nkv = nh;
    a.hd = hp;
    a.token_seq = s.seq_d.get<int32_t>();
    a.positions = s.pos_d.get<int32_t>();
    a.last = s.last_d.get<int32_t>();
    a.block_tables = s.table_d.get<int32_t>();
    a.table_stride = s.stride_d.get<int32_t>();
    a.block_size = 1;
    a.k_cache = k;
    a.v_cache = v;
    a.scale = float(1.0 / std::sqrt(double(hd)));
    a.num_splits = 1;
    a.out = attn;
    a.ld_out = nh * hp;
    if (flash_) flash_prefill_attention(a, e_, stream_);
    else paged_attention(a, e_, stream_);
  }

  // Copies n floats of the device result to the host once the pass's work is done.
  std::vector<float> download(const float* d, size_t n) {
    std::vector<float> h(n);
    SLUICE_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }

  size_t base_bytes() const { return partials_.bytes() + tickets_.bytes(); }

  // Whole images per pass, in order: at most kPassRows rows together, an image with more alone.
  template <typename RowsOf, typename Run>
  static std::vector<std::vector<float>> in_passes(const std::vector<EncoderImage>& images, RowsOf rows_of, Run run) {
    std::vector<std::vector<float>> outs;
    outs.reserve(images.size());
    size_t i = 0;
    while (i < images.size()) {
      size_t j = i + 1;
      int64_t rows = rows_of(images[i]);
      while (j < images.size() && rows + rows_of(images[j]) <= kPassRows) rows += rows_of(images[j++]);
      std::vector<EncoderImage> pass(images.begin() + std::ptrdiff_t(i), images.begin() + std::ptrdiff_t(j));
      for (std::vector<float>& o : run(pass)) outs.push_back(std::move(o));
      i = j;
    }
    return outs;
  }

  int device_;
  DType e_;
  bool flash_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer partials_, tickets_;
  GemmWorkspace ws_{};
  std::mutex mu_;
  size_t weight_bytes_ = 0;
};

// ---- Qwen2.5-VL ---------------------------------------------------------------------------

class QwenTower final : public TowerBase {
 public:
  QwenTower(std::shared_ptr<const vision::VisionEncoder> cpu, int device, bool flash)
      : TowerBase(device, tower_dtype(cpu->patch_embed().dtype), flash), cpu_(std::move(cpu)) {
    const vision::VisionConfig& c = cpu_->config();
    H_ = int(c.hidden);
    nh_ = int(c.num_heads);
    hd_ = int(c.head_dim());
    hp_ = padded_head_dim(hd_);
    I_pad_ = int(round_up8(c.intermediate));
    pd_ = int(c.patch_dim());
    ld_pd_ = int(round_up8(pd_));
    unit_ = int(c.unit());
    out_ = int(c.out_hidden);
    if (hp_ == 0)
      throw Error(ErrorCode::kUnsupportedModel, "the CUDA vision tower takes heads of at most 256 dims (this one has " +
                                                    std::to_string(hd_) + ")");
    if (H_ % 8 != 0)
      throw Error(ErrorCode::kUnsupportedModel, "the CUDA vision tower needs vision_config.hidden_size a multiple of 8 (got " +
                                                    std::to_string(H_) + ")");
    upload();
  }

  std::vector<std::vector<float>> encode_batch(const std::vector<EncoderImage>& images) override {
    cpu_->check_batch(images);
    std::lock_guard<std::mutex> lock(mu_);
    SLUICE_CUDA_CHECK(cudaSetDevice(device_));
    return in_passes(images, [&](const EncoderImage& im) { return im.num_values / pd_; },
                     [&](const std::vector<EncoderImage>& pass) { return run(pass); });
  }

  size_t device_bytes() const override {
    return weight_bytes_ + base_bytes() + windows_.bytes() + frames_.bytes() + px_f_.bytes() + px_e_.bytes() + rc_.bytes() +
           cos_sin_.bytes() + x_.bytes() + xn_.bytes() + qkv_.bytes() + q_.bytes() + k_.bytes() + v_.bytes() + attn_.bytes() +
           h_.bytes() + z_.bytes() + ze_.bytes() + y_.bytes();
  }

 private:
  struct Block {
    DeviceBuffer norm1, norm2, qkv_w, qkv_b, proj_w, proj_b, gate_up_w, gate_up_b, down_w, down_b;
  };

  void upload() {
    const vision::VisionConfig& c = cpu_->config();
    const int64_t I = c.intermediate;
    size_t* total = &weight_bytes_;
    {
      HostMatrix m(H_, ld_pd_, e_);
      m.rows(cpu_->patch_embed(), 0);
      patch_w_ = m.upload(total);
    }
    const std::function<int64_t(int64_t)> pad_heads = [this](int64_t col) { return (col / hd_) * hp_ + col % hd_; };
    for (const vision::VisionEncoder::Block& b : cpu_->blocks()) {
      Block d;
      d.norm1 = upload_f32(to_f32(*b.norm1), total);
      d.norm2 = upload_f32(to_f32(*b.norm2), total);
      HostMatrix qkv(3 * H_, H_, e_);
      qkv.rows(*b.qkv.w, 0);
      d.qkv_w = qkv.upload(total);
      d.qkv_b = upload_f32(to_f32(*b.qkv.b), total);
      HostMatrix proj(H_, nh_ * hp_, e_);  // input columns at the padded heads' places
      proj.rows(*b.proj.w, 0, pad_heads);
      d.proj_w = proj.upload(total);
      d.proj_b = upload_f32(to_f32(*b.proj.b), total);
      // gate and up interleaved in 16-row groups [gate 8 | up 8] for the SiLU-and-mul epilogue.
      HostMatrix gu(2 * int64_t(I_pad_), H_, e_);
      std::vector<float> gub(size_t(2 * I_pad_), 0.f);
      const std::vector<float> gb = to_f32(*b.gate.b), ub = to_f32(*b.up.b);
      for (int64_t i = 0; i < I; i++) {
        const int64_t g_row = (i / 8) * 16 + i % 8, u_row = g_row + 8;
        gu.row(*b.gate.w, i, g_row);
        gu.row(*b.up.w, i, u_row);
        gub[size_t(g_row)] = gb[size_t(i)];
        gub[size_t(u_row)] = ub[size_t(i)];
      }
      d.gate_up_w = gu.upload(total);
      d.gate_up_b = upload_f32(gub, total);
      HostMatrix down(H_, I_pad_, e_);
      down.rows(*b.down.w, 0);
      d.down_w = down.upload(total);
      d.down_b = upload_f32(to_f32(*b.down.b), total);
      blocks_.push_back(std::move(d));
    }
    ln_q_ = upload_f32(to_f32(cpu_->merger_norm()), total);
    const int64_t merged = int64_t(H_) * unit_;
    HostMatrix fc1(merged, merged, e_);
    fc1.rows(*cpu_->merger_fc1().w, 0);
    fc1_w_ = fc1.upload(total);
    fc1_b_ = upload_f32(to_f32(*cpu_->merger_fc1().b), total);
    HostMatrix fc2(out_, merged, e_);
    fc2.rows(*cpu_->merger_fc2().w, 0);
    fc2_w_ = fc2.upload(total);
    fc2_b_ = upload_f32(to_f32(*cpu_->merger_fc2().b), total);
    inv_freq_ = upload_f32(cpu_->rope_inv_freq(), total);
    for (const int64_t l : c.fullatt_blocks) full_.push_back(l);
  }

  std::vector<std::vector<float>> run(const std::vector<EncoderImage>& images) {
    const vision::VisionConfig& c = cpu_->config();
    const vision::Qwen2VlBatchLayout L = vision::qwen2vl_batch_layout(images, pd_, c.merge, c.window_merged());
    const int R = int(L.rows()), tokens = R / unit_, merged = H_ * unit_, width = nh_ * hp_;
    const size_t r = size_t(R), e = 2;
    cudaStream_t s = stream_;

    // Inputs: the patch rows in window order, each row's (row, col), the segments.
    std::vector<float> px(r * size_t(pd_));
    for (size_t i = 0; i < r; i++) std::copy(L.src[i], L.src[i] + pd_, px.begin() + std::ptrdiff_t(i * size_t(pd_)));
    std::vector<int32_t> rc(2 * r);
    for (size_t i = 0; i < r; i++) rc[2 * i] = L.row[i], rc[2 * i + 1] = L.col[i];
    upload_async(px_f_, px, s);
    upload_async(rc_, rc, s);
    windows_.build(L.cu_window, s);
    frames_.build(L.cu_frames, s);

    ensure(px_e_, r * size_t(ld_pd_) * e, s);
    ensure(cos_sin_, r * size_t(hd_) * 4, s);
    ensure(x_, r * size_t(H_) * 4, s);
    ensure(xn_, r * size_t(H_) * e, s);
    ensure(qkv_, r * size_t(3 * H_) * 4, s);
    ensure(q_, r * size_t(width) * 4, s);
    ensure(k_, r * size_t(width) * e, s);
    ensure(v_, r * size_t(width) * e, s);
    ensure(attn_, r * size_t(width) * e, s);
    ensure(h_, r * size_t(I_pad_) * e, s);
    ensure(z_, size_t(tokens) * size_t(merged) * 4, s);
    ensure(ze_, size_t(tokens) * size_t(merged) * e, s);
    ensure(y_, size_t(tokens) * size_t(out_) * 4, s);

    rows_to_e(px_f_.get<float>(), R, pd_, pd_, px_e_.get(), ld_pd_, e_, s);
    vision_rope_table(rc_.get<int32_t>(), R, inv_freq_.get<float>(), hd_ / 4, cos_sin_.get<float>(), s);
    linear(px_e_.get(), ld_pd_, patch_w_, ld_pd_, DeviceBuffer(), R, H_, pd_, x_.get<float>(), H_, false);

    float* x = x_.get<float>();
    for (size_t l = 0; l < blocks_.size(); l++) {
      const Block& b = blocks_[l];
      const bool full = std::find(full_.begin(), full_.end(), int64_t(l)) != full_.end();
      rmsnorm(x, R, H_, nullptr, b.norm1.get<float>(), kQwenNormEps, xn_.get(), H_, e_, s);
      linear(xn_.get(), H_, b.qkv_w, H_, b.qkv_b, R, 3 * H_, H_, qkv_.get<float>(), 3 * H_, false);
      vision_qkv_split(qkv_.get<float>(), R, nh_, hd_, hp_, cos_sin_.get<float>(), q_.get<float>(), k_.get(), v_.get(), e_, s);
      attention(full ? frames_ : windows_, R, nh_, hd_, hp_, q_.get<float>(), k_.get(), v_.get(), attn_.get());
      linear(attn_.get(), width, b.proj_w, width, b.proj_b, R, H_, width, x, H_, true);

      rmsnorm(x, R, H_, nullptr, b.norm2.get<float>(), kQwenNormEps, xn_.get(), H_, e_, s);
      GemmArgs g;
      g.x = xn_.get();
      g.ld_x = H_;
      g.w = b.gate_up_w.get();
      g.ld_w = H_;
      g.bias = b.gate_up_b.get<float>();
      g.T = R;
      g.N = 2 * I_pad_;
      g.K = H_;
      g.epilogue = Epilogue::kGatedMul;
      g.act = GateAct::kSilu;
      g.h = h_.get();
      g.ld_h = I_pad_;
      gemm(g, e_, ws_, s);
      linear(h_.get(), I_pad_, b.down_w, I_pad_, b.down_b, R, H_, I_pad_, x, H_, true);
    }

    // Merger: RMSNorm; unit consecutive rows are one merged token's input (the same memory as
    // [tokens, H * unit]); Linear, exact GELU, Linear.
    rmsnorm(x, R, H_, nullptr, ln_q_.get<float>(), kQwenNormEps, xn_.get(), H_, e_, s);
    linear(xn_.get(), merged, fc1_w_, merged, fc1_b_, tokens, merged, merged, z_.get<float>(), merged, false);
    gelu_rows(z_.get<float>(), tokens, merged, merged, false, ze_.get(), merged, e_, s);
    linear(ze_.get(), merged, fc2_w_, merged, fc2_b_, tokens, out_, merged, y_.get<float>(), out_, false);
    const std::vector<float> y = download(y_.get<float>(), size_t(tokens) * size_t(out_));
    return vision::qwen2vl_unwindow(L, y.data(), unit_, out_);
  }

  std::shared_ptr<const vision::VisionEncoder> cpu_;
  int H_ = 0, nh_ = 0, hd_ = 0, hp_ = 0, I_pad_ = 0, pd_ = 0, ld_pd_ = 0, unit_ = 0, out_ = 0;
  DeviceBuffer patch_w_, ln_q_, fc1_w_, fc1_b_, fc2_w_, fc2_b_, inv_freq_;
  std::vector<Block> blocks_;
  std::vector<int64_t> full_;
  // Pass buffers (grown to the largest pass).
  Segments windows_, frames_;
  DeviceBuffer px_f_, px_e_, rc_, cos_sin_, x_, xn_, qkv_, q_, k_, v_, attn_, h_, z_, ze_, y_;
};

// ---- Gemma 3 SigLIP -------------------------------------------------------------------------

class SiglipTower final : public TowerBase {
 public:
  SiglipTower(std::shared_ptr<const vision::SiglipEncoder> cpu, int device, bool flash)
      : TowerBase(device, tower_dtype(cpu->patch_weight().dtype), flash), cpu_(std::move(cpu)) {
    const vision::SiglipConfig& c = cpu_->config();
    D_ = int(c.hidden);
    ld_D_ = int(round_up8(D_));
    I_ = int(c.intermediate);
    ld_I_ = int(round_up8(I_));
    nh_ = int(c.num_heads);
    hd_ = int(c.head_dim());
    hp_ = padded_head_dim(hd_);
    pd_ = int(c.patch_dim());
    ld_pd_ = int(round_up8(pd_));
    N_ = int(c.num_patches());
    text_ = int(c.text_hidden);
    if (hp_ == 0)
      throw Error(ErrorCode::kUnsupportedModel, "the CUDA vision tower takes heads of at most 256 dims (this one has " +
                                                    std::to_string(hd_) + ")");
    upload();
  }

  std::vector<std::vector<float>> encode_batch(const std::vector<EncoderImage>& images) override {
    cpu_->check_batch(images);
    std::lock_guard<std::mutex> lock(mu_);
    SLUICE_CUDA_CHECK(cudaSetDevice(device_));
    return in_passes(images, [&](const EncoderImage&) { return int64_t(N_); },
                     [&](const std::vector<EncoderImage>& pass) { return run(pass); });
  }

  size_t device_bytes() const override {
    return weight_bytes_ + base_bytes() + images_.bytes() + px_f_.bytes() + px_e_.bytes() + x_.bytes() + xn_.bytes() +
           qkv_.bytes() + q_.bytes() + k_.bytes() + v_.bytes() + attn_.bytes() + mid_.bytes() + mid_e_.bytes() +
           pooled_.bytes() + pooled_e_.bytes() + out_.bytes();
  }

 private:
  struct Norm {
    DeviceBuffer w, b;
  };
  struct Block {
    Norm norm1, norm2;
    DeviceBuffer qkv_w, qkv_b, out_w, out_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };

  Norm upload_norm(const vision::SiglipEncoder::Norm& n, size_t* total) {
    return Norm{upload_f32(n.w, total), upload_f32(n.b, total)};
  }

  void upload() {
    size_t* total = &weight_bytes_;
    {
      HostMatrix m(D_, ld_pd_, e_);
      m.rows(cpu_->patch_weight(), 0);
      patch_w_ = m.upload(total);
    }
    patch_b_ = upload_f32(to_f32(cpu_->patch_bias()), total);
    pos_ = upload_f32(cpu_->position_embedding(), total);
    const std::function<int64_t(int64_t)> pad_heads = [this](int64_t col) { return (col / hd_) * hp_ + col % hd_; };
    for (const vision::SiglipEncoder::Block& b : cpu_->blocks()) {
      Block d;
      d.norm1 = upload_norm(b.norm1, total);
      d.norm2 = upload_norm(b.norm2, total);
      HostMatrix qkv(3 * int64_t(D_), ld_D_, e_);  // q, k, v rows stacked, as the Qwen tower's
      qkv.rows(*b.q.w, 0);
      qkv.rows(*b.k.w, D_);
      qkv.rows(*b.v.w, 2 * int64_t(D_));
      d.qkv_w = qkv.upload(total);
      std::vector<float> qkv_b = to_f32(*b.q.b), kb = to_f32(*b.k.b), vb = to_f32(*b.v.b);
      qkv_b.insert(qkv_b.end(), kb.begin(), kb.end());
      qkv_b.insert(qkv_b.end(), vb.begin(), vb.end());
      d.qkv_b = upload_f32(qkv_b, total);
      HostMatrix out(D_, nh_ * hp_, e_);
      out.rows(*b.out.w, 0, pad_heads);
      d.out_w = out.upload(total);
      d.out_b = upload_f32(to_f32(*b.out.b), total);
      HostMatrix fc1(I_, ld_D_, e_);
      fc1.rows(*b.fc1.w, 0);
      d.fc1_w = fc1.upload(total);
      d.fc1_b = upload_f32(to_f32(*b.fc1.b), total);
      HostMatrix fc2(D_, ld_I_, e_);
      fc2.rows(*b.fc2.w, 0);
      d.fc2_w = fc2.upload(total);
      d.fc2_b = upload_f32(to_f32(*b.fc2.b), total);
      blocks_.push_back(std::move(d));
    }
    post_ = upload_norm(cpu_->post_norm(), total);
    soft_norm_ = upload_f32(cpu_->soft_norm(), total);
    HostMatrix proj(text_, ld_D_, e_);
    for (int64_t n = 0; n < text_; n++) proj.row(cpu_->projection_t(), D_, n, n);
    proj_w_ = proj.upload(total);
  }

  std::vector<std::vector<float>> run(const std::vector<EncoderImage>& images) {
    const vision::SiglipConfig& c = cpu_->config();
    const int B = int(images.size()), R = B * N_, width = nh_ * hp_, side = int(c.side()), kp = int(c.pool());
    const int T = int(c.mm_tokens), S = int(c.image_size), C = int(c.num_channels);
    const size_t r = size_t(R), e = 2, per_image = size_t(c.pixel_values());
    const float eps = c.eps;
    cudaStream_t s = stream_;

    std::vector<float> px(per_image * size_t(B));
    for (int i = 0; i < B; i++)
      std::copy(images[size_t(i)].pixel_values, images[size_t(i)].pixel_values + per_image, px.begin() + std::ptrdiff_t(i * per_image));
    upload_async(px_f_, px, s);
    std::vector<int64_t> cu(size_t(B) + 1);
    for (int i = 0; i <= B; i++) cu[size_t(i)] = int64_t(i) * N_;
    images_.build(cu, s);

    ensure(px_e_, r * size_t(ld_pd_) * e, s);
    ensure(x_, r * size_t(D_) * 4, s);
    ensure(xn_, r * size_t(ld_D_) * e, s);
    ensure(qkv_, r * size_t(3 * D_) * 4, s);
    ensure(q_, r * size_t(width) * 4, s);
    ensure(k_, r * size_t(width) * e, s);
    ensure(v_, r * size_t(width) * e, s);
    ensure(attn_, r * size_t(width) * e, s);
    ensure(mid_, r * size_t(I_) * 4, s);
    ensure(mid_e_, r * size_t(ld_I_) * e, s);
    ensure(pooled_, size_t(B) * T * size_t(D_) * 4, s);
    ensure(pooled_e_, size_t(B) * T * size_t(ld_D_) * e, s);
    ensure(out_, size_t(B) * T * size_t(text_) * 4, s);

    // Patch embedding (Conv2d as a GEMM) plus the position embeddings.
    siglip_patches(px_f_.get<float>(), B, C, S, int(c.patch), px_e_.get(), ld_pd_, e_, s);
    float* x = x_.get<float>();
    linear(px_e_.get(), ld_pd_, patch_w_, ld_pd_, patch_b_, R, D_, pd_, x, D_, false);
    add_repeated_rows(x, R, pos_.get<float>(), N_, D_, s);

    for (const Block& b : blocks_) {
      layer_norm(x, R, D_, b.norm1.w.get<float>(), b.norm1.b.get<float>(), eps, xn_.get(), ld_D_, false, e_, s);
      linear(xn_.get(), ld_D_, b.qkv_w, ld_D_, b.qkv_b, R, 3 * D_, D_, qkv_.get<float>(), 3 * D_, false);
      vision_qkv_split(qkv_.get<float>(), R, nh_, hd_, hp_, nullptr, q_.get<float>(), k_.get(), v_.get(), e_, s);
      attention(images_, R, nh_, hd_, hp_, q_.get<float>(), k_.get(), v_.get(), attn_.get());
      linear(attn_.get(), width, b.out_w, width, b.out_b, R, D_, width, x, D_, true);

      layer_norm(x, R, D_, b.norm2.w.get<float>(), b.norm2.b.get<float>(), eps, xn_.get(), ld_D_, false, e_, s);
      linear(xn_.get(), ld_D_, b.fc1_w, ld_D_, b.fc1_b, R, I_, D_, mid_.get<float>(), I_, false);
      gelu_rows(mid_.get<float>(), R, I_, I_, true, mid_e_.get(), ld_I_, e_, s);
      linear(mid_e_.get(), ld_I_, b.fc2_w, ld_I_, b.fc2_b, R, D_, I_, x, D_, true);
    }

    // Post LayerNorm (f32, into the q/k/v buffer), the projector's pooling, its (1 + w) RMSNorm and
    // the projection to the text model's width.
    float* xf = qkv_.get<float>();
    layer_norm(x, R, D_, post_.w.get<float>(), post_.b.get<float>(), eps, xf, D_, true, e_, s);
    avg_pool_patches(xf, B, side, kp, D_, pooled_.get<float>(), s);
    rmsnorm(pooled_.get<float>(), B * T, D_, nullptr, soft_norm_.get<float>(), eps, pooled_e_.get(), ld_D_, e_, s);
    linear(pooled_e_.get(), ld_D_, proj_w_, ld_D_, DeviceBuffer(), B * T, text_, D_, out_.get<float>(), text_, false);
    const std::vector<float> y = download(out_.get<float>(), size_t(B) * T * size_t(text_));
    std::vector<std::vector<float>> outs(static_cast<size_t>(B));
    const size_t each = size_t(T) * size_t(text_);
    for (int i = 0; i < B; i++) outs[size_t(i)].assign(y.begin() + std::ptrdiff_t(i * each), y.begin() + std::ptrdiff_t((i + 1) * each));
    return outs;
  }

  std::shared_ptr<const vision::SiglipEncoder> cpu_;
  int D_ = 0, ld_D_ = 0, I_ = 0, ld_I_ = 0, nh_ = 0, hd_ = 0, hp_ = 0, pd_ = 0, ld_pd_ = 0, N_ = 0, text_ = 0;
  DeviceBuffer patch_w_, patch_b_, pos_, soft_norm_, proj_w_;
  Norm post_;
  std::vector<Block> blocks_;
  Segments images_;
  DeviceBuffer px_f_, px_e_, x_, xn_, qkv_, q_, k_, v_, attn_, mid_, mid_e_, pooled_, pooled_e_, out_;
};

}  // namespace

std::unique_ptr<VisionTower> VisionTower::qwen2vl(std::shared_ptr<const vision::VisionEncoder> cpu, int device,
                                                  bool flash_attention) {
  return std::make_unique<QwenTower>(std::move(cpu), device, flash_attention);
}

std::unique_ptr<VisionTower> VisionTower::siglip(std::shared_ptr<const vision::SiglipEncoder> cpu, int device,
                                                 bool flash_attention) {
  return std::make_unique<SiglipTower>(std::move(cpu), device, flash_attention);
}

}  // namespace sluice::cuda
