// y = x @ W.T (+ nothing: callers add a bias) for weights stored as bfloat16 and float32 activations and sums.
//
// For models whose weights should be read in half the bytes without changing the arithmetic: a bfloat16
// weight is the top half of a float32, so widening it is exact (a shift), and every product and sum is the
// float32 one. The only change from float32 weights is the weights' own rounding to bfloat16 (8 significant
// bits). Used by the cache service's embedder on CPUs without native bfloat16: half the bytes lets its
// ~21 MB of linear weights stay in the last-level cache between queries (cache_service/embedder.py).
//
// Layouts: x [M, K] float32, contiguous; w [N, K] bfloat16, contiguous; out [M, N] float32, written. Work is
// split over output channels on torch's intra-op threads, blocked as in int8_linear.cpp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops.h"
#include "vec.h"

namespace {

constexpr int64_t kRowTile = 4;        // activation rows sharing one pass over a weight row
constexpr int64_t kRowChunk = 16;      // x rows kept in cache while weight blocks pass
constexpr int64_t kChannelBlock = 16;  // weight rows (at most 16 x 1536 x 2 bytes here) kept in L1/L2

inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

// Rows [0, R) of x against one weight row; writes out[r * ldo] for each row.
template <int R>
void dot_rows(const float* x, int64_t K, const uint16_t* w, float* out, int64_t ldo) {
  int64_t k = 0;
#ifdef LLMSERVE_AVX2
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
    const __m256 w1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + 8), acc[r][1]);
    }
  }
  float sums[R];
  for (int r = 0; r < R; ++r) sums[r] = llmserve::hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
#else
  float sums[R] = {};
#endif
  for (; k < K; ++k) {
    for (int r = 0; r < R; ++r) sums[r] += widen(w[k]) * x[r * K + k];
  }
  for (int r = 0; r < R; ++r) out[r * ldo] = sums[r];
}

#ifdef LLMSERVE_AVX2
inline __m256 widen8(const uint16_t* w) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))), 16));
}

// Rows [0, R) of x against two weight rows at once: each x vector loaded serves both, so a step is two
// weight loads and R x loads for 2 R FMAs (dot_rows: 2 + 2 R loads for 2 R FMAs), and the 2 R chains keep
// the FMA units busy. Writes out[r * ldo] and out[r * ldo + 1].
template <int R>
void dot_rows_pair(const float* x, int64_t K, const uint16_t* w0, const uint16_t* w1, float* out, int64_t ldo) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 a = widen8(w0 + k), b = widen8(w1 + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * K + k);
      acc[r][0] = _mm256_fmadd_ps(a, xv, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(b, xv, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s0 = llmserve::hsum(acc[r][0]), s1 = llmserve::hsum(acc[r][1]);
    for (int64_t j = k; j < K; ++j) {
      s0 += widen(w0[j]) * x[r * K + j];
      s1 += widen(w1[j]) * x[r * K + j];
    }
    out[r * ldo] = s0;
    out[r * ldo + 1] = s1;
  }
}
#endif
}  // namespace

namespace llmserve {

void bf16_weight_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "bf16_weight_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && out.dim() == 2, "bf16_weight_linear: x [M, K], w [N, K], out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "bf16_weight_linear: float32 x and out");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16, "bf16_weight_linear: bfloat16 weights");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && out.size(0) == M && out.size(1) == N, "bf16_weight_linear: shapes differ");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && out.is_contiguous(),
              "bf16_weight_linear: contiguous tensors only");
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t c0 = 0; c0 < M; c0 += kRowChunk) {
      const int64_t c1 = std::min(M, c0 + kRowChunk);
      for (int64_t n0 = begin; n0 < end; n0 += kChannelBlock) {
        const int64_t n1 = std::min(end, n0 + kChannelBlock);
        for (int64_t m0 = c0; m0 < c1; m0 += kRowTile) {
          const int64_t rows = std::min(kRowTile, c1 - m0);
          const float* xr = xp + m0 * K;
          float* orow = op + m0 * N;
          int64_t n = n0;
#ifdef LLMSERVE_AVX2
          for (; n + 2 <= n1; n += 2) {
            const uint16_t* wr = wp + n * K;
            switch (rows) {
              case 1: dot_rows_pair<1>(xr, K, wr, wr + K, orow + n, N); break;
              case 2: dot_rows_pair<2>(xr, K, wr, wr + K, orow + n, N); break;
              case 3: dot_rows_pair<3>(xr, K, wr, wr + K, orow + n, N); break;
              default: dot_rows_pair<4>(xr, K, wr, wr + K, orow + n, N); break;
            }
          }
#endif
          for (; n < n1; ++n) {
            const uint16_t* wr = wp + n * K;
            switch (rows) {
              case 1: dot_rows<1>(xr, K, wr, orow + n, N); break;
              case 2: dot_rows<2>(xr, K, wr, orow + n, N); break;
              case 3: dot_rows<3>(xr, K, wr, orow + n, N); break;
              default: dot_rows<4>(xr, K, wr, orow + n, N); break;
            }
          }
        }
      }
    }
  });
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) { m.def("bf16_weight_linear(Tensor x, Tensor w, Tensor(a!) out) -> ()"); }

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("bf16_weight_linear", &llmserve::bf16_weight_linear); }
