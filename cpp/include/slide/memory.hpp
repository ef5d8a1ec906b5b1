// Large, aligned, zero-initialised arrays for weights and optimizer state.
//
// Big arrays are mapped with mmap (pages are committed lazily, so optimizer state of
// rows that are never touched costs no resident memory) and advised with
// madvise(MADV_HUGEPAGE): with transparent hugepages the TLB covers 2 MiB per entry,
// which matters for the random row accesses of a wide output layer. When the kernel
// refuses (THP disabled or unsupported) the array silently uses normal pages; the
// buffer records which happened so memory reports can say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace slide {

// Raw aligned, zeroed memory block (untyped). Move-only RAII owner.
class RawBuffer {
 public:
  RawBuffer() = default;
  // Allocates `bytes` zero bytes aligned to at least 64 bytes. With `want_hugepages`
  // and a large enough size, asks for transparent hugepages (quiet fallback).
  // Throws std::bad_alloc when memory is exhausted.
  RawBuffer(size_t bytes, bool want_hugepages);
  ~RawBuffer();
  RawBuffer(RawBuffer&& o) noexcept { swap(o); }
  RawBuffer& operator=(RawBuffer&& o) noexcept {
    RawBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  RawBuffer(const RawBuffer&) = delete;
  RawBuffer& operator=(const RawBuffer&) = delete;

  void* data() const noexcept { return data_; }
  size_t bytes() const noexcept { return bytes_; }
  // True when madvise(MADV_HUGEPAGE) was accepted and THP is not disabled system-wide.
  bool hugepages() const noexcept { return hugepages_; }

 private:
  void swap(RawBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(map_base_, o.map_base_);
    std::swap(map_bytes_, o.map_bytes_);
    std::swap(hugepages_, o.hugepages_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void* map_base_ = nullptr;  // mmap'ed region (null when allocated from the heap)
  size_t map_bytes_ = 0;
  bool hugepages_ = false;
};

// Typed view over a RawBuffer: `n` zero-initialised elements of a trivial type T.
template <class T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable<T>::value, "AlignedBuffer holds trivial types only");

 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n, bool want_hugepages = false)
      : raw_(n * sizeof(T), want_hugepages), n_(n) {}
  T* data() noexcept { return static_cast<T*>(raw_.data()); }
  const T* data() const noexcept { return static_cast<const T*>(raw_.data()); }
  T& operator[](size_t i) noexcept { return data()[i]; }
  const T& operator[](size_t i) const noexcept { return data()[i]; }
  size_t size() const noexcept { return n_; }
  size_t bytes() const noexcept { return n_ * sizeof(T); }
  bool hugepages() const noexcept { return raw_.hugepages(); }

 private:
  RawBuffer raw_;
  size_t n_ = 0;
};

// True when the kernel exposes transparent hugepages and they are not set to "never".
bool transparent_hugepages_available() noexcept;

}  // namespace slide
