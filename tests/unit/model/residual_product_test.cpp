// model::residual_product: a backend with matmul_add gets the residual branch's product as
// that one op; a backend without it, or a run that dumps activations, the matmul, scale and
// add it stands for, with the same values.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/forward.h"

namespace hablar::model {
namespace {

// One token row: W is [rows x cols] of f32 values in `data`.
struct ComposingBackend {
  std::vector<std::string> ops;
  void matmul(const WeightView& w, const float* in, float* out) {
    ops.push_back("matmul");
    const auto* m = static_cast<const float*>(w.data);
    for (int64_t r = 0; r < w.rows; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += m[r * w.cols + c] * in[c];
      out[r] = sum;
    }
  }
  void scale(float* x, float s, int64_t width) {
    ops.push_back("scale");
    for (int64_t i = 0; i < width; ++i) x[i] *= s;
  }
  void add(float* x, const float* y, int64_t width) {
    ops.push_back("add");
    for (int64_t i = 0; i < width; ++i) x[i] += y[i];
  }
};

struct AccumulatingBackend : ComposingBackend {
  void matmul_add(const WeightView& w, const float* in, float* tmp, float* x, float s) {
    ops.push_back("matmul_add");
    std::vector<float> product((size_t)w.rows);
    ComposingBackend::matmul(w, in, product.data());
    ops.pop_back();
    for (int64_t i = 0; i < w.rows; ++i) x[i] += (s != 0.0f ? s : 1.0f) * product[(size_t)i];
    tmp[0] = -1.0f;  // scratch: its contents are the backend's
  }
};

struct Case {
  std::vector<float> w{1, 2, 3, 4, 5, 6};  // 2 x 3
  std::vector<float> in{1, -1, 2};
  WeightView view() {
    WeightView v;
    v.type = DType::F32, v.rows = 2, v.cols = 3, v.data = w.data();
    return v;
  }
};

const auto no_dump = [](const char*, int, const float*, int64_t) {};

TEST(ResidualProduct, BackendWithAnAccumulatingProductTakesIt) {
  for (float s : {0.0f, 0.5f}) {
    Case c;
    ComposingBackend composing;
    AccumulatingBackend accumulating;
    std::vector<float> x1{10, 20}, x2{10, 20}, tmp1(2), tmp2(2);
    residual_product(composing, c.view(), c.in.data(), tmp1.data(), x1.data(), s, no_dump, nullptr,
                     0);
    residual_product(accumulating, c.view(), c.in.data(), tmp2.data(), x2.data(), s, no_dump,
                     nullptr, 0);
    const float f = s != 0.0f ? s : 1.0f;  // W·in = (5, 11)
    EXPECT_FLOAT_EQ(x1[0], 10 + f * 5);
    EXPECT_FLOAT_EQ(x1[1], 20 + f * 11);
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(accumulating.ops, std::vector<std::string>{"matmul_add"});
    const std::vector<std::string> composed =
        s != 0.0f ? std::vector<std::string>{"matmul", "scale", "add"}
                  : std::vector<std::string>{"matmul", "add"};
    EXPECT_EQ(composing.ops, composed);
  }
}

}  // namespace
}  // namespace hablar::model
