#include "backend/cuda/device_memory.h"
#include "backend/cuda/cublas_library.h"

namespace hablar::cuda {

int device_count(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason) *reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    cudaGetLastError();  // clear the error so later calls start clean
    return 0;
  }
  if (count == 0 && reason) *reason = "the driver reports no CUDA device";
  return count;
}

int device_multiprocessors() {
  static const int count = [] {
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess)
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
  }();
  return count;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  HABLAR_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void set_device_bytes(void* dst, int value, size_t bytes) {
  if (bytes == 0) return;
  HABLAR_CUDA_CHECK(cudaMemset(dst, value, bytes));
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

DeviceMemory::DeviceMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t status = cudaMalloc(&ptr_, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw_error(ErrorKind::kResource, "cudaMalloc of " + std::to_string(bytes) +
                                          " bytes failed: " + cudaGetErrorString(status));
  }
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (ptr_ && cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedMemory::PinnedMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t status = cudaMallocHost(&ptr_, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
    throw_error(ErrorKind::kResource, "cudaMallocHost of " + std::to_string(bytes) +
                                          " bytes failed: " + cudaGetErrorString(status));
  }
}

PinnedMemory::~PinnedMemory() {
  if (ptr_ && cudaFreeHost(ptr_) != cudaSuccess) cudaGetLastError();
}

PinnedMemory& PinnedMemory::operator=(PinnedMemory&& other) noexcept {
  if (this != &other) {
    if (ptr_ && cudaFreeHost(ptr_) != cudaSuccess) cudaGetLastError();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Stream::Stream() {
  HABLAR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}
Stream::~Stream() {
  if (stream_ && cudaStreamDestroy(stream_) != cudaSuccess) cudaGetLastError();
}

Event::Event() {
  HABLAR_CUDA_CHECK(cudaEventCreate(&event_));
}
Event::~Event() {
  if (event_ && cudaEventDestroy(event_) != cudaSuccess) cudaGetLastError();
}
float Event::elapsed_ms_since(const Event& start) const {
  HABLAR_CUDA_CHECK(cudaEventSynchronize(event_));
  float ms = 0;
  HABLAR_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

CublasHandle::CublasHandle() {
  HABLAR_CUBLAS_CHECK(cublas().create(&handle_));
}
CublasHandle::~CublasHandle() {
  if (handle_) cublas().destroy(handle_);  // nothing useful to do with a failure at release
}

}  // namespace hablar::cuda
