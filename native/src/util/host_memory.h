// Host memory for the tensors the CPU streams every decode step (weights copied out of the
// checkpoint mapping, quantized weights) and for the bandwidth probe that stands for them.
// Anonymous, 2 MiB aligned and advised for transparent huge pages: a batch-1 GEMV reads the
// weights once per token, and on the 2-core Zen 5 a streaming read of page-cache pages of the
// checkpoint file ran at 26-28 GB/s against 30-31 GB/s for huge-page anonymous memory (4 KiB
// anonymous pages: 28-29), measured side by side with 2 threads.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice {

class HostBuffer {
 public:
  // Throws sluice::Error kOutOfMemory when the mapping cannot be made. Pages are committed on
  // first write. huge_pages: advise transparent huge pages (a hint the kernel may ignore).
  explicit HostBuffer(size_t bytes, bool huge_pages = true);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;  // the mapping (data_ rounded up to 2 MiB inside it)
  size_t mapped_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Gives back the resident pages of a read-only private file mapping that nothing reads any more
// (whole pages inside [data, data + bytes) only); a later read faults them in from the file.
void release_mapped_pages(const void* data, size_t bytes);

}  // namespace sluice
