// The host side of the CUDA backend's LoRA (lora.h): adapters' device copies and the per-step
// slot tables.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "cuda/check.h"
#include "cuda/lora.h"
#include "engine/backend.h"

namespace sluice::cuda {

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Copies every matrix of `a` to the current device `device` (each 256-byte aligned, then the
// table) in one allocation, synchronously: once the call returns, any stream of the device may
// read it (engines on one device share the copy).
std::shared_ptr<void> upload_adapter(const LoraAdapter& a, int device, cudaStream_t stream) {
  const int64_t layers = a.num_layers();
  std::vector<size_t> off(size_t(layers * kNumLoraTargets) * 2, 0);  // [entry] a's then b's byte offset
  size_t bytes = 0;
  for (int64_t e = 0; e < layers * kNumLoraTargets; e++) {
    const LoraPair& p = a.pair(e / kNumLoraTargets, LoraTarget(e % kNumLoraTargets));
    if (!p.present()) continue;
    off[size_t(2 * e)] = bytes;
    bytes += aligned(p.a.size() * sizeof(float));
    off[size_t(2 * e + 1)] = bytes;
    bytes += aligned(p.b.size() * sizeof(float));
  }
  const size_t table_off = bytes;
  bytes += size_t(layers * kNumLoraTargets) * sizeof(LoraMats);
  auto copy = std::make_shared<LoraDeviceCopy>();
  copy->device = device;
  SLUICE_CUDA_CHECK(cudaMalloc(&copy->mem, bytes));
  copy->bytes = bytes;
  uint8_t* base = static_cast<uint8_t*>(copy->mem);
  std::vector<uint8_t> host(bytes, 0);
  auto* table = reinterpret_cast<LoraMats*>(host.data() + table_off);
  for (int64_t e = 0; e < layers * kNumLoraTargets; e++) {
    const LoraPair& p = a.pair(e / kNumLoraTargets, LoraTarget(e % kNumLoraTargets));
    table[e] = LoraMats{};
    if (!p.present()) continue;
    std::memcpy(host.data() + off[size_t(2 * e)], p.a.data(), p.a.size() * sizeof(float));
    std::memcpy(host.data() + off[size_t(2 * e + 1)], p.b.data(), p.b.size() * sizeof(float));
    table[e].a = reinterpret_cast<const float*>(base + off[size_t(2 * e)]);
    table[e].b = reinterpret_cast<const float*>(base + off[size_t(2 * e + 1)]);
    table[e].rank = int(a.rank());
  }
  copy->table = reinterpret_cast<const LoraMats*>(base + table_off);
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(copy->mem, host.data(), bytes, cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return copy;
}

}  // namespace

// NOTE: cudaFree waits for the device to finish its queued work first, so a step still in flight
// that reads the copy (pipelined steps: the engine may let go of a finished sequence's adapter
// while the next step runs) completes before the memory goes. Unchecked: runs in destructors,
// possibly at exit.
LoraDeviceCopy::~LoraDeviceCopy() {
  if (!mem) return;
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device && cudaSetDevice(device) == cudaSuccess;
  cudaFree(mem);
  if (switched) cudaSetDevice(current);
}

LoraSteps::~LoraSteps() {
  for (Pinned& h : host_) {
    if (h.copied) {
      cudaEventSynchronize(h.copied);
      cudaEventDestroy(h.copied);
    }
    if (h.ptr) cudaFreeHost(h.ptr);
  }
}

bool LoraSteps::prepare(const ForwardBatch& b, int device, cudaStream_t stream) {
  // Slots in order of first use; a sequence's tokens are contiguous, so one slot per sequence.
  const int64_t T = b.num_tokens, S = b.num_seqs;
  adapters_.clear();
  seq_slot_.assign(size_t(S), -1);
  for (int64_t s = 0; s < S; s++) {
    const LoraAdapter* a = b.seq_adapters[s];
    if (!a) continue;
    auto it = std::find(adapters_.begin(), adapters_.end(), a);
    seq_slot_[size_t(s)] = int32_t(it - adapters_.begin());
    if (it == adapters_.end()) adapters_.push_back(a);
  }
  bool any = false;
  for (int64_t t = 0; t < T && !any; t++) any = seq_slot_[size_t(b.token_seq[t])] >= 0;
  if (!any) return false;

  const size_t slots_bytes = aligned(size_t(T) * 4), bytes = slots_bytes + adapters_.size() * sizeof(void*);
  Pinned& h = host_[next_];
  next_ ^= 1;
  if (!h.copied) SLUICE_CUDA_CHECK(cudaEventCreateWithFlags(&h.copied, cudaEventDisableTiming));
  SLUICE_CUDA_CHECK(cudaEventSynchronize(h.copied));  // the upload of two steps ago has been read
  if (h.bytes < bytes) {
    if (h.ptr) cudaFreeHost(h.ptr);
    h.ptr = nullptr;
    h.bytes = 0;
    SLUICE_CUDA_CHECK(cudaMallocHost(&h.ptr, bytes));
    h.bytes = bytes;
  }
  // Device copies before anything is queued: a first upload synchronizes the stream.
  auto* tables = reinterpret_cast<const LoraMats**>(static_cast<uint8_t*>(h.ptr) + slots_bytes);
  for (size_t i = 0; i < adapters_.size(); i++) {
    const std::shared_ptr<void> copy =
        adapters_[i]->device_copy(device, [&] { return upload_adapter(*adapters_[i], device, stream); });
    tables[i] = static_cast<const LoraDeviceCopy*>(copy.get())->table;
  }
  auto* slots = static_cast<int32_t*>(h.ptr);
  for (int64_t t = 0; t < T; t++) slots[t] = seq_slot_[size_t(b.token_seq[t])];
  if (dev_.bytes() < bytes) {  // (the old buffer's cudaFree waits for the steps reading it)
    tables_ = nullptr;
    dev_.allocate(std::max(bytes, dev_.bytes() + dev_.bytes() / 2), stream);
  }
  tables_ = reinterpret_cast<const LoraMats* const*>(dev_.get<uint8_t>() + slots_bytes);
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dev_.get(), h.ptr, bytes, cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_CHECK(cudaEventRecord(h.copied, stream));
  return true;
}

}  // namespace sluice::cuda
