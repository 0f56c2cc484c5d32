#include "util/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "sluice/error.h"

namespace sluice {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

HostBuffer::HostBuffer(size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  // Room to round the start up to a huge-page boundary; the slack is never touched (no RSS).
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw Error(ErrorCode::kOutOfMemory, "cannot map " + std::to_string(bytes) + " bytes of host memory (" + std::strerror(err) + ")");
  }
  base_ = static_cast<uint8_t*>(p);
  data_ = reinterpret_cast<uint8_t*>((uintptr_t(base_) + kHugePage - 1) / kHugePage * kHugePage);
#ifdef MADV_HUGEPAGE
  if (huge_pages) ::madvise(data_, (bytes + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint: failure is fine
#else
  (void)huge_pages;
#endif
}

HostBuffer::~HostBuffer() {
  if (base_) ::munmap(base_, mapped_);
}

void release_mapped_pages(const void* data, size_t bytes) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(data) + page - 1) / page * page, end = (uintptr_t(data) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace sluice
