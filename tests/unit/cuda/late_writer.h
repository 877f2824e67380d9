// A writer that ends long after the kernel queued behind it has started, for the tests of
// dependent launches (dependent_launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace hablar::test {

// Queues on `stream` a one-block kernel that lets the next kernel launch at once
// (griddepcontrol.launch_dependents), waits delay_us microseconds, and only then copies
// `bytes` bytes from `from` to `to`.
void launch_late_copy(void* to, const void* from, size_t bytes, unsigned delay_us,
                      cudaStream_t stream);

}  // namespace hablar::test
