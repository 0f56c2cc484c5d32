// LoRA adapters on the CUDA backend (issue 36). Every adapter of a step in one pair of launches
// per projection, a segmented low-rank product over the rows (as the BGMV kernels of Punica and
// vLLM do): "shrink" tmp[t] = A_s x[t], then "expand" y[t] += B_s tmp[t], where s is row t's slot,
// the index of its sequence's adapter among the step's. Rows of base-model sequences (slot -1)
// are left alone, so the base projection's work is shared and each adapter costs its rank.
//
// Tables: each adapter's matrices go to the device on the first step that uses it, with a
// [layers * kNumLoraTargets] table of LoraMats (LoraAdapter::device_copy keeps them: freed with
// the adapter). Per step, LoraSteps uploads the row slots and one table pointer per slot.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/device_weights.h"
#include "lora/lora_adapter.h"
#include "sluice/dtype.h"

namespace sluice {
struct ForwardBatch;
}

namespace sluice::cuda {

// One projection of one adapter on the device: a [rank, in] and b [out, rank] f32 (scale folded
// into b), as LoraPair. rank 0: the adapter does not adapt this projection.
struct LoraMats {
  const float* a = nullptr;
  const float* b = nullptr;
  int rank = 0;
};

// y[t, col(o)] += (B_s (A_s x[t]))[o] for o < out and every row t < T whose slot s = slots[t] is
// >= 0, with (A_s, B_s) = tables[s][entry]. x: [T, in] E (ld_x; bf16 or f16). y: f32 (ld_y), as
// every projection output of the CUDA backend is (q/k/v, the residual stream, gate/up before the
// activation); each output is accumulated in f32 over the rank and added once. The shrink writes
// tmp[t, 0:rank] (f32 scratch, [T, kMaxLoraRank]) for the expand to read.
struct LoraArgs {
  const int32_t* slots = nullptr;           // [T] device, -1: the base model
  const LoraMats* const* tables = nullptr;  // [slots] device pointers, each to a device table
  int entry = 0;                            // layer * kNumLoraTargets + target
  int T = 0;
  const void* x = nullptr;
  int ld_x = 0, in = 0;
  float* tmp = nullptr;
  float* y = nullptr;
  int ld_y = 0, out = 0;
  // Output o's column: col0 + o, or with group > 0, col0 + (o / group) * group_stride + o % group
  // (gate/up rows interleaved in 16-row groups [gate 8 | up 8]: gate col0 0, up col0 8, group 8,
  // stride 16).
  int col0 = 0, group = 0, group_stride = 0;
};
void lora_add(const LoraArgs& a, DType e, cudaStream_t stream);

// An adapter's matrices and table on one device (lora_steps.cpp makes them): one allocation.
struct LoraDeviceCopy {
  int device = 0;
  void* mem = nullptr;
  const LoraMats* table = nullptr;  // [layers * kNumLoraTargets], inside mem
  size_t bytes = 0;
  LoraDeviceCopy() = default;
  LoraDeviceCopy(const LoraDeviceCopy&) = delete;
  LoraDeviceCopy& operator=(const LoraDeviceCopy&) = delete;
  ~LoraDeviceCopy();
};

// The per-step side of the CUDA backend's LoRA: row slots and slot tables, uploaded through two
// pinned buffers used in turn (so the host may prepare a step while the one before it is still
// queued, as pipelined steps do). The device copy is overwritten by each prepare(), in stream
// order, so it must not be read by a captured graph: steps with adapters run eagerly.
class LoraSteps {
 public:
  LoraSteps() = default;
  LoraSteps(const LoraSteps&) = delete;
  LoraSteps& operator=(const LoraSteps&) = delete;
  ~LoraSteps();
  // For b (b.seq_adapters set, b.num_tokens rows): makes the device copies of adapters used for
  // the first time on `device` (synchronously), then queues the upload of the slots and tables on
  // `stream`. False (and nothing queued) when no row has an adapter.
  bool prepare(const ForwardBatch& b, int device, cudaStream_t stream);
  const int32_t* slots() const { return dev_.get<int32_t>(); }             // [T]
  const LoraMats* const* tables() const { return tables_; }                // [slots]
  size_t device_bytes() const { return dev_.bytes(); }

 private:
  DeviceBuffer dev_;  // [T] int32 slots, then (256-byte aligned) [slots] table pointers
  const LoraMats* const* tables_ = nullptr;
  struct Pinned {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;  // the last upload from ptr has been read
  };
  Pinned host_[2];
  int next_ = 0;
  std::vector<int32_t> seq_slot_;             // [S] scratch
  std::vector<const LoraAdapter*> adapters_;  // [slots] scratch
};

}  // namespace sluice::cuda
