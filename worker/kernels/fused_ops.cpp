// The small per-layer steps of a Llama decoder, each fused into one pass over its rows.
//
// In torch each of these is 4-8 separate ops (casts, pow, mean, rsqrt, mul, cat, neg, silu, ...), and at
// the batch sizes of decoding (1-64 rows of 576 values) every op costs more in dispatch than in arithmetic:
// about a fifth of a decode step. The results round exactly where the torch code rounds (through the
// storage dtype after each op), so bfloat16 outputs match the unfused path; float32 ones differ only in
// summation order.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops.h"
#include "vec.h"

namespace {

template <typename T>
inline T round_to(float v) {
  return static_cast<T>(v);
}

// out = weight * T(x * rsqrt(mean(x^2) + eps)), one row.
template <typename T>
void rms_norm_row(const T* x, const T* weight, float eps, int64_t n, T* out) {
  float sum = 0.f;
  int64_t i = 0;
#ifdef LLMSERVE_AVX512
  __m512 acc16 = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = llmserve::load16(x + i);
    acc16 = _mm512_fmadd_ps(v, v, acc16);
  }
  sum = _mm512_reduce_add_ps(acc16);
#endif
#ifdef LLMSERVE_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = llmserve::load8(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  sum += llmserve::hsum(acc);
#endif
  for (; i < n; ++i) sum += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  i = 0;
#ifdef LLMSERVE_AVX512
  const __m512 inv16 = _mm512_set1_ps(inv);
  for (; i + 16 <= n; i += 16) {
    const __m512 normed = llmserve::round_through16(_mm512_mul_ps(llmserve::load16(x + i), inv16), x);
    llmserve::store16(out + i, _mm512_mul_ps(llmserve::load16(weight + i), normed));
  }
#endif
#ifdef LLMSERVE_AVX2
  const __m256 inv8 = _mm256_set1_ps(inv);
  for (; i + 8 <= n; i += 8) {
    const __m256 normed = llmserve::round_through(_mm256_mul_ps(llmserve::load8(x + i), inv8), x);
    llmserve::store8(out + i, _mm256_mul_ps(llmserve::load8(weight + i), normed));
  }
#endif
  for (; i < n; ++i) {
    const float normed = static_cast<float>(round_to<T>(static_cast<float>(x[i]) * inv));
    out[i] = round_to<T>(static_cast<float>(weight[i]) * normed);
  }
}

template <typename T>
void add_rows(const T* x, T* residual, int64_t n) {
  int64_t i = 0;
#ifdef LLMSERVE_AVX512
  for (; i + 16 <= n; i += 16) {
    llmserve::store16(residual + i, _mm512_add_ps(llmserve::load16(residual + i), llmserve::load16(x + i)));
  }
#endif
#ifdef LLMSERVE_AVX2
  for (; i + 8 <= n; i += 8) {
    llmserve::store8(residual + i, _mm256_add_ps(llmserve::load8(residual + i), llmserve::load8(x + i)));
  }
#endif
  for (; i < n; ++i) residual[i] = round_to<T>(static_cast<float>(residual[i]) + static_cast<float>(x[i]));
}

void check_rows(const at::Tensor& x, const at::Tensor& out, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), what, " runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && out.is_contiguous(), what, ": contiguous 2-D tensors");
  TORCH_CHECK(x.scalar_type() == out.scalar_type(), what, ": one dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, what,
              " supports float32 and bfloat16, got ", x.scalar_type());
}

// Calls fn.template operator()<T>() with T the C++ type of a float32 or bfloat16 tensor.
template <typename Fn>
void dispatch_float_bf16(at::ScalarType type, const Fn& fn) {
  if (type == at::kFloat) {
    fn.template operator()<float>();
  } else {
    fn.template operator()<c10::BFloat16>();
  }
}

template <typename Fn>
void for_rows(int64_t rows, int64_t row_cost, const Fn& fn) {
  // Threads only pay off past a few tens of thousands of values; a single decode row stays on one.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_cost));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}
}  // namespace

namespace llmserve {

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out) {
  check_rows(x, out, "rms_norm");
  TORCH_CHECK(out.sizes() == x.sizes() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type() &&
                  weight.is_contiguous(),
              "rms_norm: shapes or weight dtype differ");
  const int64_t n = x.size(1);
  dispatch_float_bf16(x.scalar_type(), [&]<typename T>() {
      for_rows(x.size(0), n, [&](int64_t r) {
        rms_norm_row(x.data_ptr<T>() + r * n, weight.data_ptr<T>(), float(eps), n,
                     out.data_ptr<T>() + r * n);
      });
  });
}

// residual += x; out = rms_norm(residual): the residual connection and the next layer's norm in one pass.
void add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                  const at::Tensor& out) {
  check_rows(x, out, "add_rms_norm");
  TORCH_CHECK(residual.sizes() == x.sizes() && out.sizes() == x.sizes() && residual.is_contiguous() &&
                  residual.scalar_type() == x.scalar_type() && weight.numel() == x.size(1) &&
                  weight.scalar_type() == x.scalar_type() && weight.is_contiguous(),
              "add_rms_norm: shapes or dtypes differ");
  const int64_t n = x.size(1);
  dispatch_float_bf16(x.scalar_type(), [&]<typename T>() {
      for_rows(x.size(0), n, [&](int64_t r) {
        T* res = residual.data_ptr<T>() + r * n;
        add_rows(x.data_ptr<T>() + r * n, res, n);
        rms_norm_row(res, weight.data_ptr<T>(), float(eps), n, out.data_ptr<T>() + r * n);
      });
  });
}

}  // namespace llmserve

namespace {

// Rotary embedding (rotate-half form) in place on the first `num_heads` heads of each row of `qkv`
// (the query heads then the key heads of the fused projection): x1' = x1 c - x2 s, x2' = x2 c + x1 s.
template <typename T>
void rotary_row(T* row, const T* cos, const T* sin, int64_t num_heads, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    T* x = row + h * dim;
    int64_t i = 0;
#ifdef LLMSERVE_AVX512
    using llmserve::load16;
    using llmserve::round_through16;
    for (; i + 16 <= half; i += 16) {  // as below, sixteen pairs at a time
      const __m512 x1 = load16(x + i), x2 = load16(x + i + half);
      const __m512 a1 = round_through16(_mm512_mul_ps(x1, load16(cos + i)), x);
      const __m512 b1 = round_through16(_mm512_mul_ps(_mm512_xor_ps(x2, _mm512_set1_ps(-0.f)), load16(sin + i)), x);
      const __m512 a2 = round_through16(_mm512_mul_ps(x2, load16(cos + i + half)), x);
      const __m512 b2 = round_through16(_mm512_mul_ps(x1, load16(sin + i + half)), x);
      llmserve::store16(x + i, _mm512_add_ps(a1, b1));
      llmserve::store16(x + i + half, _mm512_add_ps(a2, b2));
    }
#endif
#ifdef LLMSERVE_AVX2
    using llmserve::load8;
    using llmserve::round_through;
    for (; i + 8 <= half; i += 8) {  // the same roundings, eight pairs at a time
      const __m256 x1 = load8(x + i), x2 = load8(x + i + half);
      const __m256 a1 = round_through(_mm256_mul_ps(x1, load8(cos + i)), x);
      const __m256 b1 = round_through(_mm256_mul_ps(_mm256_xor_ps(x2, _mm256_set1_ps(-0.f)), load8(sin + i)), x);
      const __m256 a2 = round_through(_mm256_mul_ps(x2, load8(cos + i + half)), x);
      const __m256 b2 = round_through(_mm256_mul_ps(x1, load8(sin + i + half)), x);
      llmserve::store8(x + i, _mm256_add_ps(a1, b1));
      llmserve::store8(x + i + half, _mm256_add_ps(a2, b2));
    }
#endif
    for (; i < half; ++i) {
      const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[i + half]);
      // Each product is rounded to T before the sum, as `x * cos + rotate_half(x) * sin` does.
      const float a1 = static_cast<float>(round_to<T>(x1 * static_cast<float>(cos[i])));
      const float b1 = static_cast<float>(round_to<T>(-x2 * static_cast<float>(sin[i])));
      const float a2 = static_cast<float>(round_to<T>(x2 * static_cast<float>(cos[i + half])));
      const float b2 = static_cast<float>(round_to<T>(x1 * static_cast<float>(sin[i + half])));
      x[i] = round_to<T>(a1 + b1);
      x[i + half] = round_to<T>(a2 + b2);
    }
  }
}
}  // namespace

namespace llmserve {

void rotary_(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
             int64_t num_heads) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 2 && qkv.stride(1) == 1, "rotary_: a CPU [T, width] tensor");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "rotary_: cos/sin tables [positions, head_dim] in the tensor's dtype");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == qkv.size(0),
              "rotary_: one int64 position per row");
  const int64_t dim = cos.size(1), rows = qkv.size(0), stride = qkv.stride(0), max_pos = cos.size(0);
  TORCH_CHECK(dim % 2 == 0 && num_heads * dim <= qkv.size(1), "rotary_: heads do not fit the row");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) TORCH_CHECK(pos[r] >= 0 && pos[r] < max_pos, "rotary_: position out of range");
  dispatch_float_bf16(qkv.scalar_type(), [&]<typename T>() {
      for_rows(rows, num_heads * dim, [&](int64_t r) {
        rotary_row(qkv.data_ptr<T>() + r * stride, cos.data_ptr<T>() + pos[r] * dim,
                   sin.data_ptr<T>() + pos[r] * dim, num_heads, dim);
      });
  });
}

}  // namespace llmserve

namespace {

// out = T(silu(gate)) * up for x = [gate | up], rounded like `F.silu(gate) * up`.
template <typename T>
void silu_and_mul_row(const T* x, int64_t n, T* out) {
  const T* gate = x;
  const T* up = x + n;
  int64_t i = 0;
#ifdef LLMSERVE_AVX512
  for (; i + 16 <= n; i += 16)
    llmserve::store16(out + i, llmserve::silu_mul16(llmserve::load16(gate + i), llmserve::load16(up + i), gate));
#endif
#ifdef LLMSERVE_AVX2
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = llmserve::load8(gate + i);
    const __m256 e = llmserve::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = llmserve::round_through(_mm256_div_ps(g, _mm256_add_ps(one, e)), gate);
    llmserve::store8(out + i, _mm256_mul_ps(s, llmserve::load8(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = static_cast<float>(gate[i]);
    const float s = static_cast<float>(round_to<T>(g / (1.f + std::exp(-g))));
    out[i] = round_to<T>(s * static_cast<float>(up[i]));
  }
}
}  // namespace

namespace llmserve {

void silu_and_mul(const at::Tensor& x, const at::Tensor& out) {
  check_rows(x, out, "silu_and_mul");
  const int64_t n = out.size(1);
  TORCH_CHECK(x.size(1) == 2 * n && out.size(0) == x.size(0), "silu_and_mul: x is [T, 2n], out [T, n]");
  dispatch_float_bf16(x.scalar_type(), [&]<typename T>() {
      for_rows(x.size(0), 2 * n, [&](int64_t r) {
        silu_and_mul_row(x.data_ptr<T>() + r * 2 * n, n, out.data_ptr<T>() + r * n);
      });
  });
}

// w8a8 (worker/model/w8a8.py): each group of columns' int8 codes + 128 and its scale (scales [rows, groups],
// every group the row's width / groups columns), in one read of the row; the same float operations as the
// torch code (scale = max|x| / 127 clamped, q = round-half-even(x / scale)), so both give the same codes.
void quantize_rows_u8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t max_code) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "quantize_rows_u8: contiguous 2-D x");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "quantize_rows_u8: float32 or bfloat16 x");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.sizes() == x.sizes(),
              "quantize_rows_u8: uint8 codes shaped like x");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 2 &&
                  scales.size(0) == x.size(0) && scales.size(1) >= 1 && x.size(1) % scales.size(1) == 0,
              "quantize_rows_u8: float32 scales [rows, groups], the groups dividing the row");
  TORCH_CHECK(max_code >= 1 && max_code <= 127, "quantize_rows_u8: max_code in [1, 127]");
  const float top = static_cast<float>(max_code);
  const int64_t n = x.size(1), groups = scales.size(1), width = n / groups;
  dispatch_float_bf16(x.scalar_type(), [&]<typename T>() {
      for_rows(x.size(0), n, [&](int64_t r) {
        for (int64_t g = 0; g < groups; ++g) {
          const T* group = x.data_ptr<T>() + r * n + g * width;
          uint8_t* out = codes.data_ptr<uint8_t>() + r * n + g * width;
          float peak = 0.f;
          int64_t i = 0;
#ifdef LLMSERVE_AVX2
          // Eight at a time: a scalar loop of these (a division and a rounding per value) was a tenth of a
          // w8a8 decode step. Division and round-half-even are exact in either form, so the codes are the same.
          const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
          __m256 acc = _mm256_setzero_ps();
          for (; i + 8 <= width; i += 8) acc = _mm256_max_ps(acc, _mm256_and_ps(llmserve::load8(group + i), magnitude));
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, acc);
          for (float lane : lanes) peak = std::max(peak, lane);
#endif
          for (; i < width; ++i) peak = std::max(peak, std::fabs(static_cast<float>(group[i])));
          const float scale = std::max(peak, 1e-12f) / top;
          scales.data_ptr<float>()[r * groups + g] = scale;
          i = 0;
#ifdef LLMSERVE_AVX2
          const __m256 divisor = _mm256_set1_ps(scale);
          const __m256i zero_point = _mm256_set1_epi32(128);
          for (; i + 8 <= width; i += 8) {
            const __m256 q = _mm256_round_ps(_mm256_div_ps(llmserve::load8(group + i), divisor),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256i shifted = _mm256_add_epi32(_mm256_cvtps_epi32(q), zero_point);  // 1..255
            const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(words, words));
          }
#endif
          for (; i < width; ++i) {
            out[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(static_cast<float>(group[i]) / scale)) + 128);
          }
        }
      });
  });
}

#ifdef LLMSERVE_AVX2
void signed_row_codes(const uint8_t* codes, int64_t M, int64_t K, int8_t* rows, int32_t* group_sums,
                      int32_t multiplier) {
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t i = begin * K; i < end * K; i += 32) {  // one group of 32 codes a pass
      const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)), top);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + i), q);
      // sum of the group's 32 signed codes: 1 x q in pairs, then the pairs of pairs, then across lanes
      const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      group_sums[i / 32] = multiplier * _mm_cvtsi128_si32(s4);
    }
  });
}
#endif

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("quantize_rows_u8(Tensor x, Tensor(a!) codes, Tensor(b!) scales, int max_code=127) -> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps, Tensor(b!) out) -> ()");
  m.def("rotary_(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, int num_heads) -> ()");
  m.def("silu_and_mul(Tensor x, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("rms_norm", &llmserve::rms_norm);
  m.impl("add_rms_norm", &llmserve::add_rms_norm);
  m.impl("rotary_", &llmserve::rotary_);
  m.impl("silu_and_mul", &llmserve::silu_and_mul);
  m.impl("quantize_rows_u8", &llmserve::quantize_rows_u8);
}
