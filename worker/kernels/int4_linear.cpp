// y = x @ W.T for 4-bit weights in groups of 32 input features, each group with a float16 scale d and
// min m: w = d * q + m, q in 0..15. That is llama.cpp's Q4_1 block exactly (its d and m as they are in the
// file), and Q4_0 (w = d * (q - 8)) with m = -8 d (exact in float16 too: a power-of-two multiple).
//
// torch's `_weight_int4pack_mm_for_cpu` is vectorized on this kind of CPU only for bfloat16 rows, so a
// float32 model paid two conversions per layer and bfloat16 products. Here each group's 16 bytes are
// widened once (one zero-extending load), its nibbles split with shifts and masks, converted to float32
// and turned into weights with one FMA per eight (d q + m, rounded once), then multiplied into a tile of
// activation rows while they are in registers, the way the int8 kernel (int8_linear.cpp) does it.
// Activations and sums are float32.
//
// On a CPU with AVX512-BF16 (where -march=native says so) the products run on bfloat16 dot-product
// instructions instead: the activations are rounded to bfloat16 once per call (a weight's code q, 0..15, is
// exact in bfloat16), each group's 32 codes are split out of its 16 bytes with one variable shift and turned
// into bfloat16 with one table permute, and one VDPBF16PS multiplies all 32 into float32 sums, which the
// group's scale d then scales; the min's share, m * (sum of the group's rounded x), is added per group from
// sums taken once per call. Sums stay float32; only x is rounded (what a bfloat16 model's x already is).
// On an AMD EPYC (Zen 4), this model's 120 int4 linears of one decode step, interleaved A/B against the
// float32 path: one thread 8.5 -> 6.8 ms at one row, 122 -> 101 ms at 32 rows; two threads 4.6-4.9 -> 3.6-4.2
// ms at one row. Still bound by the per-weight work (a shift, a permute, half a dot product), not by memory
// (~18 GB/s of codes at one row on two threads, where the int8 kernel streams ~29 GB/s).
// `int4_activation_dtype` says which path this build took. From `panel_min_rows` rows (10) such a build runs
// bf16_panel_gemm.h instead, over the weights d q + m rounded to bfloat16 (one FMA, then one rounding).
//
// One row (a single decode stream), where the CPU also has AVX512-VNNI, runs integer products instead
// (`grid_row`, `one_row_channels`): the same bfloat16 x on a 16-bit grid per group, exact int32 sums of q x,
// scaled in float32; four weight rows at a time, their codes prefetched 8 KB ahead. On the AMX Xeon (2 cores,
// VDPBF16PS issuing every ~2 cycles there), this model's 120 int4 linears of a one-stream decode step (30
// layers of distinct weights from memory, called from C++, interleaved A/B) 3.7-5.7 -> 1.8-2.0 ms (reading the
// same bytes alone: ~1.45 ms); its whole decode step 10.7-11.2 -> 8.2-8.3 ms (median; decode_layers 7.7 -> 4.9).
//
// Batches of five rows or more on a build without AVX512-BF16 (AVX2, AVX-512 without it) run a float32 panel
// instead (`dequantized_panel`): each weight formed once per call, not once per four rows.
//
// Scales and mins are float16, as in a GGUF file: a single stream reads every weight byte once per token, so
// 20 bytes per group instead of 24 is a sixth less to read.
//
// Layouts: x [M, K] float32, contiguous; packed [N, K / 2] uint8; scales, mins [N, K / 32] float16; out
// [M, N] float32, written. K is a multiple of 32. Within a row, group g is the 16 bytes at 16 g, read as
// eight little-endian 16-bit words: word j holds weights 32 g + j, + 8, + 16, + 24 in its nibbles from the
// lowest up (services/quant.py `pack_int4` writes it), so the four shifts of one word give four vectors of
// eight consecutive weights with no shuffles. Work is split over output channels on torch's intra-op
// threads.
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bf16_panel_gemm.h"
#include "blocking.h"
#include "ops.h"
#include "vec.h"

namespace {

using Half = c10::Half;

// float16 to float32 (F16C's one instruction where the CPU has it).
inline float widen(Half h) {
#ifdef __F16C__
  return _cvtsh_ss(h.x);
#else
  return static_cast<float>(h);
#endif
}

constexpr int64_t kGroup = 32;         // weights per (scale, min) pair
constexpr int64_t kGroupBytes = 16;    // their packed codes
constexpr int64_t kRowTile = 4;        // activation rows sharing one pass over a weight row (8: slower)
constexpr int64_t kRowChunk = 16;      // x rows kept in cache while weight blocks pass (16 x 1536 floats)
constexpr int64_t kChannelBlock = 32;  // weight rows (at most 32 x (768 + 384) bytes here) kept in L1/L2
// How far ahead of the codes being read the multi-row paths prefetch them, on the first row tile over a
// block (the one that reads it from memory): without it 2-8 rows took 4-12x one row's time over a model's
// linears (docs/STUDY_LOG.md).
constexpr int64_t kRowsPrefetchBytes = 8192;

#ifdef LLMSERVE_AVX2
// The 32 weights of one group as four float32 vectors (weights 0-7, 8-15, 16-23, 24-31): d q + m.
inline void dequantize_group(const uint8_t* w, float d, float m, __m256 (&out)[4]) {
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
  out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(words, mask)), dv, mv);
  out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 4), mask)), dv, mv);
  out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 8), mask)), dv, mv);
  out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words, 12)), dv, mv);  // top nibble: no mask
}
#endif

// Rows [0, R) of x (row stride K) against one weight row; writes out[r * ldo] for each row. U groups are
// unpacked per step and A accumulators kept per row, so that one or two rows still have enough independent
// FMA chains in flight and four rows fit the sixteen vector registers.
template <int R, int A, int U>
void dot_rows(const float* x, int64_t K, const uint8_t* w, const Half* scales, const Half* mins, float* out,
              int64_t ldo, bool prefetch) {
  const int64_t groups = K / kGroup;
#ifdef LLMSERVE_AVX2
  __m256 acc[R][A];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + U <= groups; g += U) {  // the inner block: U groups
    if (prefetch && g % 4 == 0)  // one line of codes per four groups
      _mm_prefetch(reinterpret_cast<const char*>(w + g * kGroupBytes + kRowsPrefetchBytes), _MM_HINT_T0);
    __m256 wv[U][4];
    for (int u = 0; u < U; ++u) dequantize_group(w + (g + u) * kGroupBytes, widen(scales[g + u]), widen(mins[g + u]), wv[u]);
    const float* xg = x + g * kGroup;
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u)
        for (int v = 0; v < 4; ++v) {
          const int a = (4 * u + v) % A;
          acc[r][a] = _mm256_fmadd_ps(wv[u][v], _mm256_loadu_ps(xg + r * K + kGroup * u + 8 * v), acc[r][a]);
        }
  }
  for (; g < groups; ++g) {  // groups left over from the inner block
    __m256 wv[4];
    dequantize_group(w + g * kGroupBytes, widen(scales[g]), widen(mins[g]), wv);
    const float* xg = x + g * kGroup;
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v)
        acc[r][v % A] = _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xg + r * K + 8 * v), acc[r][v % A]);
  }
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[r][0];
    for (int a = 1; a < A; ++a) total = _mm256_add_ps(total, acc[r][a]);
    out[r * ldo] = llmserve::hsum(total);
  }
#else
  float sums[R] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = w + g * kGroupBytes;
    for (int64_t i = 0; i < kGroup; ++i) {  // weight i = 8 t + j: word j, nibble t
      const int64_t j = i % 8, t = i / 8;
      const int q = (b[2 * j + t / 2] >> (4 * (t % 2))) & 0x0F;
      const float wi = widen(scales[g]) * static_cast<float>(q) + widen(mins[g]);
      for (int r = 0; r < R; ++r) sums[r] += wi * x[r * K + g * kGroup + i];
    }
  }
  for (int r = 0; r < R; ++r) out[r * ldo] = sums[r];
#endif
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LLMSERVE_INT4_BF16 1
// The 32 codes of one group as bfloat16, in weight order: the group's eight words are repeated in the four
// 128-bit lanes, lane block t shifted right by 4 t (word j's nibble t is weight 8 t + j), and the low five bits
// of each word index a table whose entry i is bfloat16(i mod 16), so no mask is needed.
inline __m512bh group_codes(const uint8_t* w, __m512i shifts, __m512i table) {
  const __m512i words = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_srlv_epi16(words, shifts), table));
}

inline __m512i nibble_shifts() {
  return _mm512_set_epi16(12, 12, 12, 12, 12, 12, 12, 12, 8, 8, 8, 8, 8, 8, 8, 8,
                          4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
}

inline __m512i code_table() {  // bfloat16(i mod 16) for i in 0..31: 0 is 0x0000, q >= 1 is float(q)'s top half
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float f = static_cast<float>(i % 16);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    t[i] = static_cast<uint16_t>(bits >> 16);  // exact: a small integer needs no rounding
  }
  return _mm512_load_si512(t);
}

// Rows [0, R) of the bfloat16 x (row stride K) against one weight row; min_terms[r] is the row's
// sum over groups of m * (sum of x in the group), added at the end. A accumulators per row keep the
// scale FMAs independent.
template <int R, int A>
void dot_rows_bf16(const c10::BFloat16* x, int64_t K, const uint8_t* w, const Half* scales, const float* min_terms,
                   float* out, int64_t ldo, __m512i shifts, __m512i table, bool prefetch) {
  const int64_t groups = K / kGroup;
  __m512 acc[R][A];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < A; ++a) acc[r][a] = _mm512_setzero_ps();
  const auto step = [&](int64_t g, int a) {
    if (prefetch && g % 4 == 0)  // one line of codes per four groups
      _mm_prefetch(reinterpret_cast<const char*>(w + g * kGroupBytes + kRowsPrefetchBytes), _MM_HINT_T0);
    const __m512bh q = group_codes(w + g * kGroupBytes, shifts, table);
    const __m512 d = _mm512_set1_ps(widen(scales[g]));
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * K + g * kGroup));
      acc[r][a] = _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), q, xv), d, acc[r][a]);
    }
  };
  int64_t g = 0;
  for (; g + A <= groups; g += A)  // accumulator a is known at compile time, so all stay in registers
    for (int a = 0; a < A; ++a) step(g + a, a);
  for (; g < groups; ++g) step(g, 0);
  for (int r = 0; r < R; ++r) {
    __m512 total = acc[r][0];
    for (int a = 1; a < A; ++a) total = _mm512_add_ps(total, acc[r][a]);
    out[r * ldo] = _mm512_reduce_add_ps(total) + min_terms[r];
  }
}

// The row's share of the mins for one weight row: sum over groups of m_g * xsum_g.
inline float min_term(const Half* mins, const float* xsum, int64_t groups) {
  __m512 acc = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 16 <= groups; g += 16) {
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + g)));
    acc = _mm512_fmadd_ps(m, _mm512_loadu_ps(xsum + g), acc);
  }
  if (g < groups) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (groups - g)) - 1);
    const __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, mins + g));
    acc = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(tail, xsum + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// x rounded to bfloat16 (nearest even), and per row and group the float32 sum of the rounded values.
void round_rows(const float* x, int64_t M, int64_t K, c10::BFloat16* xb, float* xsum) {
  const int64_t groups = K / kGroup;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + i * K + g * kGroup;
      c10::BFloat16* dst = xb + i * K + g * kGroup;
      const __m256bh lo = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
      const __m256bh hi = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<__m256i>(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16), reinterpret_cast<__m256i>(hi));
      const __m512 wide_lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(lo)), 16));
      const __m512 wide_hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(hi)), 16));
      xsum[i * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(wide_lo, wide_hi));
    }
}

#ifdef __AVX512VNNI__
#define LLMSERVE_INT4_ONE_ROW 1
// One row (a single decode stream) on integer dot products instead: VDPBF16PS issues only every ~2 cycles on
// the AMX Xeon while VPDPBUSD issues twice a cycle, and at one row nothing amortizes the per-weight work (the
// bfloat16 kernel above, four rows at a time and its codes prefetched, still took ~2.6 ms for the 30 layers of
// the header's figure, where this takes ~1.8). x is rounded to bfloat16 as above, then each group is put on
// the 16-bit grid of its largest element, x = step * x16 with step = 2^(e - 14) (2^e <= max |x| < 2^(e + 1)),
// |x16| <= 32640: exact for every element of at least 2^(e - 7), i.e. all but those below ~1/256 of the
// group's largest, which round to the grid (error <= max |x| 2^-15). x16 = 256 hi + lo, hi signed and lo
// unsigned bytes, so two pairs of VPDPBUSD (the codes as one operand's bytes, low and high nibbles apart) give
// the group's sum of q x16 exactly in int32 (< 2^24, so its float is exact too); one FMA per lane then adds it
// times d step in float32. The mins' share, m * (sum of the group's rounded x), is added per group as above.
// x as int8 per group alone (llama.cpp's Q8_1: one pair of VPDPBUSD) was ~15-20% faster still but ~4x
// further from the float32 products.
constexpr int kOneRowChannels = 4;        // weight rows in flight together (x loaded once for all; 2, 8: no better)
constexpr int64_t kPrefetchBytes = 8192;  // how far ahead of the codes being read they are prefetched (4 KB: same)

// Per group, x's four byte planes in the codes' order (a byte's low nibble is weight j or j + 16 of word
// j / 2, its high nibble weight j + 8 or j + 24): hi of the low nibbles' x, hi of the high nibbles', lo of
// the low nibbles', lo of the high nibbles', each [blocks * 4 groups][16] with the groups past K zero.
struct GridRow {
  std::vector<int8_t> planes;
  std::vector<float> step, xsum;  // per group: the grid's step, the sum of the bfloat16-rounded x
  int64_t padded = 0;             // groups, rounded up to the 4 of one 64-byte block of codes
  const int8_t* plane(int p) const { return planes.data() + p * padded * 16; }
};

void grid_row(const float* x, int64_t K, GridRow& out) {
  const int64_t groups = K / kGroup;
  out.padded = (groups + 3) / 4 * 4;
  out.planes.assign(static_cast<size_t>(4 * out.padded * 16), 0);
  out.step.assign(static_cast<size_t>(out.padded), 0.0f);
  out.xsum.assign(static_cast<size_t>(out.padded), 0.0f);
  const __m512i low_order = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i high_order = _mm512_add_epi32(low_order, _mm512_set1_epi32(8));
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  int8_t* planes[4] = {out.planes.data(), out.planes.data() + out.padded * 16, out.planes.data() + 2 * out.padded * 16,
                       out.planes.data() + 3 * out.padded * 16};
  for (int64_t g = 0; g < groups; ++g) {
    __m512 half[2];  // x rounded to bfloat16 and widened back, as round_rows rounds it
    for (int h = 0; h < 2; ++h) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + g * kGroup + 16 * h));
      half[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(b)), 16));
    }
    out.xsum[g] = _mm512_reduce_add_ps(_mm512_add_ps(half[0], half[1]));
    const __m512i bits0 = _mm512_and_si512(_mm512_castps_si512(half[0]), magnitude);
    const __m512i bits1 = _mm512_and_si512(_mm512_castps_si512(half[1]), magnitude);
    const uint32_t top = _mm512_reduce_max_epu32(_mm512_max_epu32(bits0, bits1));  // max |x|'s bits
    float inverse;
    out.step[g] = llmserve::grid_step(top, inverse);
    const __m512 scale = _mm512_set1_ps(inverse);  // exact: a power of two
    const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_permutex2var_ps(half[0], low_order, half[1]), scale));
    const __m512i high = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_permutex2var_ps(half[0], high_order, half[1]), scale));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[0] + g * 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(low, 8)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[1] + g * 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(high, 8)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[2] + g * 16), _mm512_cvtepi32_epi8(low));  // low bytes
    _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[3] + g * 16), _mm512_cvtepi32_epi8(high));
  }
}

// C consecutive weight rows against the gridded row; writes out[0, C). Codes go 64 bytes (4 groups) at a
// time; lane l of a block's int32 sums belongs to its group l / 4, whose d * step a permute of the 16 groups'
// values (widened once per 16 groups) lines up. The codes ahead are prefetched: streamed from memory, two
// threads read ~45 GB/s with it and ~25 without on the AMX Xeon (the hardware prefetcher alone falls behind).
template <int C>
void one_row_channels(const GridRow& xg, int64_t K, const uint8_t* w, const Half* scales, const Half* mins,
                      float* out) {
  const int64_t groups = K / kGroup, row = K / 2;
  const int8_t *hi_low = xg.plane(0), *hi_high = xg.plane(1), *lo_low = xg.plane(2), *lo_high = xg.plane(3);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i lane_group =  // l / 4
      _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2);
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    const __mmask16 mask = g0 + 16 <= groups ? 0xFFFF : static_cast<__mmask16>((1u << (groups - g0)) - 1);
    const __m512 step = _mm512_maskz_loadu_ps(mask, xg.step.data() + g0);
    const __m512 xsum = _mm512_maskz_loadu_ps(mask, xg.xsum.data() + g0);
    __m512 ds[C];
    for (int c = 0; c < C; ++c) {
      ds[c] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, scales + c * groups + g0)), step);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, mins + c * groups + g0)), xsum, acc[c]);
    }
    for (int64_t k = 0; k < 4 && g0 + 4 * k < groups; ++k) {
      const int64_t b = g0 / 4 + k, left = groups - 4 * b;  // groups in this block: 4, or fewer at the end
      const __mmask64 bytes = left >= 4 ? ~0ULL : ~0ULL >> (64 - 16 * left);
      for (int c = 0; c < C; ++c)  // the C lines these rows' codes advance by per block, kPrefetchBytes on
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + (b * C + c) * 64), _MM_HINT_T0);
      const __m512i xhl = _mm512_loadu_si512(hi_low + b * 64), xhh = _mm512_loadu_si512(hi_high + b * 64);
      const __m512i xll = _mm512_loadu_si512(lo_low + b * 64), xlh = _mm512_loadu_si512(lo_high + b * 64);
      const __m512i lanes = _mm512_add_epi32(lane_group, _mm512_set1_epi32(static_cast<int>(4 * k)));
      for (int c = 0; c < C; ++c) {
        const __m512i v = _mm512_maskz_loadu_epi8(bytes, w + c * row + b * 64);
        const __m512i low = _mm512_and_si512(v, nibble), high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        const __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), low, xhl), high, xhh);
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(hi, 8), xll, low), xlh, high);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(lanes, ds[c]), acc[c]);
      }
    }
  }
  if constexpr (C == 4) {
    _mm_storeu_ps(out, llmserve::reduce4(acc[0], acc[1], acc[2], acc[3]));
  } else {
    for (int c = 0; c < C; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
  }
}
#endif
#endif

#if defined(LLMSERVE_AVX2) && defined(__F16C__) && !defined(LLMSERVE_INT4_ONE_ROW)
#define LLMSERVE_INT4_ONE_ROW_AVX2 1
// One row on an AVX2 CPU without AVX512-VNNI: integer products as above, on AVX2's 16-bit multiply-add
// (VPMADDWD: int16 pairs into int32 sums). x is put on the same 16-bit grid per group (from its float32
// values; a |x16| that would round to 32768 is held at 32767). A group's 16 bytes of codes are widened to
// sixteen 16-bit words once; the low nibbles are a mask away, the high ones a shift (a byte's high nibble is
// the whole of its word above bit 4), and each meets its 16 x16 in one multiply-add: no pair can overflow
// (2 x 15 x 32767), and the group's int32 sum of q x16 (< 2^24) is exact in float32: the same integers that
// 8-bit multiply-adds on x16's high and low bytes gave (in other lanes, so the float sums may differ in their
// last bits), in about half the instructions; the one-row int4 linears of a decode step were bound by them,
// not by reading the codes (docs/STUDY_LOG.md). d x step is formed eight groups at a time, before the groups
// are walked.
constexpr int kOneRowChannelsAvx2 = 4;        // weight rows in flight together, x loaded once for all
constexpr int64_t kPrefetchBytesAvx2 = 8192;  // how far ahead of the codes being read they are prefetched
constexpr int64_t kScaleChunk = 64;           // groups whose d x step are formed ahead of their products

// Per group, x16 in the order of the codes' widened words: word b holds byte b's codes, its low nibble weight
// b / 2 (+ 16 for an odd b), its high nibble that + 8; so the group's first 16 values go with the low
// nibbles and the next 16 with the high ones. Also the grid's step and the sum of x (for the mins' share, as
// read), per group.
struct GridRowAvx2 {
  std::vector<int16_t> x16;
  std::vector<float> step, xsum;
};

void grid_row_avx2(const float* x, int64_t K, GridRowAvx2& out) {
  const int64_t groups = K / kGroup;
  out.x16.resize(static_cast<size_t>(K));
  out.step.resize(static_cast<size_t>(groups));
  out.xsum.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * kGroup;
    float inverse;
    out.step[g] = llmserve::grid_step(llmserve::max_magnitude_bits(xg, kGroup), inverse);
    alignas(32) int32_t q[kGroup];
    for (int v = 0; v < 4; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 8 * v),
                         llmserve::on_grid(_mm256_loadu_ps(xg + 8 * v), _mm256_set1_ps(inverse)));
    __m256 sum = _mm256_setzero_ps();
    for (int v = 0; v < 4; ++v) sum = _mm256_add_ps(sum, _mm256_loadu_ps(xg + 8 * v));
    out.xsum[g] = llmserve::hsum(sum);
    int16_t* dst = out.x16.data() + g * kGroup;
    for (int b = 0; b < 16; ++b) {
      const int low = b / 2 + (b % 2) * 16;
      dst[b] = static_cast<int16_t>(q[low]);
      dst[16 + b] = static_cast<int16_t>(q[low + 8]);
    }
  }
}

template <int C>
void one_row_channels_avx2(const GridRowAvx2& xg, int64_t K, const uint8_t* w, const Half* scales, const Half* mins,
                           float* out) {
  const int64_t groups = K / kGroup, row = K / 2;
  const __m256i nibble = _mm256_set1_epi16(0x0F);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  alignas(32) float ds[C][kScaleChunk];  // d x step of the chunk's groups, per row
  for (int64_t g0 = 0; g0 < groups; g0 += kScaleChunk) {
    const int64_t g1 = std::min(groups, g0 + kScaleChunk);
    for (int c = 0; c < C; ++c) {
      int64_t g = g0;
      for (; g + 8 <= g1; g += 8) {
        const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + c * groups + g));
        _mm256_store_ps(ds[c] + (g - g0), _mm256_mul_ps(_mm256_cvtph_ps(d), _mm256_loadu_ps(xg.step.data() + g)));
      }
      for (; g < g1; ++g) ds[c][g - g0] = widen(scales[c * groups + g]) * xg.step[g];
    }
    for (int64_t g = g0; g < g1; ++g) {
      if (g % 4 == 0)  // one 64-byte line of each row's codes per four groups, kPrefetchBytesAvx2 on
        for (int c = 0; c < C; ++c)
          _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytesAvx2 + (g / 4 * C + c) * 64), _MM_HINT_T0);
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg.x16.data() + g * kGroup));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg.x16.data() + g * kGroup + 16));
      for (int c = 0; c < C; ++c) {
        const __m256i words =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * row + g * kGroupBytes)));
        const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(words, nibble), xl),
                                             _mm256_madd_epi16(_mm256_srli_epi16(words, 4), xh));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(ds[c] + (g - g0)), acc[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {  // the mins' share: sum over groups of m * (sum of the group's x)
    __m256 terms = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + c * groups + g)));
      terms = _mm256_fmadd_ps(m, _mm256_loadu_ps(xg.xsum.data() + g), terms);
    }
    float tail = 0.0f;
    for (; g < groups; ++g) tail += widen(mins[c * groups + g]) * xg.xsum[g];
    out[c] = llmserve::hsum(_mm256_add_ps(acc[c], terms)) + tail;
  }
}
#endif

// One weight row [K] as d q + m (T float or bfloat16).
template <typename T>
void dequantize_channel(const uint8_t* w, const Half* scales, const Half* mins, int64_t K, T* out) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const uint8_t* b = w + g * kGroupBytes;
    const float d = widen(scales[g]), m = widen(mins[g]);
    T* o = out + g * kGroup;
#ifdef LLMSERVE_AVX2
    __m256 v[4];
    dequantize_group(b, d, m, v);
    for (int i = 0; i < 4; ++i) llmserve::store8(o + 8 * i, v[i]);
#else
    for (int64_t i = 0; i < kGroup; ++i) {  // weight i = 8 t + j: word j, nibble t
      const int64_t j = i % 8, t = i / 8;
      o[i] = T(d * static_cast<float>((b[2 * j + t / 2] >> (4 * (t % 2))) & 0x0F) + m);
    }
#endif
  }
}

#ifdef LLMSERVE_AVX2
// Batches of several rows without a bfloat16 panel (AVX2 builds): the row-at-a-time path forms each weight
// from its group once per four rows and feeds each FMA an x load of its own (about a load per FMA: bound by
// loads, not by the FMAs). Here a block of kPanelChannels weight rows is formed once per call into a float32
// buffer (kept in L2), and every x row then meets it in tiles of six x rows by two weight rows: twelve sums in
// registers, eight loads per twelve FMAs. This model's 30 layers on two threads of the AVX2 EPYC,
// interleaved against the row-at-a-time path: 1.2x at 16 rows, 1.6-1.7x at 24-64; against oneDNN's float32
// GEMM over weights dequantized for it, 1.1-1.25x at 64-256 rows and level at 512.
constexpr int64_t kPanelChannels = 24;
constexpr int64_t kPanelTileRows = 6;      // 6 x 2 sums, 2 weight vectors and an x vector: 15 registers
constexpr int64_t kPanelTileChannels = 2;  // (4 x 3 left the compiler loading each weight vector 4 times)
constexpr int64_t kPanelMinRows = 5;       // 4 rows are one full tile of the row-at-a-time path, and faster

// Rows [0, R) of x (row stride K) against weight rows [0, C) of w (row stride K): out[r * ldo + c].
template <int R, int C>
void panel_tile(const float* x, int64_t K, const float* w, float* out, int64_t ldo) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {  // K is a multiple of 32
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + c * K + k);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * K + k);
      asm("" : "+x"(xv));  // one load into a register: the compiler would fold it into each FMA, a load apiece
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * ldo + c] = llmserve::hsum(acc[r][c]);
}

template <int R>
void panel_tile_rows(int channels, const float* x, int64_t K, const float* w, float* out, int64_t ldo) {
  if (channels == 1)
    panel_tile<R, 1>(x, K, w, out, ldo);
  else
    panel_tile<R, kPanelTileChannels>(x, K, w, out, ldo);
}

void dequantized_panel(const float* x, int64_t M, int64_t K, int64_t N, const uint8_t* wp, const Half* sp,
                       const Half* mp, float* out) {
  const int64_t groups = K / kGroup;
  at::parallel_for(0, N, kPanelChannels, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panel;
    panel.resize(static_cast<size_t>(kPanelChannels * K));
    for (int64_t n0 = begin; n0 < end; n0 += kPanelChannels) {
      const int64_t count = std::min(kPanelChannels, end - n0);
      for (int64_t c = 0; c < count; ++c)
        dequantize_channel(wp + (n0 + c) * (K / 2), sp + (n0 + c) * groups, mp + (n0 + c) * groups, K,
                           panel.data() + c * K);
      for (int64_t m0 = 0; m0 < M; m0 += kPanelTileRows) {
        const int64_t rows = std::min(kPanelTileRows, M - m0);
        for (int64_t c0 = 0; c0 < count; c0 += kPanelTileChannels) {
          const int channels = static_cast<int>(std::min(kPanelTileChannels, count - c0));
          const float* xr = x + m0 * K;
          const float* w = panel.data() + c0 * K;
          float* o = out + m0 * N + n0 + c0;
          switch (rows) {
            case 1: panel_tile_rows<1>(channels, xr, K, w, o, N); break;
            case 2: panel_tile_rows<2>(channels, xr, K, w, o, N); break;
            case 3: panel_tile_rows<3>(channels, xr, K, w, o, N); break;
            case 4: panel_tile_rows<4>(channels, xr, K, w, o, N); break;
            case 5: panel_tile_rows<5>(channels, xr, K, w, o, N); break;
            default: panel_tile_rows<6>(channels, xr, K, w, o, N); break;
          }
        }
      }
    }
  });
}
#endif

}  // namespace

namespace llmserve {

void int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& mins,
                 const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "int4_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 2 && scales.dim() == 2 && mins.dim() == 2 && out.dim() == 2,
              "int4_linear: x [M, K], packed [N, K / 2], scales and mins [N, K / 32], out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "int4_linear: float32 x and out");
  TORCH_CHECK(packed.scalar_type() == at::kByte, "int4_linear: uint8 packed codes");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf,
              "int4_linear: float16 scales and mins");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  TORCH_CHECK(K % kGroup == 0, "int4_linear: in_features must be a multiple of 32, got ", K);
  TORCH_CHECK(packed.size(1) == K / 2 && scales.size(0) == N && scales.size(1) == K / kGroup &&
                  mins.sizes() == scales.sizes() && out.size(0) == M && out.size(1) == N,
              "int4_linear: shapes differ");
  TORCH_CHECK(x.is_contiguous() && packed.is_contiguous() && scales.is_contiguous() && mins.is_contiguous() &&
                  out.is_contiguous(),
              "int4_linear: contiguous tensors only");
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const Half* sp = scales.data_ptr<Half>();
  const Half* mp = mins.data_ptr<Half>();
  float* op = out.data_ptr<float>();
  const int64_t groups = K / kGroup;
#ifdef LLMSERVE_BF16_PANEL
  if (M >= llmserve::panel_min_rows.load(std::memory_order_relaxed)) {  // the weights d q + m rounded to bfloat16 once per call
    const auto fill = [&](int64_t n0, int64_t count, c10::BFloat16* dst, int64_t ld) {
      for (int64_t c = 0; c < count; ++c) {
        const int64_t n = n0 + c;
        for (int64_t g = 0; g < groups; ++g) {
          __m256 w[4];
          dequantize_group(wp + n * (K / 2) + g * kGroupBytes, widen(sp[n * groups + g]), widen(mp[n * groups + g]), w);
          for (int v = 0; v < 4; ++v)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c * ld + g * kGroup + 8 * v),
                             reinterpret_cast<__m128i>(_mm256_cvtneps_pbh(w[v])));
        }
      }
    };
    llmserve::bf16_panel_gemm(xp, M, K, N, nullptr, fill, op);
    return;
  }
#endif
#ifdef LLMSERVE_INT4_ONE_ROW
  if (M == 1) {
    llmserve::one_row_with_grid<GridRow, kOneRowChannels>(
        xp, K, N, kChannelBlock, grid_row, [&](auto width, const GridRow& xg, int64_t n) {
          one_row_channels<decltype(width)::value>(xg, K, wp + n * (K / 2), sp + n * groups, mp + n * groups, op + n);
        });
    return;
  }
#endif
#ifdef LLMSERVE_INT4_ONE_ROW_AVX2
  if (M == 1) {
    llmserve::one_row_with_grid<GridRowAvx2, kOneRowChannelsAvx2>(
        xp, K, N, kChannelBlock, grid_row_avx2, [&](auto width, const GridRowAvx2& xg, int64_t n) {
          one_row_channels_avx2<decltype(width)::value>(xg, K, wp + n * (K / 2), sp + n * groups, mp + n * groups,
                                                        op + n);
        });
    return;
  }
#endif
#ifdef LLMSERVE_INT4_BF16
  std::vector<c10::BFloat16> xb(static_cast<size_t>(M * K));
  std::vector<float> xsum(static_cast<size_t>(M * groups));
  round_rows(xp, M, K, xb.data(), xsum.data());
  const __m512i shifts = nibble_shifts(), table = code_table();
  llmserve::for_each_tile(M, N, kRowChunk, kChannelBlock, kRowTile,
                          [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    const c10::BFloat16* xr = xb.data() + m0 * K;
    float* orow = op + m0 * N;
    const bool first = llmserve::first_tile_of_chunk(m0, kRowChunk);
    float terms[kRowTile];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* w = wp + n * (K / 2);
      const Half* s = sp + n * groups;
      for (int64_t r = 0; r < rows; ++r) terms[r] = min_term(mp + n * groups, xsum.data() + (m0 + r) * groups, groups);
      switch (rows) {
        case 1: dot_rows_bf16<1, 4>(xr, K, w, s, terms, orow + n, N, shifts, table, first); break;
        case 2: dot_rows_bf16<2, 2>(xr, K, w, s, terms, orow + n, N, shifts, table, first); break;
        case 3: dot_rows_bf16<3, 1>(xr, K, w, s, terms, orow + n, N, shifts, table, first); break;
        default: dot_rows_bf16<4, 1>(xr, K, w, s, terms, orow + n, N, shifts, table, first); break;
      }
    }
  });
  return;
#endif
#ifdef LLMSERVE_AVX2
  if (M >= kPanelMinRows) {
    dequantized_panel(xp, M, K, N, wp, sp, mp, op);
    return;
  }
#endif
  llmserve::for_each_tile(M, N, kRowChunk, kChannelBlock, kRowTile,
                          [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    const float* xr = xp + m0 * K;
    float* orow = op + m0 * N;
    const bool first = llmserve::first_tile_of_chunk(m0, kRowChunk);
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* w = wp + n * (K / 2);
      const Half* s = sp + n * groups;
      const Half* mn = mp + n * groups;
      switch (rows) {
        case 1: dot_rows<1, 4, 2>(xr, K, w, s, mn, orow + n, N, first); break;
        case 2: dot_rows<2, 4, 2>(xr, K, w, s, mn, orow + n, N, first); break;
        case 3: dot_rows<3, 2, 1>(xr, K, w, s, mn, orow + n, N, first); break;
        default: dot_rows<4, 2, 1>(xr, K, w, s, mn, orow + n, N, first); break;
      }
    }
  });
}

// out = bfloat16(d q + m), the weights whole [N, K]: for batches of many rows, as int8_dequantize is.
void int4_dequantize(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& mins, const at::Tensor& out) {
  TORCH_CHECK(packed.device().is_cpu() && out.device().is_cpu(), "int4_dequantize runs on CPU tensors");
  TORCH_CHECK(packed.dim() == 2 && out.dim() == 2 && scales.dim() == 2, "int4_dequantize: packed [N, K / 2], out [N, K]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf &&
                  out.scalar_type() == at::kBFloat16,
              "int4_dequantize: uint8 packed codes, float16 scales and mins, bfloat16 out");
  const int64_t N = out.size(0), K = out.size(1), groups = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && packed.size(0) == N && packed.size(1) == K / 2 && scales.size(0) == N &&
                  scales.size(1) == groups && mins.sizes() == scales.sizes(),
              "int4_dequantize: shapes differ");
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous() && mins.is_contiguous() && out.is_contiguous(),
              "int4_dequantize: contiguous tensors only");
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const Half* sp = scales.data_ptr<Half>();
  const Half* mp = mins.data_ptr<Half>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) dequantize_channel(wp + n * (K / 2), sp + n * groups, mp + n * groups, K, op + n * K);
  });
}

}  // namespace llmserve

namespace {
// How this build multiplies a single row: on a 16-bit grid of x with AVX512-VNNI ("vnni") or AVX2 ("avx2")
// integer products, or in floating point ("float").
std::string int4_one_row_path() {
#if defined(LLMSERVE_INT4_ONE_ROW)
  return "vnni";
#elif defined(LLMSERVE_INT4_ONE_ROW_AVX2)
  return "avx2";
#else
  return "float";
#endif
}

// Which activations this build's products read: "bfloat16" (the AVX512-BF16 path) or "float32".
std::string int4_activation_dtype() {
#ifdef LLMSERVE_INT4_BF16
  return "bfloat16";
#else
  return "float32";
#endif
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor scales, Tensor mins, Tensor(a!) out) -> ()");
  m.def("int4_activation_dtype() -> str", &int4_activation_dtype);
  m.def("int4_one_row_path() -> str", &int4_one_row_path);
  m.def("int4_dequantize(Tensor packed, Tensor scales, Tensor mins, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("int4_linear", &llmserve::int4_linear);
  m.impl("int4_dequantize", &llmserve::int4_dequantize);
}
