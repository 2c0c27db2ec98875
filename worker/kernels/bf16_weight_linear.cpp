// y = x @ W.T (+ nothing: callers add a bias) for weights stored as bfloat16 and float32 activations and sums.
//
// For models whose weights should be read in half the bytes without changing the arithmetic: a bfloat16
// weight is the top half of a float32, so widening it is exact (a shift), and every product and sum is the
// float32 one. The only change from float32 weights is the weights' own rounding to bfloat16 (8 significant
// bits). Used by the cache service's embedder with CACHE_EMBEDDING_DTYPE=bfloat16-weights, for CPUs without
// native bfloat16 (cache_service/embedder.py).
//
// Layouts: x [M, K] float32, contiguous; w [N, K] bfloat16, contiguous; out [M, N] float32, written. Work is
// split and blocked as in the other weight-only kernels (blocking.h).
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#include "blocking.h"
#include "ops.h"
#include "vec.h"

namespace {

using BF16 = c10::BFloat16;

constexpr int64_t kBf16RowTile = 4;         // activation rows sharing one pass over a weight row
constexpr int64_t kBf16RowChunk = 16;       // x rows kept in cache while weight blocks pass
constexpr int64_t kBf16ChannelBlock = 16;   // weight rows (at most 16 x 1536 x 2 bytes here) kept in L1/L2

// Rows [0, R) of x against two weight rows at once, writing out0[r * ld0] and out1[r * ld1]: each x vector
// loaded serves both, so a step is two weight loads and R x loads for 2 R FMAs, and the 2 R independent
// chains keep the FMA units busy. A lone weight row is passed as both.
template <int R>
void dot_rows_pair(const float* x, int64_t K, const BF16* w0, const BF16* w1, float* out0, int64_t ld0,
                   float* out1, int64_t ld1) {
  float s0[R] = {}, s1[R] = {};
  int64_t k = 0;
#ifdef LLMSERVE_AVX2
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    const __m256 a = llmserve::load8(w0 + k), b = llmserve::load8(w1 + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * K + k);
      acc[r][0] = _mm256_fmadd_ps(a, xv, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(b, xv, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    s0[r] = llmserve::hsum(acc[r][0]);
    s1[r] = llmserve::hsum(acc[r][1]);
  }
#endif
  for (; k < K; ++k) {
    const float a = static_cast<float>(w0[k]), b = static_cast<float>(w1[k]);
    for (int r = 0; r < R; ++r) {
      s0[r] += a * x[r * K + k];
      s1[r] += b * x[r * K + k];
    }
  }
  for (int r = 0; r < R; ++r) {
    out0[r * ld0] = s0[r];
    out1[r * ld1] = s1[r];
  }
}

template <int R>
void dot_tile(const float* x, int64_t K, const BF16* w, int64_t n0, int64_t n1, float* out, int64_t ldo) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) dot_rows_pair<R>(x, K, w + n * K, w + (n + 1) * K, out + n, ldo, out + n + 1, ldo);
  if (n < n1) {
    float spare[R];  // the second result of a lone row, discarded
    dot_rows_pair<R>(x, K, w + n * K, w + n * K, out + n, ldo, spare, 1);
  }
}
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
  const BF16* wp = w.data_ptr<BF16>();
  float* op = out.data_ptr<float>();
  for_each_tile(M, N, kBf16RowChunk, kBf16ChannelBlock, kBf16RowTile,
                [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    const float* xr = xp + m0 * K;
    float* orow = op + m0 * N;
    switch (rows) {
      case 1: dot_tile<1>(xr, K, wp, n0, n1, orow, N); break;
      case 2: dot_tile<2>(xr, K, wp, n0, n1, orow, N); break;
      case 3: dot_tile<3>(xr, K, wp, n0, n1, orow, N); break;
      default: dot_tile<4>(xr, K, wp, n0, n1, orow, N); break;
    }
  });
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) { m.def("bf16_weight_linear(Tensor x, Tensor w, Tensor(a!) out) -> ()"); }

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("bf16_weight_linear", &llmserve::bf16_weight_linear); }
