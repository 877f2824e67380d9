#include "ggml_peer.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace hablar::bench {
namespace {

// The few ggml C API shapes used here (public API of ggml.h / ggml-cpu.h).
struct InitParams {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
struct ThreadpoolParams {
  bool cpumask[512];
  int n_threads;
  int prio;
  uint32_t poll;
  bool strict_cpu;
  bool paused;
};
struct Cplan {
  size_t work_size;
  uint8_t* work_data;
  int n_threads;
  void* threadpool;
  void* abort_callback;
  void* abort_callback_data;
  bool use_ref;
  char reserve[64];  // room should a newer ggml grow the struct
};

struct Api {
  void* (*init)(InitParams);
  void (*free)(void*);
  void* (*new_tensor_2d)(void*, int, int64_t, int64_t);
  void* (*mul_mat)(void*, void*, void*);
  void* (*new_graph)(void*);
  void (*build_forward_expand)(void*, void*);
  void* (*get_data)(const void*);
  void (*threadpool_params_init)(ThreadpoolParams*, int);
  void* (*threadpool_new)(ThreadpoolParams*);
  void (*threadpool_free)(void*);
  Cplan (*graph_plan)(const void*, int, void*);
  int (*graph_compute)(void*, Cplan*);
  void (*cpu_init)();
};

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

const Api* load_api(std::string* why) {
  static Api api;
  static int state = 0;  // 0 untried, 1 ok, -1 failed
  static std::string error;
  if (state == 0) {
    std::string dir;
    if (const char* env = std::getenv("HABLAR_GGML_LIB_DIR")) {
      dir = env;
    } else {
      dir = "/root/.cache/hablar/oracle-venv/lib/python3.11/site-packages/llama_cpp/lib";
    }
    void* base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
    void* cpu = base ? dlopen((dir + "/libggml-cpu.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
    bool ok = base && cpu;
    ok = ok && bind(base, "ggml_init", &api.init) && bind(base, "ggml_free", &api.free) &&
         bind(base, "ggml_new_tensor_2d", &api.new_tensor_2d) &&
         bind(base, "ggml_mul_mat", &api.mul_mat) && bind(base, "ggml_new_graph", &api.new_graph) &&
         bind(base, "ggml_build_forward_expand", &api.build_forward_expand) &&
         bind(base, "ggml_get_data", &api.get_data) &&
         bind(base, "ggml_threadpool_params_init", &api.threadpool_params_init) &&
         bind(cpu, "ggml_threadpool_new", &api.threadpool_new) &&
         bind(cpu, "ggml_threadpool_free", &api.threadpool_free) &&
         bind(cpu, "ggml_graph_plan", &api.graph_plan) &&
         bind(cpu, "ggml_graph_compute", &api.graph_compute);
    if (ok && bind(cpu, "ggml_cpu_init", &api.cpu_init)) api.cpu_init();
    state = ok ? 1 : -1;
    if (!ok)
      error = "libggml not loadable from " + dir + (dlerror() ? std::string(": ") + dlerror() : "");
  }
  if (state < 0) {
    *why = error;
    return nullptr;
  }
  return &api;
}

}  // namespace

struct GgmlMatmul::Impl {
  const Api* api;
  void* ctx = nullptr;
  void* x = nullptr;
  void* out = nullptr;
  void* graph = nullptr;
  void* pool = nullptr;
  Cplan plan{};
  std::vector<uint8_t> work;
  int64_t rows = 0, cols = 0, n_tokens = 0;
};

std::unique_ptr<GgmlMatmul> GgmlMatmul::create(const WeightView& w, int64_t n_tokens, int n_threads,
                                               std::string* why) {
  const Api* api = load_api(why);
  if (!api) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->api = api;
  impl->rows = w.rows;
  impl->cols = w.cols;
  impl->n_tokens = n_tokens;
  const size_t bytes =
      w.row_bytes * (size_t)w.rows + (size_t)(w.cols + w.rows) * n_tokens * 4 + (64 << 20);
  impl->ctx = api->init(InitParams{bytes, nullptr, false});
  void* weights = api->new_tensor_2d(impl->ctx, (int)w.type, w.cols, w.rows);
  std::memcpy(api->get_data(weights), w.data, w.row_bytes * (size_t)w.rows);
  impl->x = api->new_tensor_2d(impl->ctx, 0 /*F32*/, w.cols, n_tokens);
  impl->out = api->mul_mat(impl->ctx, weights, impl->x);
  impl->graph = api->new_graph(impl->ctx);
  api->build_forward_expand(impl->graph, impl->out);
  ThreadpoolParams params;
  api->threadpool_params_init(&params, n_threads);
  impl->pool = api->threadpool_new(&params);
  impl->plan = api->graph_plan(impl->graph, n_threads, impl->pool);
  impl->work.resize(impl->plan.work_size + 64);
  impl->plan.work_data = impl->work.data();
  return std::unique_ptr<GgmlMatmul>(new GgmlMatmul(std::move(impl)));
}

GgmlMatmul::GgmlMatmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GgmlMatmul::~GgmlMatmul() {
  impl_->api->threadpool_free(impl_->pool);
  impl_->api->free(impl_->ctx);
}

void GgmlMatmul::set_input(const float* x) {
  std::memcpy(impl_->api->get_data(impl_->x), x, (size_t)(impl_->cols * impl_->n_tokens) * 4);
}

void GgmlMatmul::run() {
  impl_->api->graph_compute(impl_->graph, &impl_->plan);
}

const float* GgmlMatmul::output() const {
  return static_cast<const float*>(impl_->api->get_data(impl_->out));
}

}  // namespace hablar::bench
