// RAII owners of device resources: memory, streams, events and the cuBLAS handle. None of
// them throws from a destructor; release failures there are ignored (the context may
// already be gone at exit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"

struct cublasContext;

namespace hablar::cuda {

// Number of usable CUDA devices; 0 (never an error) when there is no driver or no device.
// *reason, when given, receives why there is none.
int device_count(std::string* reason = nullptr);

// Multiprocessors of the current device (read once; 132, an H200's, if it cannot be read),
// for sizing grids.
int device_multiprocessors();

// Copies `bytes` host bytes to device memory and returns once they are there. cudaMemcpy from
// pageable memory returns when the bytes are staged, before the DMA lands, and the copy is
// ordered on the legacy default stream only, so a kernel on a non-blocking stream (every stream
// of this backend) could still read the old bytes; this waits for the legacy stream too.
void copy_to_device(void* dst, const void* src, size_t bytes);
// cudaMemset of device memory, complete on return for every stream (cudaMemset alone is
// ordered on the legacy default stream only).
void set_device_bytes(void* dst, int value, size_t bytes);

// Untyped memory of `bytes` bytes that frees itself; `Kind` allocates and releases it (a
// failed allocation throws kResource, a failed release is ignored).
template <typename Kind>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  explicit OwnedMemory(size_t bytes)
      : ptr_(bytes ? Kind::allocate(bytes) : nullptr), bytes_(bytes) {}
  ~OwnedMemory() {
    if (ptr_) Kind::release(ptr_);
  }
  OwnedMemory(OwnedMemory&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  OwnedMemory& operator=(OwnedMemory&& other) noexcept {
    if (this != &other) {
      if (ptr_) Kind::release(ptr_);
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  OwnedMemory(const OwnedMemory&) = delete;
  OwnedMemory& operator=(const OwnedMemory&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device memory (cudaMalloc).
struct DeviceAllocation {
  static void* allocate(size_t bytes);
  static void release(void* ptr);
};
using DeviceMemory = OwnedMemory<DeviceAllocation>;

// Page-locked host memory (cudaMallocHost). Copies between it and the device are
// asynchronous; from pageable memory the driver may stage them synchronously.
struct PinnedAllocation {
  static void* allocate(size_t bytes);
  static void release(void* ptr);
};
using PinnedMemory = OwnedMemory<PinnedAllocation>;

// Typed device array of n elements.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : memory_(n * sizeof(T)), size_(n) {}
  // Allocates and copies host data (complete on return, for every stream).
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }

  T* get() const { return static_cast<T*>(memory_.get()); }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    HABLAR_CHECK(host.size() == size_, "DeviceBuffer::upload: size mismatch");
    copy_to_device(get(), host.data(), bytes());
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ != 0)
      HABLAR_CUDA_CHECK(cudaMemcpy(host.data(), get(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  DeviceMemory memory_;
  size_t size_ = 0;
};

// Typed pinned host array of n elements (uninitialized).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n) : memory_(n * sizeof(T)), size_(n) {}
  T* get() const { return static_cast<T*>(memory_.get()); }
  size_t size() const { return size_; }
  T& operator[](size_t i) const { return get()[i]; }

 private:
  PinnedMemory memory_;
  size_t size_ = 0;
};

class Stream {
 public:
  Stream();  // a non-blocking stream
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream& operator=(Stream&&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const { HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream) { HABLAR_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  // Milliseconds from `start` to this event (both recorded, this one completed).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasContext* get() const { return handle_; }

 private:
  cublasContext* handle_ = nullptr;
};

}  // namespace hablar::cuda
