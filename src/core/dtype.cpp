#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "core/error.h"

namespace hablar {
namespace {

struct Entry {
  uint32_t raw;
  DTypeTraits traits;
};

// Block layouts: see core/quant_blocks.h for the byte structure of each.
constexpr std::array<Entry, 29> kTypes = {{
    {0, {"f32", 1, 4, false, true}},
    {1, {"f16", 1, 2, false, true}},
    {2, {"q4_0", 32, 18, true, true}},
    {3, {"q4_1", 32, 20, true, true}},
    {6, {"q5_0", 32, 22, true, true}},
    {7, {"q5_1", 32, 24, true, true}},
    {8, {"q8_0", 32, 34, true, true}},
    {9, {"q8_1", 32, 36, true, false}},
    {10, {"q2_K", 256, 84, true, true}},
    {11, {"q3_K", 256, 110, true, true}},
    {12, {"q4_K", 256, 144, true, true}},
    {13, {"q5_K", 256, 176, true, true}},
    {14, {"q6_K", 256, 210, true, true}},
    {15, {"q8_K", 256, 292, true, true}},
    {16, {"iq2_xxs", 256, 66, true, false}},
    {17, {"iq2_xs", 256, 74, true, false}},
    {18, {"iq3_xxs", 256, 98, true, false}},
    {19, {"iq1_s", 256, 50, true, false}},
    {20, {"iq4_nl", 32, 18, true, true}},
    {21, {"iq3_s", 256, 110, true, false}},
    {22, {"iq2_s", 256, 82, true, false}},
    {23, {"iq4_xs", 256, 136, true, true}},
    {24, {"i8", 1, 1, false, false}},
    {25, {"i16", 1, 2, false, false}},
    {26, {"i32", 1, 4, false, false}},
    {27, {"i64", 1, 8, false, false}},
    {28, {"f64", 1, 8, false, false}},
    {29, {"iq1_m", 256, 56, true, false}},
    {30, {"bf16", 1, 2, false, true}},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

}  // namespace

std::optional<DTypeTraits> dtype_traits_of(uint32_t raw) {
  for (const Entry& e : kTypes)
    if (e.raw == raw) return e.traits;
  return std::nullopt;
}

const DTypeTraits& dtype_traits(DType t) {
  for (const Entry& e : kTypes)
    if (e.raw == (uint32_t)t) return e.traits;
  throw_error(ErrorKind::kInternal, "invalid DType " + std::to_string((uint32_t)t));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  const std::string want = lower(name);
  for (const Entry& e : kTypes)
    if (lower(e.traits.name) == want) return (DType)e.raw;
  return std::nullopt;
}

std::vector<DType> supported_dtypes() {
  std::vector<DType> out;
  for (const Entry& e : kTypes)
    if (e.traits.supported) out.push_back((DType)e.raw);
  return out;
}

std::string supported_dtype_names() {
  std::string out;
  for (DType t : supported_dtypes()) {
    if (!out.empty()) out += ", ";
    out += dtype_name(t);
  }
  return out;
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = dtype_traits(t);
  if (n < 0 || n % tr.block_elems != 0)
    throw_error(ErrorKind::kFormat, "row of " + std::to_string(n) + " values is not a multiple of " +
                                        std::string(tr.name) + "'s block size " +
                                        std::to_string(tr.block_elems));
  return (size_t)(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace hablar
