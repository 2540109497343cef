// arena.h: one device allocation handed out by bump allocation (weights, caches, per-step activations).
//
//   DeviceArena a;
//   K3_RETURN_IF_ERROR(a.init(size_t(8) << 30));          // one cudaMalloc of 8 GiB
//   K3_ASSIGN_OR_RETURN(float* x, a.alloc<float>(n_tok * d_model));
//   ...
//   a.reset();                                            // everything handed out is free again
//
// Every block starts at a multiple of `align` (default 256 bytes: cuBLAS / vector loads want 16, a
// cache line and TMA are happier with 128-256). alloc never calls cudaMalloc: running out is a Status
// (Code::out_of_memory) that names the bytes asked, the bytes left and the capacity. mark()/release(m)
// free everything allocated after a mark (scratch of one step). Not thread-safe; one owner.
// adopt(base, capacity) manages memory owned by someone else (a slice of another arena; host memory in
// tests): destroy() then frees nothing. Built without CUDA, init() returns Code::unsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace k3::gpu {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() { destroy(); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& o) noexcept { *this = static_cast<DeviceArena&&>(o); }
  DeviceArena& operator=(DeviceArena&& o) noexcept {
    if (this != &o) {
      destroy();
      base_ = o.base_, capacity_ = o.capacity_, used_ = o.used_, high_water_ = o.high_water_;
      owned_ = o.owned_, name_ = o.name_;
      o.base_ = nullptr, o.capacity_ = o.used_ = o.high_water_ = 0, o.owned_ = false;
    }
    return *this;
  }

  // One cudaMalloc of `capacity` bytes on the current device (a second init frees the first).
  Status init(size_t capacity, const char* name = "device arena");
  // Bump-allocates inside [base, base + capacity) owned elsewhere.
  void adopt(void* base, size_t capacity, const char* name = "device arena") {
    destroy();
    base_ = static_cast<char*>(base), capacity_ = capacity, owned_ = false, name_ = name;
  }
  void destroy();  // frees the allocation if init() made it; the arena is empty afterwards

  // `bytes` bytes aligned to `align` (a power of two, alignment relative to address 0); 0 bytes gives
  // an aligned pointer (not necessarily unique).
  Result<void*> alloc_bytes(size_t bytes, size_t align = 256) {
    if (align == 0 || (align & (align - 1)) != 0)
      return Status(Code::invalid_argument,
                    std::string(name_) + ": alignment " + std::to_string(align) + " is not a power of two");
    const uintptr_t b = reinterpret_cast<uintptr_t>(base_);
    const size_t start = size_t(((b + used_ + align - 1) & ~uintptr_t(align - 1)) - b);
    if (base_ == nullptr || start > capacity_ || bytes > capacity_ - start)
      return Status(Code::out_of_memory,
                    std::string(name_) + ": out of memory: asked " + std::to_string(bytes) +
                        " bytes (align " + std::to_string(align) + "), " + std::to_string(capacity_ - used_) +
                        " of " + std::to_string(capacity_) + " bytes left");
    used_ = start + bytes;
    if (used_ > high_water_) high_water_ = used_;
    return static_cast<void*>(base_ + start);
  }
  template <class T>
  Result<T*> alloc(size_t count, size_t align = 256) {
    if (count > SIZE_MAX / sizeof(T))
      return Status(Code::out_of_memory, "device arena: element count overflows size_t");
    Result<void*> r = alloc_bytes(count * sizeof(T), align);
    if (!r.ok()) return r.status();
    return static_cast<T*>(r.value());
  }

  size_t mark() const { return used_; }
  // Frees everything allocated after `mark` (a mark() taken earlier, so mark <= used()).
  void release(size_t mark) { used_ = mark < used_ ? mark : used_; }
  void reset() { used_ = 0; }

  void* base() const { return base_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t left() const { return capacity_ - used_; }
  size_t high_water() const { return high_water_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
  bool owned_ = false;
  const char* name_ = "device arena";
};

}  // namespace k3::gpu
