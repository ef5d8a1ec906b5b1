#include "slide/memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace slide {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
// Below this size a hugepage would mostly be padding; use the heap instead.
constexpr size_t kMapThreshold = size_t(1) << 20;
constexpr size_t kAlign = 64;

bool detect_thp() noexcept {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return false;
  char buf[128] = {0};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The active mode is the bracketed one: "always [madvise] never".
  return std::strstr(buf, "[never]") == nullptr && n > 0;
}
}  // namespace

bool transparent_hugepages_available() noexcept {
  static const bool available = detect_thp();
  return available;
}

RawBuffer::RawBuffer(size_t bytes, bool want_hugepages) : bytes_(bytes) {
  if (bytes == 0) return;
  if (bytes >= kMapThreshold) {
    // Over-allocate by one hugepage so the start can be aligned to 2 MiB, then return
    // the unused head and tail to the kernel.
    size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    size_t len = rounded + kHugePage;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    uintptr_t base = reinterpret_cast<uintptr_t>(p);
    uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    size_t head = aligned - base;
    size_t tail = len - head - rounded;
    if (head) munmap(p, head);
    if (tail) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
    map_base_ = reinterpret_cast<void*>(aligned);
    map_bytes_ = rounded;
    data_ = map_base_;
#ifdef MADV_HUGEPAGE
    if (want_hugepages && transparent_hugepages_available()) {
      hugepages_ = madvise(map_base_, map_bytes_, MADV_HUGEPAGE) == 0;
    }
#endif
    return;
  }
  size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, padded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, padded);
  data_ = p;
}

RawBuffer::~RawBuffer() {
  if (map_base_) {
    munmap(map_base_, map_bytes_);
  } else if (data_) {
    std::free(data_);
  }
}

}  // namespace slide
