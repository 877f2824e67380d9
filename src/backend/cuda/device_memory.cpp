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

namespace {

void* allocate_or_throw(cudaError_t (*alloc)(void**, size_t), const char* what, size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = alloc(&ptr, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw_error(ErrorKind::kResource, std::string(what) + " of " + std::to_string(bytes) +
                                          " bytes failed: " + cudaGetErrorString(status));
  }
  return ptr;
}

cudaError_t device_malloc(void** ptr, size_t bytes) {
  return cudaMalloc(ptr, bytes);
}
cudaError_t host_malloc(void** ptr, size_t bytes) {
  return cudaMallocHost(ptr, bytes);
}

}  // namespace

void* DeviceAllocation::allocate(size_t bytes) {
  return allocate_or_throw(device_malloc, "cudaMalloc", bytes);
}
void DeviceAllocation::release(void* ptr) {
  if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
}
void* PinnedAllocation::allocate(size_t bytes) {
  return allocate_or_throw(host_malloc, "cudaMallocHost", bytes);
}
void PinnedAllocation::release(void* ptr) {
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
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
