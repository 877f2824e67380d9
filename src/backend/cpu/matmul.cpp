// matmul: activation quantization, instruction-set dispatch and the split of the work over
// the thread pool. The kernels themselves live in kernels_*.cpp.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "backend/cpu/matmul_fused.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/cpu_features.h"
#include "core/error.h"

namespace hablar::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

const IsaKernels* isa_kernels(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kScalar:
      return &scalar_kernels();
    case Isa::kAvx2:
      return f.has_avx2_kernels() ? &avx2_kernels() : nullptr;
    case Isa::kAvx512:
      return f.has_avx512_kernels() ? &avx512_kernels() : nullptr;
  }
  return nullptr;
}

Isa best_isa() {
  static const Isa best = [] {
    if (isa_kernels(Isa::kAvx512)) return Isa::kAvx512;
    if (isa_kernels(Isa::kAvx2)) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return best;
}

KOrder k_order_for(DType type, uint8_t role) {
  switch (type) {
    case DType::Q4_K:
      return (role & kRoleGroupOf4) ? KOrder::kGroupOf4 : KOrder::kOneToken;
    case DType::Q5_K:
    case DType::Q6_K:
      return (role & kRoleBatchOf8) ? KOrder::kTiled : KOrder::kOneToken;
    default:
      return KOrder::kOneToken;
  }
}

bool matmul_supports(DType type) {
  return scalar_kernels().gemm_for(type) != nullptr;
}

void check_matmul_args(const WeightView& w, const float* x, int64_t n_tokens, const float* y) {
  const std::string type_name(dtype_name(w.type));
  if (!matmul_supports(w.type))
    throw_error(ErrorKind::kUnsupported, "matmul: no CPU kernel for weight type " + type_name);
  if (w.data == nullptr || x == nullptr || y == nullptr)
    throw_error(ErrorKind::kInvalidArgument, "matmul: null weight, input or output pointer");
  if (w.rows <= 0 || w.cols <= 0 || n_tokens < 0)
    throw_error(ErrorKind::kInvalidArgument, "matmul: bad shape rows=" + std::to_string(w.rows) +
                                                 " cols=" + std::to_string(w.cols) +
                                                 " n_tokens=" + std::to_string(n_tokens));
  const int64_t block = dtype_traits(w.type).block_elems;
  const int64_t act_block = act_kind_for(w.type) == ActKind::kQ8K     ? kQK_K
                            : act_kind_for(w.type) == ActKind::kAct32 ? kQK
                                                                      : 1;
  if (w.cols % std::max(block, act_block) != 0)
    throw_error(ErrorKind::kInvalidArgument, "matmul: " + std::to_string(w.cols) +
                                                 " columns is not a multiple of the " + type_name +
                                                 " block");
  if (w.row_bytes < dtype_row_bytes(w.type, w.cols))
    throw_error(ErrorKind::kInvalidArgument, "matmul: row_bytes too small for " + type_name);
}

namespace {

// Scratch for the quantized activations, owned by the calling thread (matmul may be called
// from several threads with different pools); one buffer per distinct activation kind of a
// matmul_many call.
std::vector<uint8_t>& act_scratch(size_t slot) {
  thread_local std::vector<std::vector<uint8_t>> buffers;
  if (buffers.size() <= slot) buffers.resize(slot + 1);
  return buffers[slot];
}

void quantize_rows(const IsaKernels& k, ActKind kind, const float* x, int64_t cols, int64_t t0,
                   int64_t t1, uint8_t* act, size_t stride) {
  for (int64_t t = t0; t < t1; ++t) {
    if (kind == ActKind::kAct32) {
      k.quantize_act32(x + t * cols, cols, act + t * stride);
    } else {
      k.quantize_q8k(x + t * cols, cols, reinterpret_cast<BlockQ8_K*>(act + t * stride));
    }
  }
}

// The kernel a weight type runs on an instruction set (the scalar one where that set has
// none), with the activation rows it reads.
struct Plan {
  const IsaKernels* kernels;
  GemmFn gemm;
  ActKind kind;
};
Plan plan_for(Isa isa, DType type) {
  const IsaKernels* kernels = isa_kernels(isa);
  if (kernels == nullptr)
    throw_error(ErrorKind::kUnsupported,
                std::string("matmul: this CPU has no ") + isa_name(isa) + " support");
  GemmFn gemm = kernels->gemm_for(type);
  if (gemm == nullptr) {
    kernels = &scalar_kernels();
    gemm = kernels->gemm_for(type);
  }
  return {kernels, gemm, act_kind_for(type)};
}

// Consecutive tokens [begin, end) whose dot products take one kernel (one summation order).
struct TokenRun {
  int64_t begin;
  int64_t end;
  GemmFn gemm;
};
void check_roles(TokenRoles roles, int64_t n_tokens) {
  if (!roles.empty() && (int64_t)roles.size() != n_tokens)
    throw_error(ErrorKind::kInvalidArgument, "matmul: " + std::to_string(roles.size()) +
                                                 " token roles for " + std::to_string(n_tokens) +
                                                 " tokens");
}
// The runs of a call: one run of every token for the types with a single order.
std::vector<TokenRun> token_runs(const Plan& plan, DType type, int64_t n_tokens, TokenRoles roles) {
  std::vector<TokenRun> runs;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const KOrder order = k_order_for(type, roles.empty() ? 0 : roles[(size_t)t]);
    GemmFn gemm = plan.gemm;
    if (order != KOrder::kOneToken) {
      gemm = plan.kernels->gemm_ordered_for(type, order);
      HABLAR_CHECK(gemm != nullptr, "matmul: no kernel for a K-format order");
    }
    if (!runs.empty() && runs.back().gemm == gemm && runs.back().end == t) {
      runs.back().end = t + 1;
    } else {
      runs.push_back({t, t + 1, gemm});
    }
  }
  return runs;
}
// Rows [begin, end) of every run.
void run_gemm(std::span<const TokenRun> runs, const WeightView& w, int64_t begin, int64_t end,
              const uint8_t* act, size_t stride, float* y) {
  for (const TokenRun& r : runs)
    r.gemm(w, begin, end, act + r.begin * stride, stride, r.end - r.begin, y + r.begin * w.rows);
}

// The activation rows a plan reads: x itself for the float formats, else x quantized into
// scratch slot `slot`. *stride: bytes from one token's row to the next.
const uint8_t* activations(const Plan& plan, const float* x, int64_t cols, int64_t n_tokens,
                           ThreadPool& pool, size_t slot, size_t* stride) {
  if (plan.kind == ActKind::kF32) {
    *stride = (size_t)cols * sizeof(float);
    return reinterpret_cast<const uint8_t*>(x);
  }
  const size_t row = act_row_bytes(plan.kind, cols);
  *stride = row;
  std::vector<uint8_t>& scratch = act_scratch(slot);
  const size_t need = row * (size_t)n_tokens + kActReadPastEnd;
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* buf = scratch.data();
  // Quantizing is cheap next to the matmul; below ~1M values one thread does it, which saves
  // a synchronization of the pool (costly when the OS is slow to schedule the workers).
  if (n_tokens * cols < (int64_t)1 << 20 || pool.size() == 1) {
    quantize_rows(*plan.kernels, plan.kind, x, cols, 0, n_tokens, buf, row);
  } else {
    pool.run([&](int i, int n) {
      const IndexRange r = split_range(n_tokens, i, n);
      quantize_rows(*plan.kernels, plan.kind, x, cols, r.begin, r.end, buf, row);
    });
  }
  return buf;
}

// The rows of one or more weights in chunks that the pool's threads claim one at a time, about
// kChunksPerThread per thread: a thread that the OS holds up (other processes on the cores)
// delays the step by one chunk, not by its whole share. Chunks are whole 16-row groups, so no
// two threads write one cache line of y.
constexpr int kChunksPerThread = 4;
constexpr size_t kMaxJobs = 4;

struct ChunkedRows {
  int64_t rows;
  int64_t chunk;
  int64_t n_chunks;
};
ChunkedRows chunk_rows(int64_t rows, int n_threads) {
  const int64_t parts = (int64_t)kChunksPerThread * n_threads;
  const int64_t chunk = std::max<int64_t>(16, ((rows + parts - 1) / parts + 15) / 16 * 16);
  return {rows, chunk, (rows + chunk - 1) / chunk};
}

// At decode (a token or two) the rows stream from memory and the step waits at every matmul
// for the thread that finishes last: there the chunks shrink instead, each a share of the rows
// still unclaimed (1 / (kShareDivisor * threads) of them, whole 16-row groups, at least one),
// so the first are large and the last small and the threads finish close together. (Prefill
// keeps the fixed chunks: each chunk call there has a per-call cost, the activations' start
// values for every token.)
constexpr int64_t kShrinkingMaxTokens = 2;
constexpr int64_t kShareDivisor = 2;

// Rows [*begin, *end) of job *job to run next (false when none are left); `next` counts rows
// over all jobs, one after the other.
bool claim_shrinking(std::atomic<int64_t>& next, std::span<const int64_t> job_rows, int64_t total,
                     int n_threads, size_t* job, int64_t* begin, int64_t* end) {
  int64_t at = next.load(std::memory_order_relaxed);
  for (;;) {
    if (at >= total) return false;
    size_t j = 0;
    int64_t job_start = 0;
    while (at >= job_start + job_rows[j]) job_start += job_rows[j++];
    const int64_t share = (total - at) / (kShareDivisor * n_threads);
    const int64_t size = std::max<int64_t>(16, (share + 15) / 16 * 16);
    const int64_t stop = std::min(at + size, job_start + job_rows[j]);
    if (next.compare_exchange_weak(at, stop, std::memory_order_relaxed)) {
      *job = j;
      *begin = at - job_start;
      *end = stop - job_start;
      return true;
    }
  }
}

// body(job, row_begin, row_end) for every chunk of every job's rows, over the pool.
template <typename Body>
void run_chunked(ThreadPool& pool, std::span<const int64_t> job_rows, int64_t n_tokens,
                 const Body& body) {
  HABLAR_CHECK(job_rows.size() <= kMaxJobs, "run_chunked: too many jobs");
  std::atomic<int64_t> next{0};
  if (n_tokens <= kShrinkingMaxTokens) {
    int64_t total = 0;
    for (int64_t rows : job_rows) total += rows;
    pool.run([&](int, int n_threads) {
      size_t job = 0;
      int64_t begin = 0, end = 0;
      while (claim_shrinking(next, job_rows, total, n_threads, &job, &begin, &end))
        body(job, begin, end);
    });
    return;
  }
  ChunkedRows jobs[kMaxJobs];
  int64_t total = 0;
  for (size_t j = 0; j < job_rows.size(); ++j) {
    jobs[j] = chunk_rows(job_rows[j], pool.size());
    total += jobs[j].n_chunks;
  }
  pool.run([&](int, int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < total;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      size_t j = 0;
      while (c >= jobs[j].n_chunks) c -= jobs[j++].n_chunks;
      const int64_t begin = c * jobs[j].chunk;
      body(j, begin, std::min(jobs[j].rows, begin + jobs[j].chunk));
    }
  });
}

// One weight of a matmul_many call, ready to run.
struct Prepared {
  const WeightView* w;
  float* y;
  std::vector<TokenRun> runs;
  const uint8_t* act;
  size_t stride;
};

// Checks the targets and quantizes x once per distinct (kernels, activation kind).
std::vector<Prepared> prepare_many(std::span<const MatmulTarget> targets, const float* x,
                                   int64_t n_tokens, ThreadPool& pool, TokenRoles roles) {
  check_roles(roles, n_tokens);
  if (targets.empty()) return {};
  std::vector<Prepared> out;
  struct Quantized {
    const IsaKernels* kernels;
    ActKind kind;
    const uint8_t* act;
    size_t stride;
  };
  std::vector<Quantized> done;
  const int64_t cols = targets[0].w->cols;
  for (const MatmulTarget& t : targets) {
    check_matmul_args(*t.w, x, n_tokens, t.y);
    if (t.w->cols != cols)
      throw_error(ErrorKind::kInvalidArgument, "matmul_many: weights with " + std::to_string(cols) +
                                                   " and " + std::to_string(t.w->cols) +
                                                   " columns share one input");
    const Plan plan = plan_for(best_isa(), t.w->type);
    auto it = std::find_if(done.begin(), done.end(), [&](const Quantized& q) {
      return q.kernels == plan.kernels && q.kind == plan.kind;
    });
    if (it == done.end()) {
      size_t stride = 0;
      const uint8_t* act = activations(plan, x, cols, n_tokens, pool, done.size(), &stride);
      done.push_back({plan.kernels, plan.kind, act, stride});
      it = done.end() - 1;
    }
    out.push_back({t.w, t.y, token_runs(plan, t.w->type, n_tokens, roles), it->act, it->stride});
  }
  return out;
}

}  // namespace

void matmul_with_isa(Isa isa, const WeightView& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool& pool, TokenRoles roles) {
  check_matmul_args(w, x, n_tokens, y);
  check_roles(roles, n_tokens);
  if (n_tokens == 0) return;
  const Plan plan = plan_for(isa, w.type);
  const std::vector<TokenRun> runs = token_runs(plan, w.type, n_tokens, roles);
  size_t stride = 0;
  const uint8_t* act = activations(plan, x, w.cols, n_tokens, pool, 0, &stride);
  const int64_t rows[] = {w.rows};
  run_chunked(pool, rows, n_tokens, [&](size_t, int64_t begin, int64_t end) {
    run_gemm(runs, w, begin, end, act, stride, y);
  });
}

void matmul_many(std::span<const MatmulTarget> targets, const float* x, int64_t n_tokens,
                 ThreadPool& pool, TokenRoles roles) {
  if (targets.size() > kMaxJobs)
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_many: at most " + std::to_string(kMaxJobs) + " weights at once");
  const std::vector<Prepared> jobs = prepare_many(targets, x, n_tokens, pool, roles);
  if (n_tokens == 0 || jobs.empty()) return;
  int64_t rows[kMaxJobs];
  for (size_t j = 0; j < jobs.size(); ++j) rows[j] = jobs[j].w->rows;
  run_chunked(pool, std::span<const int64_t>(rows, jobs.size()), n_tokens,
              [&](size_t j, int64_t begin, int64_t end) {
                const Prepared& p = jobs[j];
                run_gemm(p.runs, *p.w, begin, end, p.act, p.stride, p.y);
              });
}

void matmul_glu(const WeightView& gate, const WeightView& up, const float* x, int64_t n_tokens,
                float* out, float* up_scratch, ThreadPool& pool, TokenRoles roles,
                GluActivation act) {
  if (gate.rows != up.rows)
    throw_error(ErrorKind::kInvalidArgument, "matmul_glu: gate has " + std::to_string(gate.rows) +
                                                 " rows, up " + std::to_string(up.rows));
  const MatmulTarget targets[2] = {{&gate, out}, {&up, up_scratch}};
  const std::vector<Prepared> jobs = prepare_many(targets, x, n_tokens, pool, roles);
  if (n_tokens == 0) return;
  const int64_t rows[] = {gate.rows};
  run_chunked(pool, rows, n_tokens, [&](size_t, int64_t begin, int64_t end) {
    // The same rows of both, then their gated activation.
    for (const Prepared& p : jobs) run_gemm(p.runs, *p.w, begin, end, p.act, p.stride, p.y);
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* g = out + t * gate.rows + begin;
      glu(act, g, up_scratch + t * gate.rows + begin, g, end - begin);
    }
  });
}

namespace {

// A grouped product ready to run: its weights' plans, runs and quantized input.
struct PreparedGroup {
  const GroupedProduct* p;
  std::vector<TokenRun> runs, up_runs;
  const uint8_t* act;
  size_t stride;
};

PreparedGroup prepare_group(const GroupedProduct& p, size_t slot, ThreadPool& pool) {
  check_matmul_args(*p.w, p.x, p.n_tokens, p.y);
  check_roles(p.roles, p.n_tokens);
  const Plan plan = plan_for(best_isa(), p.w->type);
  PreparedGroup g{&p, token_runs(plan, p.w->type, p.n_tokens, p.roles), {}, nullptr, 0};
  if (p.up != nullptr) {
    check_matmul_args(*p.up, p.x, p.n_tokens, p.up_scratch);
    const Plan up_plan = plan_for(best_isa(), p.up->type);
    if (p.up->rows != p.w->rows || up_plan.kernels != plan.kernels || up_plan.kind != plan.kind)
      throw_error(ErrorKind::kInvalidArgument,
                  "matmul_grouped: a gated pair needs equal rows and one activation kind");
    g.up_runs = token_runs(up_plan, p.up->type, p.n_tokens, p.roles);
  }
  g.act = activations(plan, p.x, p.w->cols, p.n_tokens, pool, slot, &g.stride);
  return g;
}

// Rows [begin, end) of one grouped product (with its gated activation).
void run_group_rows(const PreparedGroup& g, GluActivation act, int64_t begin, int64_t end) {
  const GroupedProduct& p = *g.p;
  run_gemm(g.runs, *p.w, begin, end, g.act, g.stride, p.y);
  if (p.up == nullptr) return;
  run_gemm(g.up_runs, *p.up, begin, end, g.act, g.stride, p.up_scratch);
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    float* y = p.y + t * p.w->rows + begin;
    glu(act, y, p.up_scratch + t * p.w->rows + begin, y, end - begin);
  }
}

}  // namespace

void matmul_grouped(std::span<const GroupedProduct> products, ThreadPool& pool, GluActivation act) {
  std::vector<PreparedGroup> groups;
  groups.reserve(products.size());
  int64_t max_tokens = 0;
  for (const GroupedProduct& p : products) {
    if (p.n_tokens == 0) continue;
    groups.push_back(prepare_group(p, groups.size(), pool));
    max_tokens = std::max(max_tokens, p.n_tokens);
  }
  if (groups.empty()) return;
  std::atomic<int64_t> next{0};
  if (max_tokens <= kShrinkingMaxTokens) {
    // Decode: shrinking shares over the rows of every product, one after the other.
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (const PreparedGroup& g : groups) rows.push_back(g.p->w->rows), total += rows.back();
    pool.run([&](int, int n_threads) {
      size_t j = 0;
      int64_t begin = 0, end = 0;
      while (claim_shrinking(next, rows, total, n_threads, &j, &begin, &end))
        run_group_rows(groups[j], act, begin, end);
    });
    return;
  }
  std::vector<ChunkedRows> jobs;
  int64_t total = 0;
  for (const PreparedGroup& g : groups) {
    jobs.push_back(chunk_rows(g.p->w->rows, pool.size()));
    total += jobs.back().n_chunks;
  }
  pool.run([&](int, int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < total;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      size_t j = 0;
      while (c >= jobs[j].n_chunks) c -= jobs[j++].n_chunks;
      const int64_t begin = c * jobs[j].chunk;
      run_group_rows(groups[j], act, begin, std::min(jobs[j].rows, begin + jobs[j].chunk));
    }
  });
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            TokenRoles roles) {
  matmul_with_isa(best_isa(), w, x, n_tokens, y, pool, roles);
}

}  // namespace hablar::cpu
