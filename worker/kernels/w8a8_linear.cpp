// y = x @ W.T with int8 weights and int8 activations (WORKER_QUANTIZATION=w8a8), for the rows of a decode
// batch: quantize, multiply and rescale in one call.
//
// Each row is quantized with one scale per group of 64 columns (fused_ops.cpp's quantize_rows_u8; 32 on AVX2,
// below), as llama.cpp's q8 activations are per 32: one scale per row cost the bundled model 1.45% of
// perplexity, the 64-column groups a few tenths (docs/STUDY_LOG.md). A group's sums are exact int32 on the
// CPU's integer dot products, scaled into float32 and added up group by group; the total is scaled once more
// per channel and rounded into out:
//
//     y[m, n] = s_w[n] * sum_g s_x[m, g] ((sum_{k in g} u[m, k] c[n, k]) - 128 sum_{k in g} c[n, k])
//
// with u = q_x + 128 the unsigned row codes (what the u8 x s8 instruction takes) and c the weight codes; each
// group's sums get the `compensation` [K / 64, N], -128 sum_{k in g} c[n, k], made once at load (on AVX2,
// below, the weights carry the offset instead and the compensation is made from the rows at each call). The
// weights are laid out once (w8a8_pack_weight): per block of 16 output channels, per group of 4 input columns,
// the 16 channels' 4 codes side by side (64 bytes: one 512-bit register for VPDPBUSD, two 256-bit ones on
// AVX2).
//
// The products run on AVX512-VNNI (VPDPBUSD): 4 rows x 64 channels of int32 sums in registers, one group of
// columns at a time, its 4 KB of codes read from memory once and from L1 for the further row chunks. CPUs
// with AMX have VNNI too; an AMX-INT8 tile path was here until 2026-12-06 and was removed once this one was
// faster at every row count (docs/STUDY_LOG.md): every group of 64 columns needs its own scale, so the tiles
// had to be stored and read back after each tile product.
//
// On AVX2 without VNNI the products run on VPMADDUBSW (32 u8 x s8 products summed in pairs into 16 bits) and
// VPMADDWD (the pairs of pairs into 32 bits): on a Zen 3 core 2.0 such pairs of instructions per ns, 66 G
// products/s against FMA's 47 G in float32. The pairs must not saturate 16 bits, and 255 x 127 x 2 would, so
// the rows' codes there are 7-bit (kAvx2MaxCode) and signed, against the weight codes made unsigned in a
// register; their scales are per 32 columns (kAvx2RowGroup) to win back most of what the lost bit costs; tiles
// of 5 rows x 16 channels run over every group of the row (avx2_tile).
//
// Layouts: x [M, K] float32 or bfloat16, contiguous; packed [N / 16, K / 4, 64] int8; weight_scales [N] float32;
// compensation [K / 64, N] int32 (the AVX2 kernel makes its own from the rows); out [M, N] float32 or bfloat16,
// written. K a multiple of 64, N of 32.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <cstdint>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace {

using BF16 = c10::BFloat16;

#if defined(LLMSERVE_AVX512) && defined(__AVX512VNNI__)
#define LLMSERVE_W8A8_VNNI 1
#elif defined(LLMSERVE_AVX2)
#define LLMSERVE_W8A8_AVX2 1
#endif

constexpr int64_t kGroup = 64;  // columns per activation scale: 16 VPDPBUSD steps

#ifdef LLMSERVE_W8A8_VNNI
// How a group's sums become float32 and where the totals of a row and 16 channels go.
struct Epilogue {
  const float* weight_scales;   // [N]
  const int32_t* compensation;  // [groups, N]
  const float* group_scales;    // [M, groups]
  int64_t groups;
  void* out;
  bool bf16;
  int64_t N;

  // Group g's int32 sums of rows [m0, m0 + R), channels [n0, n0 + 16): plus the compensation (then exact),
  // scaled by the row's scale for the group and added to the row's running total in partial (row r at
  // partial + 64 r; set at g = 0); at the last group the total, times the weight scales, goes to out
  // instead. Inlined, with every field read into a local first: the vector stores may alias anything, and
  // rereading the fields after each of them (as the compiler otherwise must) cost a fifth of a pass.
  template <int R>
  __attribute__((always_inline)) void accumulate(const __m512i (&sums)[R], int64_t m0, int64_t g, int64_t n0,
                                                 float* partial) const {
    const __m512i start = _mm512_loadu_si512(compensation + g * N + n0);
    const float* scales = group_scales + m0 * groups + g;
    const int64_t row_scales = groups;
    __m512 totals[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[r], start));
      const __m512 scale = _mm512_set1_ps(scales[r * row_scales]);
      totals[r] = g == 0 ? _mm512_mul_ps(v, scale) : _mm512_fmadd_ps(v, scale, _mm512_load_ps(partial + 64 * r));
    }
    if (g < groups - 1) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) _mm512_store_ps(partial + 64 * r, totals[r]);
      return;
    }
    const __m512 w = _mm512_loadu_ps(weight_scales + n0);
    const int64_t n = N;
    if (bf16) {
      BF16* y = static_cast<BF16*>(out) + m0 * n + n0;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) llmserve::store16(y + r * n, _mm512_mul_ps(totals[r], w));
    } else {
      float* y = static_cast<float*>(out) + m0 * n + n0;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) llmserve::store16(y + r * n, _mm512_mul_ps(totals[r], w));
    }
  }
};

constexpr int kMaxRows = 4;    // rows of sums in registers: 4 x 4 accumulators + 4 weights + a broadcast
constexpr int kMaxBlocks = 4;  // channel blocks of 16 per pass (64 channels): 4 KB of codes a group
// The codes of the group this many groups on are prefetched into L1 while the row chunks of this one run,
// a share of its lines before each chunk: all of them before the first chunk left the weights' reads
// unhidden behind the products (32 rows 15.1 -> 14.0 ms, bench/w8a8_kernels.py; 1, 2 and 4 groups ahead alike).
constexpr int64_t kAhead = 2;

// Rows [m0, m0 + R) of the codes against channel blocks [b, b + B), columns of group g; partial: [rows, 64]
// float32, the running totals of these 64 channels, 64-byte aligned.
template <int R, int B>
void vnni_tile(const uint8_t* codes, int64_t K, const int8_t* packed, int64_t b, int64_t m0, int64_t g,
               float* partial, const Epilogue& epilogue) {
  // The group's 16 steps unrolled, each multiply-add in place on its accumulator (inline asm, "+v"): with the
  // intrinsic in a loop GCC 12 copied every accumulator between registers each step and spilled two of them.
  __m512i acc[R][B];
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][j] = _mm512_setzero_si512();
  const int8_t* w = packed + b * 16 * K;  // block b + j starts 16 K bytes after block b + j - 1
  const uint8_t* x = codes + m0 * K;
#pragma GCC unroll 16
  for (int step = 0; step < kGroup / 4; ++step) {
    const int64_t k = g * kGroup + 4 * step;
    __m512i wj[B];
#pragma GCC unroll 4
    for (int j = 0; j < B; ++j) wj[j] = _mm512_loadu_si512(w + j * 16 * K + k * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i xr = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + r * K + k));
#pragma GCC unroll 4
      for (int j = 0; j < B; ++j) asm("vpdpbusd %2, %1, %0" : "+v"(acc[r][j]) : "v"(xr), "v"(wj[j]));
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j) {
    __m512i sums[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) sums[r] = acc[r][j];
    epilogue.accumulate<R>(sums, m0, g, (b + j) * 16, partial + m0 * 64 + j * 16);
  }
}

// Channel blocks [b, b + B) (of `blocks` in all) against every row: group by group, every row chunk of 4 passing
// over the group's codes while they are in L1.
template <int B>
void vnni_rows(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t b, int64_t blocks,
               float* partial, const Epilogue& e) {
  const int64_t groups = K / kGroup, chunks = (M + kMaxRows - 1) / kMaxRows;
  for (int64_t g = 0; g < groups; ++g) {
    // the group kAhead groups on (or of the next channel blocks), B KB, its lines spread over the row chunks
    const int64_t ahead = g + kAhead;
    const int8_t* next = ahead < groups ? packed + b * 16 * K + ahead * kGroup * 16
                         : b + B < blocks ? packed + (b + B) * 16 * K + (ahead - groups) * kGroup * 16 : nullptr;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t m0 = c * kMaxRows;
      if (next != nullptr) {
        for (int64_t line = c * 16 * B / chunks; line < (c + 1) * 16 * B / chunks; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(next + (line / 16) * 16 * K + (line % 16) * 64), _MM_HINT_T0);
      }
      switch (std::min<int64_t>(kMaxRows, M - m0)) {
        case 1: vnni_tile<1, B>(codes, K, packed, b, m0, g, partial, e); break;
        case 2: vnni_tile<2, B>(codes, K, packed, b, m0, g, partial, e); break;
        case 3: vnni_tile<3, B>(codes, K, packed, b, m0, g, partial, e); break;
        default: vnni_tile<4, B>(codes, K, packed, b, m0, g, partial, e); break;
      }
    }
  }
}

void vnni_linear(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t N, const Epilogue& e) {
  at::parallel_for(0, N / 16, kMaxBlocks, [&](int64_t begin, int64_t end) {
    // every row's running totals for 64 channels, between groups; 64-byte aligned, so that no total's load or
    // store straddles two cache lines
    thread_local std::vector<float> partial;
    if (partial.size() < static_cast<size_t>(M * 64 + 16)) partial.resize(static_cast<size_t>(M * 64 + 16));
    float* aligned = partial.data() + ((64 - reinterpret_cast<uintptr_t>(partial.data()) % 64) % 64) / 4;
    for (int64_t b = begin; b < end; b += kMaxBlocks) {
      switch (std::min<int64_t>(kMaxBlocks, end - b)) {
        case 1: vnni_rows<1>(codes, M, K, packed, b, N / 16, aligned, e); break;
        case 2: vnni_rows<2>(codes, M, K, packed, b, N / 16, aligned, e); break;
        case 3: vnni_rows<3>(codes, M, K, packed, b, N / 16, aligned, e); break;
        default: vnni_rows<4>(codes, M, K, packed, b, N / 16, aligned, e); break;
      }
    }
  });
}
#endif

#ifdef LLMSERVE_W8A8_AVX2
// The rows' codes on AVX2 are 7-bit, |q| <= 63 (quantize_rows_u8's max_code), and signed; the weight codes go in
// as c + 128 (a register's top bits flipped), VPMADDUBSW's unsigned operand. A pair is then at most
// 2 x 255 x 63 = 32130 and fits its 16 bits, and every one is widened by one VPMADDWD; the 128 sum_k q the
// offset adds is taken off by starting each group's sums at -128 times the row's code sum over the group,
// made from the rows at each call, so no compensation is read beside the weights (a one-row step reads
// little else). Measured on an AVX2 EPYC (2 threads, 2026-12-06, docs/STUDY_LOG.md): against signed
// magnitudes (|q| times the weight code given q's sign by VPSIGNB, as llama.cpp's AVX2 dot products do, two
// steps' pairs added before one VPMADDWD: 7 vector instructions and two broadcasts per row and 64 products
// against 6 and one) 1.34x the products per second at 64 rows and 1.42x at 512, level at 1-2 rows; against
// q + 64 rows with a compensation read per weight group, 1.04-1.06x at 1-2 rows, 1.1x at 16-32, level from 64.
constexpr int64_t kAvx2MaxCode = 63;
// Columns per row scale on AVX2: 32, half of kGroup. The 7th bit cost the bundled model ~0.85% of perplexity
// with scales per 64 columns and ~0.55% per 32, against 8-bit rows (float32 HF model, smoothed, the tune
// text; docs/STUDY_LOG.md), for one more scaling of the tile's sums per 32 columns.
constexpr int64_t kAvx2RowGroup = 32;
// Rows per tile: 5 rows x 2 halves of 8 channels = 10 accumulators, 2 weight registers, the row's broadcast
// and 2 products (4 and 6 rows were slower at 8, 64 and 512 rows; 3 slower still).
constexpr int kAvx2Rows = 5;

// Rows [m0, m0 + R) against channel block b (16 channels, two registers of 8), every group of columns: per
// group of kAvx2RowGroup the int32 sums (started at the row's compensation, so exact), scaled by the rows'
// group scales into float32 totals; then the totals times the weight scales go to out. rows: the signed codes
// q, K bytes a row; row_compensation [M, K / kAvx2RowGroup].
template <int R>
void avx2_tile(const uint8_t* rows, int64_t K, const int8_t* block, int64_t m0, const float* group_scales,
               const int32_t* row_compensation, const float* weight_scales, int64_t n0, void* out, bool bf16,
               int64_t N) {
  alignas(32) static const int16_t ones[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));  // c + 128: the unsigned operand
  const int64_t groups = K / kAvx2RowGroup;
  __m256 totals[R][2];
  for (int64_t g = 0; g < groups; ++g) {
    __m256i acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_set1_epi32(row_compensation[(m0 + r) * groups + g]);
    const int8_t* w = block + g * kAvx2RowGroup * 16;  // the group's 16 x 32 codes, 4 columns x 16 channels a step
    const uint8_t* x = rows + m0 * K + g * kAvx2RowGroup;
#pragma GCC unroll 8
    for (int step = 0; step < kAvx2RowGroup / 4; ++step) {
      const auto* wv = reinterpret_cast<const __m256i*>(w + step * 64);
      const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(wv), top);
      const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(wv + 1), top);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i xr = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x + K * r + 4 * step));
        // In place on the accumulators (inline asm, "+x"), as vnni_tile does: with the intrinsics GCC 12 kept
        // the accumulators on the stack, storing and loading each one every step (2.5x slower).
        __m256i t, u;
        asm("vpmaddubsw %[x], %[w0], %[t]\n\t"
            "vpmaddubsw %[x], %[w1], %[u]\n\t"
            "vpmaddwd %[one], %[t], %[t]\n\t"
            "vpmaddwd %[one], %[u], %[u]\n\t"
            "vpaddd %[t], %[a0], %[a0]\n\t"
            "vpaddd %[u], %[a1], %[a1]"
            : [a0] "+x"(acc[r][0]), [a1] "+x"(acc[r][1]), [t] "=&x"(t), [u] "=&x"(u)
            : [x] "x"(xr), [w0] "x"(w0), [w1] "x"(w1), [one] "m"(ones));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 scale = _mm256_set1_ps(group_scales[(m0 + r) * groups + g]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 v = _mm256_cvtepi32_ps(acc[r][h]);
        totals[r][h] = g == 0 ? _mm256_mul_ps(v, scale) : _mm256_fmadd_ps(v, scale, totals[r][h]);
      }
    }
  }
  const __m256 s0 = _mm256_loadu_ps(weight_scales + n0), s1 = _mm256_loadu_ps(weight_scales + n0 + 8);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t at = (m0 + r) * N + n0;
    const __m256 y0 = _mm256_mul_ps(totals[r][0], s0), y1 = _mm256_mul_ps(totals[r][1], s1);
    if (bf16) {
      llmserve::store8(static_cast<BF16*>(out) + at, y0);
      llmserve::store8(static_cast<BF16*>(out) + at + 8, y1);
    } else {
      llmserve::store8(static_cast<float*>(out) + at, y0);
      llmserve::store8(static_cast<float*>(out) + at + 8, y1);
    }
  }
}

// The rows' codes q + 128 (quantize_rows_u8's) made signed, and -128 times each group's code sum, then each
// thread's channel blocks against every row tile, a block's codes (16 K bytes) staying in L1 across the tiles.
void avx2_linear(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t N,
                 const float* group_scales, const int32_t* /* VNNI's compensation */, const float* weight_scales,
                 void* out, bool bf16) {
  static_assert(kAvx2RowGroup == 32, "signed_row_codes sums groups of 32");
  std::unique_ptr<int8_t[]> rows(new int8_t[static_cast<size_t>(M * K)]);
  std::unique_ptr<int32_t[]> row_compensation(new int32_t[static_cast<size_t>(M * (K / kAvx2RowGroup))]);
  llmserve::signed_row_codes(codes, M, K, rows.get(), row_compensation.get(), -128);
  const uint8_t* x = reinterpret_cast<const uint8_t*>(rows.get());
  const int32_t* compensation = row_compensation.get();
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int8_t* block = packed + b * 16 * K;
      const int64_t n0 = b * 16;
      for (int64_t m0 = 0; m0 < M; m0 += kAvx2Rows) {
        switch (std::min<int64_t>(kAvx2Rows, M - m0)) {
          case 1: avx2_tile<1>(x, K, block, m0, group_scales, compensation, weight_scales, n0, out, bf16, N); break;
          case 2: avx2_tile<2>(x, K, block, m0, group_scales, compensation, weight_scales, n0, out, bf16, N); break;
          case 3: avx2_tile<3>(x, K, block, m0, group_scales, compensation, weight_scales, n0, out, bf16, N); break;
          case 4: avx2_tile<4>(x, K, block, m0, group_scales, compensation, weight_scales, n0, out, bf16, N); break;
          default: avx2_tile<5>(x, K, block, m0, group_scales, compensation, weight_scales, n0, out, bf16, N); break;
        }
      }
    }
  });
}
#endif

}  // namespace

namespace llmserve {

bool w8a8_linear_supported() {
#if defined(LLMSERVE_W8A8_VNNI) || defined(LLMSERVE_W8A8_AVX2)
  return true;
#else
  return false;
#endif
}

int64_t w8a8_row_max_code() {
#ifdef LLMSERVE_W8A8_AVX2
  return kAvx2MaxCode;
#else
  return 127;
#endif
}

int64_t w8a8_row_group() {
#ifdef LLMSERVE_W8A8_AVX2
  return kAvx2RowGroup;
#else
  return kGroup;
#endif
}

void w8a8_pack_weight(const at::Tensor& codes, const at::Tensor& packed, const at::Tensor& compensation) {
  TORCH_CHECK(codes.device().is_cpu() && codes.scalar_type() == at::kChar && codes.dim() == 2 && codes.is_contiguous(),
              "w8a8_pack_weight: codes must be a contiguous int8 [N, K] CPU tensor");
  const int64_t N = codes.size(0), K = codes.size(1);
  TORCH_CHECK(K % kGroup == 0 && N % 32 == 0, "w8a8_pack_weight: K must be a multiple of 64 and N of 32");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.numel() == N * K,
              "w8a8_pack_weight: packed must be a contiguous int8 tensor of N * K elements");
  TORCH_CHECK(compensation.scalar_type() == at::kInt && compensation.is_contiguous() &&
                  compensation.numel() == K / kGroup * N,
              "w8a8_pack_weight: compensation must be a contiguous int32 tensor of K / 64 x N elements");
  const auto* src = reinterpret_cast<const uint32_t*>(codes.data_ptr());  // groups of 4 codes
  auto* dst = reinterpret_cast<uint32_t*>(packed.data_ptr());
  const int8_t* c = codes.data_ptr<int8_t>();
  int32_t* comp = compensation.data_ptr<int32_t>();
  const int64_t quads = K / 4;
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t q = 0; q < quads; ++q)
        for (int64_t ch = 0; ch < 16; ++ch) dst[(b * quads + q) * 16 + ch] = src[(b * 16 + ch) * quads + q];
      for (int64_t n = b * 16; n < b * 16 + 16; ++n)
        for (int64_t g = 0; g < K / kGroup; ++g) {
          int32_t sum = 0;
          for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) sum += c[n * K + k];
          comp[g * N + n] = -128 * sum;
        }
    }
  });
}

void w8a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_scales,
                 const at::Tensor& compensation, const at::Tensor& out) {
  TORCH_CHECK(w8a8_linear_supported(), "w8a8_linear: this build or CPU has neither AVX512-VNNI nor AVX2");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && out.device().is_cpu(), "w8a8_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && out.dim() == 2 && out.is_contiguous(),
              "w8a8_linear: contiguous x [M, K] and out [M, N]");
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "w8a8_linear: float32 or bfloat16 out");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.size(2) == 64 && packed.is_contiguous(),
              "w8a8_linear: packed [N / 16, K / 4, 64] int8 from w8a8_pack_weight");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 16;
  TORCH_CHECK(packed.size(1) * 4 == K && out.size(0) == M && out.size(1) == N, "w8a8_linear: shapes differ");
  TORCH_CHECK(M >= 1 && K % 64 == 0 && N % 32 == 0, "w8a8_linear: at least one row; K a multiple of 64, N of 32");
  TORCH_CHECK(weight_scales.scalar_type() == at::kFloat && weight_scales.is_contiguous() && weight_scales.numel() == N,
              "w8a8_linear: one float32 weight scale per output channel");
  TORCH_CHECK(compensation.scalar_type() == at::kInt && compensation.is_contiguous() &&
                  compensation.numel() == K / kGroup * N,
              "w8a8_linear: int32 compensation [K / 64, N] from w8a8_pack_weight");
#ifdef LLMSERVE_W8A8_VNNI
  const at::Tensor codes = at::empty({M, K}, x.options().dtype(at::kByte));
  const at::Tensor group_scales = at::empty({M, K / kGroup}, x.options().dtype(at::kFloat));
  llmserve::quantize_rows_u8(x, codes, group_scales);
  const Epilogue epilogue{weight_scales.data_ptr<float>(), compensation.data_ptr<int32_t>(),
                          group_scales.data_ptr<float>(), K / kGroup, out.data_ptr(),
                          out.scalar_type() == at::kBFloat16, N};
  vnni_linear(codes.data_ptr<uint8_t>(), M, K, packed.data_ptr<int8_t>(), N, epilogue);
#elif defined(LLMSERVE_W8A8_AVX2)
  const at::Tensor codes = at::empty({M, K}, x.options().dtype(at::kByte));
  const at::Tensor group_scales = at::empty({M, K / kAvx2RowGroup}, x.options().dtype(at::kFloat));
  llmserve::quantize_rows_u8(x, codes, group_scales, kAvx2MaxCode);
  avx2_linear(codes.data_ptr<uint8_t>(), M, K, packed.data_ptr<int8_t>(), N, group_scales.data_ptr<float>(),
              compensation.data_ptr<int32_t>(), weight_scales.data_ptr<float>(), out.data_ptr(),
              out.scalar_type() == at::kBFloat16);
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("w8a8_linear(Tensor x, Tensor packed, Tensor weight_scales, Tensor compensation, Tensor(a!) out) -> ()");
  m.def("w8a8_pack_weight(Tensor codes, Tensor(a!) packed, Tensor(b!) compensation) -> ()");
  m.def("w8a8_linear_supported() -> bool", &llmserve::w8a8_linear_supported);
  m.def("w8a8_row_max_code() -> int", &llmserve::w8a8_row_max_code);
  m.def("w8a8_row_group() -> int", &llmserve::w8a8_row_group);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("w8a8_linear", &llmserve::w8a8_linear);
  m.impl("w8a8_pack_weight", &llmserve::w8a8_pack_weight);
}
