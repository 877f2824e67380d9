#include "backend/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace hablar::cuda {
namespace {

// libcublas.so.<major> or libcublasLt.so.<major> (`stem`), through the loader's search path,
// then from the toolkit's directory.
void* open_library(const std::string& stem) {
  const std::string soname = stem + ".so." + std::to_string(CUBLAS_VER_MAJOR);
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = dlerror();
#ifdef HABLAR_CUDA_LIBRARY_DIR
  const std::string path = std::string(HABLAR_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  throw_error(ErrorKind::kUnsupported,
              "cannot load " + stem + " (" + first_error +
                  "); the CUDA prefill needs it: add the CUDA toolkit's lib64 to "
                  "LD_LIBRARY_PATH or serve with --device cpu");
}

template <typename Fn>
void resolve(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr) throw_error(ErrorKind::kUnsupported, std::string("cuBLAS lacks ") + name);
}

CublasLibrary load() {
  void* lib = open_library("libcublas");  // kept for the life of the process
  CublasLibrary l{};
  resolve(lib, "cublasCreate_v2", l.create);
  resolve(lib, "cublasDestroy_v2", l.destroy);
  resolve(lib, "cublasSetStream_v2", l.set_stream);
  resolve(lib, "cublasGemmEx", l.gemm_ex);
  resolve(lib, "cublasGemmStridedBatchedEx", l.gemm_strided_batched_ex);
  resolve(lib, "cublasGetStatusName", l.status_name);
  resolve(lib, "cublasGetStatusString", l.status_string);
  return l;
}

CublasLtLibrary load_lt() {
  void* lib = open_library("libcublasLt");  // kept for the life of the process
  CublasLtLibrary l{};
  resolve(lib, "cublasLtCreate", l.create);
  resolve(lib, "cublasLtDestroy", l.destroy);
  resolve(lib, "cublasLtMatmulDescCreate", l.desc_create);
  resolve(lib, "cublasLtMatmulDescDestroy", l.desc_destroy);
  resolve(lib, "cublasLtMatmulDescSetAttribute", l.desc_set);
  resolve(lib, "cublasLtMatrixLayoutCreate", l.layout_create);
  resolve(lib, "cublasLtMatrixLayoutDestroy", l.layout_destroy);
  resolve(lib, "cublasLtMatmulPreferenceCreate", l.pref_create);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", l.pref_destroy);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", l.pref_set);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", l.heuristic);
  resolve(lib, "cublasLtMatmul", l.matmul);
  return l;
}

}  // namespace

const CublasLtLibrary& cublas_lt() {
  static const CublasLtLibrary library = load_lt();
  return library;
}

const CublasLibrary& cublas() {
  static const CublasLibrary library = load();
  return library;
}

}  // namespace hablar::cuda
