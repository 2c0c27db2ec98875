// y = x @ W.T with 4-bit weights and 8-bit activation rows (WORKER_QUANTIZATION=w4a8), on AVX2's integer
// multiply-adds: the products of llama.cpp's Q4_1 x Q8_1 dot products, for a batch of rows.
//
// The weights are Q4_1 blocks as a GGUF file has them (w = d q + m per group of 32 input columns, q in 0..15,
// d and m float16), so a GGUF model's weights stay exact. Each row is quantized per group of the same 32
// columns (quantize_rows_u8, 8-bit: |c| <= 127, one float32 scale s), and a group's part of the dot product is
//
//     sum_k x_k w_k = s (d sum_k c_k q_k + m sum_k c_k)
//
// with sum c q an exact integer sum. VPMADDUBSW takes the codes q (0..15) as its unsigned operand and the row's
// codes c as its signed one: a pair is at most 2 x 15 x 127 = 3810 in magnitude, so unlike w8a8's 8-bit
// weights (w8a8_linear.cpp) the rows keep all 8 bits, and the pairs of a whole group (8 steps of 4 columns)
// add up in 16 bits (8 x 3810 = 30480 < 32767) before one VPMADDWD widens them: per 64 products one multiply
// instruction, about half of w8a8's two (which widens every step), with the weights half the bytes.
//
// On AVX512-VNNI the products run on VPDPBUSD instead (vnni_tile): 4 products a lane summed straight into 32
// bits, the codes again the unsigned operand. The packed layout is the same: a step's 32 bytes of a block are
// broadcast into both halves of a register and masked with 0x0F in the low half and 0xF0 in the high one, so
// that one register holds all 16 channels (channels 8-15 times 16, which the group's scale takes back exactly:
// d / 16 is a float32 power-of-two step) at one AND a step, where shifting the high nibbles down would take two.
//
// Layouts: x [M, K] float32 or bfloat16, contiguous; packed [N / 16, K / 4, 32] uint8: per block of 16 output
// channels and step of 4 columns, byte 4 c + j holds channel c's code for column j in its low nibble and
// channel c + 8's in its high one (one load and two masks give the two halves' registers); scales_mins
// [N / 16, K / 32, 32] float16: per block and group d of the 16 channels, then m of the 16; out [M, N] float32
// or bfloat16, written. K a multiple of 32, N of 16.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "ops.h"
#include "vec.h"

#if defined(LLMSERVE_AVX512) && defined(__AVX512VNNI__)
#define LLMSERVE_W4A8_VNNI 1
#endif

namespace {
namespace w4a8 {

constexpr int64_t kGroup = 32;  // weights per (d, m) pair, and columns per row scale
constexpr int64_t kSteps = kGroup / 4;  // VPMADDUBSW steps of 4 columns per group
// Rows per tile: 5 rows x 2 halves of 8 channels = 10 16-bit accumulators, the two halves' codes, a row's
// broadcast and the mask (w8a8's AVX2 tile is 5 rows too).
constexpr int kRows = 5;

#ifdef LLMSERVE_AVX2
using BF16 = c10::BFloat16;
#endif

#if defined(LLMSERVE_AVX2) && !defined(LLMSERVE_W4A8_VNNI)

// Rows [m0, m0 + R) against channel block `codes` (16 channels), every group of columns. rows: the signed
// codes c, K bytes a row; row_scales, row_sums [M, K / kGroup]: each group's s and sum of c.
template <int R>
void tile(const int8_t* rows, int64_t K, const uint8_t* codes, const c10::Half* scales_mins, int64_t m0,
          const float* row_scales, const int32_t* row_sums, int64_t n0, void* out, bool bf16, int64_t N) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t groups = K / kGroup;
  __m256 totals[R][2];
  for (int r = 0; r < R; ++r) totals[r][0] = totals[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* w = codes + g * kSteps * 32;
    const int8_t* x = rows + m0 * K + g * kGroup;
#pragma GCC unroll 8
    for (int step = 0; step < kSteps; ++step) {
      const __m256i both = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + step * 32));
      const __m256i w0 = _mm256_and_si256(both, nibble);
      const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibble);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i xr = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x + K * r + 4 * step));
        // In place on the accumulators (inline asm, "+x"), as w8a8's tiles do: with the intrinsics GCC keeps
        // accumulators on the stack, storing and loading each one every step.
        __m256i t, u;
        asm("vpmaddubsw %[x], %[w0], %[t]\n\t"
            "vpmaddubsw %[x], %[w1], %[u]\n\t"
            "vpaddw %[t], %[a0], %[a0]\n\t"
            "vpaddw %[u], %[a1], %[a1]"
            : [a0] "+x"(acc[r][0]), [a1] "+x"(acc[r][1]), [t] "=&x"(t), [u] "=&x"(u)
            : [x] "x"(xr), [w0] "x"(w0), [w1] "x"(w1));
      }
    }
    const c10::Half* dm = scales_mins + g * 32;
    const __m256 d[2] = {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm))),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm + 8)))};
    const __m256 m[2] = {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm + 16))),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm + 24)))};
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * groups + g;
      const __m256 s = _mm256_set1_ps(row_scales[at]);
      const __m256 min_share = _mm256_set1_ps(row_scales[at] * static_cast<float>(row_sums[at]));
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][h], ones));
        totals[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dots, d[h]), s, totals[r][h]);
        totals[r][h] = _mm256_fmadd_ps(m[h], min_share, totals[r][h]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t at = (m0 + r) * N + n0;
    if (bf16) {
      llmserve::store8(static_cast<BF16*>(out) + at, totals[r][0]);
      llmserve::store8(static_cast<BF16*>(out) + at + 8, totals[r][1]);
    } else {
      llmserve::store8(static_cast<float*>(out) + at, totals[r][0]);
      llmserve::store8(static_cast<float*>(out) + at + 8, totals[r][1]);
    }
  }
}

// Each thread's channel blocks against every row tile, a block's codes (8 K bytes) staying in L1 across them.
void linear(const int8_t* rows, int64_t M, int64_t K, const uint8_t* packed, const c10::Half* scales_mins,
            int64_t N, const float* row_scales, const int32_t* row_sums, void* out, bool bf16) {
  const int64_t groups = K / kGroup;
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* codes = packed + b * 8 * K;
      const c10::Half* dm = scales_mins + b * groups * 32;
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        switch (std::min<int64_t>(kRows, M - m0)) {
          case 1: tile<1>(rows, K, codes, dm, m0, row_scales, row_sums, b * 16, out, bf16, N); break;
          case 2: tile<2>(rows, K, codes, dm, m0, row_scales, row_sums, b * 16, out, bf16, N); break;
          case 3: tile<3>(rows, K, codes, dm, m0, row_scales, row_sums, b * 16, out, bf16, N); break;
          case 4: tile<4>(rows, K, codes, dm, m0, row_scales, row_sums, b * 16, out, bf16, N); break;
          default: tile<5>(rows, K, codes, dm, m0, row_scales, row_sums, b * 16, out, bf16, N); break;
        }
      }
    }
  });
}
#endif

#ifdef LLMSERVE_W4A8_VNNI
// Rows and channel blocks per tile: 4 x 2 int32 sums and as many float32 totals in registers. 5 x 2 and 3 x 3
// measured the same (bench/w8a8_kernels.py); the group's float epilogue (4 instructions per 8 VPDPBUSD) is
// what holds this path to ~0.8x w8a8's from 16 rows, not the tile's shape.
constexpr int kVnniRows = 4;
constexpr int kVnniBlocks = 2;

// Rows [m0, m0 + R) against the B channel blocks at `codes` (block j at codes + 8 K j), every group of columns.
template <int R, int B>
void vnni_tile(const int8_t* rows, int64_t K, const uint8_t* codes, const c10::Half* scales_mins, int64_t m0,
               const float* row_scales, const int32_t* row_sums, int64_t n0, void* out, bool bf16, int64_t N) {
  const __m512i halves = _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8(static_cast<char>(0xF0)), 1);
  const __m512 sixteenth = _mm512_insertf32x8(_mm512_set1_ps(1.f), _mm256_set1_ps(1.f / 16), 1);
  const int64_t groups = K / kGroup;
  __m512 totals[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < B; ++j) totals[r][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[R][B];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_setzero_si512();
    const uint8_t* w = codes + g * kSteps * 32;
    const int8_t* x = rows + m0 * K + g * kGroup;
#pragma GCC unroll 8
    for (int step = 0; step < kSteps; ++step) {
      __m512i wj[B];
#pragma GCC unroll 2
      for (int j = 0; j < B; ++j) {
        const __m256i both = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * 8 * K + step * 32));
        wj[j] = _mm512_and_si512(_mm512_broadcast_i64x4(both), halves);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i xr = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + K * r + 4 * step));
        // acc += codes (unsigned) . row codes (signed), in place (inline asm, "+v"), as w8a8's VNNI tile
#pragma GCC unroll 2
        for (int j = 0; j < B; ++j) asm("vpdpbusd %[x], %[w], %[a]" : [a] "+v"(acc[r][j]) : [w] "v"(wj[j]), [x] "v"(xr));
      }
    }
#pragma GCC unroll 2
    for (int j = 0; j < B; ++j) {
      const c10::Half* dm = scales_mins + (j * groups + g) * 32;
      const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm))), sixteenth);
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 16)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * groups + g;
        const __m512 s = _mm512_set1_ps(row_scales[at]);
        const __m512 min_share = _mm512_set1_ps(row_scales[at] * static_cast<float>(row_sums[at]));
        // the AVX2 tile's arithmetic in its order, so the same bits: (dots d) s, then + m s sum c
        const __m512 dots = _mm512_cvtepi32_ps(acc[r][j]);
        totals[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dots, d), s, totals[r][j]);
        totals[r][j] = _mm512_fmadd_ps(m, min_share, totals[r][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < B; ++j) {
      const int64_t at = (m0 + r) * N + n0 + 16 * j;
      if (bf16) {
        llmserve::store16(static_cast<BF16*>(out) + at, totals[r][j]);
      } else {
        llmserve::store16(static_cast<float*>(out) + at, totals[r][j]);
      }
    }
}

template <int B>
void vnni_rows(const int8_t* rows, int64_t M, int64_t K, const uint8_t* codes, const c10::Half* dm,
               const float* row_scales, const int32_t* row_sums, int64_t n0, void* out, bool bf16, int64_t N) {
  for (int64_t m0 = 0; m0 < M; m0 += kVnniRows) {
    switch (std::min<int64_t>(kVnniRows, M - m0)) {
      case 1: vnni_tile<1, B>(rows, K, codes, dm, m0, row_scales, row_sums, n0, out, bf16, N); break;
      case 2: vnni_tile<2, B>(rows, K, codes, dm, m0, row_scales, row_sums, n0, out, bf16, N); break;
      case 3: vnni_tile<3, B>(rows, K, codes, dm, m0, row_scales, row_sums, n0, out, bf16, N); break;
      default: vnni_tile<kVnniRows, B>(rows, K, codes, dm, m0, row_scales, row_sums, n0, out, bf16, N); break;
    }
  }
}

// Each thread's pairs of channel blocks against every row tile, the pair's codes (16 K bytes) in L1 across them.
void vnni_linear(const int8_t* rows, int64_t M, int64_t K, const uint8_t* packed, const c10::Half* scales_mins,
                 int64_t N, const float* row_scales, const int32_t* row_sums, void* out, bool bf16) {
  const int64_t groups = K / kGroup, pairs = (N / 16 + kVnniBlocks - 1) / kVnniBlocks;
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = p * kVnniBlocks;
      const uint8_t* codes = packed + b * 8 * K;
      const c10::Half* dm = scales_mins + b * groups * 32;
      if (b + kVnniBlocks <= N / 16) {
        vnni_rows<kVnniBlocks>(rows, M, K, codes, dm, row_scales, row_sums, b * 16, out, bf16, N);
      } else {  // an odd block at the end
        vnni_rows<1>(rows, M, K, codes, dm, row_scales, row_sums, b * 16, out, bf16, N);
      }
    }
  });
}
#endif

}  // namespace w4a8
}  // namespace

namespace llmserve {

bool w4a8_linear_supported() {
#ifdef LLMSERVE_AVX2
  return true;
#else
  return false;
#endif
}

// codes uint8 [N, K] in 0..15, scales and mins float32 [N, K / 32] -> the kernel's layouts (above).
void w4a8_pack_weight(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const at::Tensor& packed, const at::Tensor& scales_mins) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 2 && codes.is_contiguous(),
              "w4a8_pack_weight: contiguous uint8 codes [N, K]");
  const int64_t N = codes.size(0), K = codes.size(1), groups = K / w4a8::kGroup;
  TORCH_CHECK(N % 16 == 0 && K % w4a8::kGroup == 0, "w4a8_pack_weight: N a multiple of 16, K of 32");
  for (const at::Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == N &&
                    t->size(1) == groups,
                "w4a8_pack_weight: float32 scales and mins [N, K / 32]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == N * K / 2,
              "w4a8_pack_weight: uint8 packed [N / 16, K / 4, 32]");
  TORCH_CHECK(scales_mins.scalar_type() == at::kHalf && scales_mins.is_contiguous() &&
                  scales_mins.numel() == N / 16 * groups * 32,
              "w4a8_pack_weight: float16 scales_mins [N / 16, K / 32, 32]");
  const uint8_t* q = codes.data_ptr<uint8_t>();
  TORCH_CHECK(std::all_of(q, q + N * K, [](uint8_t c) { return c < 16; }), "w4a8_pack_weight: codes must be in 0..15");
  const float* d = scales.data_ptr<float>();
  const float* m = mins.data_ptr<float>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  c10::Half* dm = scales_mins.data_ptr<c10::Half>();
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t s = 0; s < K / 4; ++s)
        for (int64_t c = 0; c < 8; ++c)
          for (int64_t j = 0; j < 4; ++j) {
            const uint8_t low = q[(b * 16 + c) * K + 4 * s + j], high = q[(b * 16 + 8 + c) * K + 4 * s + j];
            out[(b * (K / 4) + s) * 32 + 4 * c + j] = static_cast<uint8_t>(low | (high << 4));
          }
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t c = 0; c < 16; ++c) {
          dm[(b * groups + g) * 32 + c] = c10::Half(d[(b * 16 + c) * groups + g]);
          dm[(b * groups + g) * 32 + 16 + c] = c10::Half(m[(b * 16 + c) * groups + g]);
        }
    }
  });
}

void w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_mins, const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && out.device().is_cpu(), "w4a8_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && out.dim() == 2 && out.is_contiguous(),
              "w4a8_linear: contiguous x [M, K] and out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "w4a8_linear: float32 or bfloat16 x");
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16, "w4a8_linear: float32 or bfloat16 out");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(2) == 32 && packed.is_contiguous(),
              "w4a8_linear: packed [N / 16, K / 4, 32] uint8 from w4a8_pack_weight");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 16, groups = K / w4a8::kGroup;
  TORCH_CHECK(packed.size(1) * 4 == K && out.size(0) == M && out.size(1) == N, "w4a8_linear: shapes differ");
  TORCH_CHECK(M >= 1 && K % w4a8::kGroup == 0, "w4a8_linear: at least one row; K a multiple of 32");
  TORCH_CHECK(scales_mins.scalar_type() == at::kHalf && scales_mins.is_contiguous() &&
                  scales_mins.numel() == N / 16 * groups * 32,
              "w4a8_linear: float16 scales_mins [N / 16, K / 32, 32] from w4a8_pack_weight");
#ifdef LLMSERVE_AVX2
  const at::Tensor codes = at::empty({M, K}, x.options().dtype(at::kByte));
  const at::Tensor row_scales = at::empty({M, groups}, x.options().dtype(at::kFloat));
  llmserve::quantize_rows_u8(x, codes, row_scales, 127);
  std::unique_ptr<int8_t[]> rows(new int8_t[static_cast<size_t>(M * K)]);
  std::unique_ptr<int32_t[]> row_sums(new int32_t[static_cast<size_t>(M * groups)]);
  llmserve::signed_row_codes(codes.data_ptr<uint8_t>(), M, K, rows.get(), row_sums.get(), 1);
#ifdef LLMSERVE_W4A8_VNNI
  w4a8::vnni_linear(
#else
  w4a8::linear(
#endif
      rows.get(), M, K, packed.data_ptr<uint8_t>(), scales_mins.data_ptr<c10::Half>(), N, row_scales.data_ptr<float>(),
      row_sums.get(), out.data_ptr(), out.scalar_type() == at::kBFloat16);
#else
  TORCH_CHECK(false, "w4a8_linear needs AVX2 (this build has none)");
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("w4a8_linear(Tensor x, Tensor packed, Tensor scales_mins, Tensor(a!) out) -> ()");
  m.def("w4a8_pack_weight(Tensor codes, Tensor scales, Tensor mins, Tensor(a!) packed, Tensor(b!) scales_mins) -> ()");
  m.def("w4a8_linear_supported() -> bool", &llmserve::w4a8_linear_supported);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("w4a8_linear", &llmserve::w4a8_linear);
  m.impl("w4a8_pack_weight", &llmserve::w4a8_pack_weight);
}
