// What the CUDA executor takes, checked before anything is allocated: the type a weight has
// on the device, the model's shapes, the KV cache's types. Used by the executor's constructor
// (cuda_executor.cpp) and, through cuda_can_run / cuda_takes_cache (cuda_executor.h), by the
// factory's choice of device.
#pragma once

#include "core/dtype.h"
#include "engine/cuda_executor.h"

namespace hablar::model {
class Model;
}

namespace hablar::engine {

// The type a matrix has on the device: its own, or one the load converts it to without loss.
DType cuda_device_type(DType t);
// Throws Error(kUnsupported) naming a weight type, head size or attention shape the CUDA
// kernels do not cover.
void check_cuda_shapes(const model::Model& m);
// Throws Error(kUnsupported) for KV cache types the CUDA attention does not take.
void check_cuda_cache_types(const CudaExecutorOptions& o);

}  // namespace hablar::engine
