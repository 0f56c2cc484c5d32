// cuBLASLt through dlopen. The few types and enum values used are declared here from the
// library's documented C ABI (cublasLt.h is not in a cudart-only toolkit).
#include "cuda/cublaslt.h"

#include <dlfcn.h>
#include <library_types.h>

#include <algorithm>

#include "cuda/check.h"

namespace sluice::cuda {

namespace {

using Status = int;  // cublasStatus_t; 0 is success
constexpr int kComputeF32 = 68;  // CUBLAS_COMPUTE_32F
constexpr int32_t kOpN = 0, kOpT = 1;
// cublasLtMatmulDescAttributes_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescBiasDataType = 26;
constexpr uint32_t kEpilogueDefault = 1, kEpilogueBias = 4;
constexpr int kPrefMaxWorkspaceBytes = 1;  // cublasLtMatmulPreferenceAttributes_t

struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};

}  // namespace

struct CublasLt::Api {
  size_t (*GetVersion)();
  Status (*Create)(void**);
  Status (*Destroy)(void*);
  Status (*MatmulDescCreate)(void**, int, int);
  Status (*MatmulDescDestroy)(void*);
  Status (*MatmulDescSetAttribute)(void*, int, const void*, size_t);
  Status (*MatrixLayoutCreate)(void**, int, uint64_t, uint64_t, int64_t);
  Status (*MatrixLayoutDestroy)(void*);
  Status (*MatmulPreferenceCreate)(void**);
  Status (*MatmulPreferenceDestroy)(void*);
  Status (*MatmulPreferenceSetAttribute)(void*, int, const void*, size_t);
  Status (*MatmulAlgoGetHeuristic)(void*, void*, void*, void*, void*, void*, void*, int, HeuristicResult*, int*);
  Status (*Matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*, const void*, void*,
                   void*, void*, const Algo*, void*, size_t, cudaStream_t);
};

// One problem's descriptors and chosen algorithm; `ok` false when cuBLASLt had none.
struct CublasLt::Plan {
  const Api* api = nullptr;
  void *desc = nullptr, *a = nullptr, *b = nullptr, *d = nullptr;
  Algo algo{};
  size_t workspace = 0;
  bool bias_fused = false;
  bool ok = false;
  ~Plan() {
    if (desc) api->MatmulDescDestroy(desc);
    for (void* l : {a, b, d})
      if (l) api->MatrixLayoutDestroy(l);
  }
};

namespace {

template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

void check(Status s, const char* what) {
  if (s != 0) throw Error(ErrorCode::kInternal, std::string("cuBLASLt: ") + what + " failed with status " + std::to_string(s));
}

// cublasLtMatmul fails with EXECUTION_FAILED or INTERNAL_ERROR when an earlier kernel faulted;
// that is a sticky CUDA error, which must surface as kDeviceFault (breaking the engine) rather
// than as an ordinary failed step. Neither query clears the error or disturbs a capture
// (cudaStreamQuery would invalidate one, so it is skipped while capturing).
void check_matmul(Status s, cudaStream_t stream) {
  if (s == 0) return;
  cudaError_t err = cudaPeekAtLastError();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!is_sticky_cuda_error(err) && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture == cudaStreamCaptureStatusNone)
    err = cudaStreamQuery(stream);
  if (is_sticky_cuda_error(err))
    throw_cuda_error(err, ("cublasLtMatmul (status " + std::to_string(s) + ")").c_str(), __FILE__, __LINE__);
  check(s, "cublasLtMatmul");
}

}  // namespace

std::unique_ptr<CublasLt> CublasLt::open(std::string* why) {
  const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  void* lib = nullptr;
  const char* loaded = nullptr;
  for (const char* n : names) {
    lib = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      loaded = n;
      break;
    }
  }
  if (!lib) {
    if (why) *why = "libcublasLt.so (13 or 12) was not found on the library path";
    return nullptr;
  }
  std::unique_ptr<CublasLt> lt(new CublasLt());
  lt->lib_ = lib;
  lt->api_ = std::make_unique<Api>();
  Api& f = *lt->api_;
  const bool all = resolve(lib, "cublasLtGetVersion", &f.GetVersion) && resolve(lib, "cublasLtCreate", &f.Create) &&
                   resolve(lib, "cublasLtDestroy", &f.Destroy) &&
                   resolve(lib, "cublasLtMatmulDescCreate", &f.MatmulDescCreate) &&
                   resolve(lib, "cublasLtMatmulDescDestroy", &f.MatmulDescDestroy) &&
                   resolve(lib, "cublasLtMatmulDescSetAttribute", &f.MatmulDescSetAttribute) &&
                   resolve(lib, "cublasLtMatrixLayoutCreate", &f.MatrixLayoutCreate) &&
                   resolve(lib, "cublasLtMatrixLayoutDestroy", &f.MatrixLayoutDestroy) &&
                   resolve(lib, "cublasLtMatmulPreferenceCreate", &f.MatmulPreferenceCreate) &&
                   resolve(lib, "cublasLtMatmulPreferenceDestroy", &f.MatmulPreferenceDestroy) &&
                   resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &f.MatmulPreferenceSetAttribute) &&
                   resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &f.MatmulAlgoGetHeuristic) &&
                   resolve(lib, "cublasLtMatmul", &f.Matmul);
  if (!all) {
    if (why) *why = std::string(loaded) + " lacks a cuBLASLt entry point this backend uses";
    return nullptr;  // the destructor closes the library
  }
  if (f.Create(&lt->handle_) != 0) {
    if (why) *why = std::string(loaded) + ": cublasLtCreate failed";
    return nullptr;
  }
  lt->describe_ = "cuBLASLt " + std::to_string(f.GetVersion()) + " (" + loaded + ")";
  return lt;
}

CublasLt::~CublasLt() {
  plans_.clear();  // plans destroy their descriptors through the api
  if (handle_ && api_) api_->Destroy(handle_);
  if (lib_) dlclose(lib_);
}

// Column-major view of the row-major problem: D[N, T] (ld_d) = op(W)[N, K] · x[K, T], where W
// is stored as a K x N column-major matrix (ld_w) and transposed, x as K x T (ld_x).
const CublasLt::Plan* CublasLt::plan_for(DType e, int n, int t, int k, int ld_w, int ld_x, int ld_d, bool add, bool bias,
                                         size_t workspace_bytes) {
  const std::string key = std::to_string(int(e)) + ":" + std::to_string(n) + ":" + std::to_string(t) + ":" +
                          std::to_string(k) + ":" + std::to_string(ld_w) + ":" + std::to_string(ld_x) + ":" +
                          std::to_string(ld_d) + ":" + (add ? "a" : "s") + (bias ? "b" : "-") + ":" +
                          std::to_string(workspace_bytes);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.second);
    return it->second.first.get();
  }
  const Api& f = *api_;
  auto p = std::make_unique<Plan>();
  p->api = api_.get();
  const int et = e == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  check(f.MatmulDescCreate(&p->desc, kComputeF32, CUDA_R_32F), "cublasLtMatmulDescCreate");
  check(f.MatmulDescSetAttribute(p->desc, kDescTransA, &kOpT, sizeof(kOpT)), "set TRANSA");
  check(f.MatmulDescSetAttribute(p->desc, kDescTransB, &kOpN, sizeof(kOpN)), "set TRANSB");
  check(f.MatrixLayoutCreate(&p->a, et, uint64_t(k), uint64_t(n), ld_w), "layout of W");
  check(f.MatrixLayoutCreate(&p->b, et, uint64_t(k), uint64_t(t), ld_x), "layout of x");
  check(f.MatrixLayoutCreate(&p->d, CUDA_R_32F, uint64_t(n), uint64_t(t), ld_d), "layout of y");
  void* pref = nullptr;
  check(f.MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspace_bytes;
  f.MatmulPreferenceSetAttribute(pref, kPrefMaxWorkspaceBytes, &ws, sizeof(ws));
  auto choose = [&](uint32_t epilogue) {
    f.MatmulDescSetAttribute(p->desc, kDescEpilogue, &epilogue, sizeof(epilogue));
    if (epilogue == kEpilogueBias) {
      const int32_t bias_type = CUDA_R_32F;
      f.MatmulDescSetAttribute(p->desc, kDescBiasDataType, &bias_type, sizeof(bias_type));
    }
    HeuristicResult r{};
    int found = 0;
    const Status s = f.MatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &r, &found);
    if (s != 0 || found < 1 || r.state != 0) return false;
    p->algo = r.algo;
    p->workspace = r.workspace_size;
    return true;
  };
  // Bias fused into the epilogue when cuBLASLt has a kernel for it; else added by our kernel.
  if (bias && choose(kEpilogueBias)) {
    p->bias_fused = true;
    p->ok = true;
  } else {
    p->ok = choose(kEpilogueDefault);
  }
  f.MatmulPreferenceDestroy(pref);
  (void)add;  // beta selects the residual add at run time; the key keeps the two apart anyway
  if (plans_.size() >= kMaxPlans) {
    plans_.erase(lru_.front());
    lru_.pop_front();
  }
  lru_.push_back(key);
  auto* raw = p.get();
  plans_.emplace(key, std::make_pair(std::move(p), std::prev(lru_.end())));
  return raw;
}

bool CublasLt::gemm(const GemmArgs& a, DType e, void* workspace, size_t workspace_bytes, float* scratch,
                    size_t scratch_floats, cudaStream_t stream) {
  if (e != DType::BF16 && e != DType::F16) return false;
  const int k = (a.K + 7) / 8 * 8;  // both operands are zero past K up to their 8-aligned strides
  const float one = 1.f, zero = 0.f;
  auto run = [&](const Plan* p, const void* x, float* d, bool add, const float* bias) {
    if (p->bias_fused) check(api_->MatmulDescSetAttribute(p->desc, kDescBiasPointer, &bias, sizeof(bias)), "set BIAS_POINTER");
    check_matmul(api_->Matmul(handle_, p->desc, &one, a.w, p->a, x, p->b, add ? &one : &zero, d, p->d, d, p->d,
                              &p->algo, workspace, workspace_bytes, stream),
                 stream);
  };
  if (a.epilogue != Epilogue::kGatedMul) {
    const bool add = a.epilogue == Epilogue::kAddTo;
    const Plan* p = plan_for(e, a.N, a.T, k, a.ld_w, a.ld_x, a.ld_y, add, a.bias != nullptr, workspace_bytes);
    if (!p->ok) return false;
    run(p, a.x, a.y, add, a.bias);
    if (a.bias && !p->bias_fused) add_bias_rows(a.y, a.T, a.N, a.ld_y, a.bias, stream);
    return true;
  }
  // Gated activation: chunks of up to `rows` tokens through the scratch, multiples of 64 so that
  // every chunk but the last keeps full tiles.
  int rows = int(std::min<size_t>(size_t(a.T), scratch_floats / size_t(a.N)));
  if (rows < a.T) rows = rows / 64 * 64;
  if (rows <= 0) return false;
  for (int t0 = 0; t0 < a.T; t0 += rows) {
    const int tc = std::min(rows, a.T - t0);
    const Plan* p = plan_for(e, a.N, tc, k, a.ld_w, a.ld_x, a.N, false, a.bias != nullptr, workspace_bytes);
    if (!p->ok) {
      if (t0 == 0) return false;
      throw Error(ErrorCode::kInternal, "cuBLASLt: no algorithm for the last gated-activation chunk");
    }
    const void* x = static_cast<const uint16_t*>(a.x) + size_t(t0) * a.ld_x;
    run(p, x, scratch, false, a.bias);
    gated_mul_interleaved(scratch, tc, a.N, p->bias_fused ? nullptr : a.bias, a.act, a.act_limit,
                          static_cast<uint16_t*>(a.h) + size_t(t0) * a.ld_h, a.ld_h, e, stream);
  }
  return true;
}

}  // namespace sluice::cuda
