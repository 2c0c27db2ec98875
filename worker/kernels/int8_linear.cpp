// y = x @ (codes * scale).T for int8 weights with one float32 scale per output channel (weight-only int8).
//
// torch's own `_weight_int8pack_mm` takes bfloat16 rows on this kind of CPU and reads the weights at about a
// third of the memory bandwidth for a single row, so a one-stream decode step spent most of its time there.
// Here each output channel's int8 row is widened to float32 eight at a time and multiplied into up to four
// activation rows while it is in registers: a decode step (1-8 rows) is bound by reading the int8 weights,
// and larger batches reuse each weight row from cache. Activations and sums are float32.
// On a CPU with AVX512-BF16, from `panel_min_rows` rows (10) the products run on bf16_panel_gemm.h instead:
// the codes are exact in bfloat16, x is rounded to bfloat16, sums stay float32 and the scale multiplies them.
// One row runs on integer products over a 16-bit grid of x (AVX512-VNNI, or AVX2 without it); on an AVX2 build
// without AVX512-VNNI (no panel GEMM there) so does every batch, each row on its own grid (`grid_rows_avx2`).
//
// Layouts: x [M, K] float32, contiguous; codes [N, K] int8, contiguous; scales [N] float32; out [M, N]
// float32, written. Work is split over output channels on torch's intra-op threads.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bf16_panel_gemm.h"
#include "blocking.h"
#include "ops.h"
#include "vec.h"

namespace {

constexpr int64_t kRowTile = 4;        // activation rows sharing one pass over a weight row
constexpr int64_t kRowChunk = 16;      // x rows kept in cache while weight blocks pass (16 x 1536 floats)
constexpr int64_t kChannelBlock = 16;  // weight rows (at most 16 x 1536 bytes here) kept in L1 across row tiles
// How far ahead of the codes being read the multi-row paths prefetch them, on the first row tile over a
// block (the one that reads it from memory): without it 2-8 rows took 3-9x one row's time over a model's
// linears (docs/STUDY_LOG.md).
constexpr int64_t kRowsPrefetchBytes = 8192;
// Up to how many rows x runs on the 16-bit grid on an AVX2 build without AVX512-VNNI (every row count: such
// a CPU has no panel GEMM, and from DEQUANTIZE_MIN_ROWS rows the layer dequantizes instead); 1 holds the
// float path for tests and benchmarks (`set_int8_grid_max_rows`).
std::atomic<int64_t> grid_max_rows{std::numeric_limits<int64_t>::max()};

// Rows [0, R) of x against one weight row; writes out[r * ldo] for each row.
template <int R>
void dot_rows(const float* x, int64_t K, const int8_t* w, float scale, float* out, int64_t ldo, bool prefetch) {
  int64_t k = 0;
#ifdef LLMSERVE_AVX2
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  if constexpr (R == 1) {
    // One row (a one-stream decode step): two more sums in flight, so the FMAs' latency does not bound
    // the read of the weights (two chains read 28 MB of LM head at 9 GB/s on an AMX Xeon). The sums
    // group differently from 2-4 rows', so a row's float32 rounding depends on its batch, as it already
    // does from panel_min_rows on.
    __m256 more[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; k + 32 <= K; k += 32) {
      const __m128i* src = reinterpret_cast<const __m128i*>(w + k);
      const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(src)));
      const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + 8))));
      const __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + 16))));
      const __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + 24))));
      acc[0][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), acc[0][0]);
      acc[0][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), acc[0][1]);
      more[0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + k + 16), more[0]);
      more[1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + k + 24), more[1]);
    }
    acc[0][0] = _mm256_add_ps(acc[0][0], more[0]);
    acc[0][1] = _mm256_add_ps(acc[0][1], more[1]);
  }
  for (; k + 16 <= K; k += 16) {
    if (prefetch && k % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(w + k + kRowsPrefetchBytes), _MM_HINT_T0);
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k))));
    const __m256 w1 =
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + 8))));
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
    for (int r = 0; r < R; ++r) sums[r] += static_cast<float>(w[k]) * x[r * K + k];
  }
  for (int r = 0; r < R; ++r) out[r * ldo] = sums[r] * scale;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define LLMSERVE_INT8_ONE_ROW 1
// One row (a single decode stream) on integer dot products, as int4_linear.cpp's one-row path: widening
// each code to float32 cost three instructions per eight weights, and the AMX Xeon's one-stream int8 step
// spent ~2.6 ms in the 28 MB LM head (~11 GB/s) where the bytes alone stream at ~45 GB/s. Each 64-element
// chunk of x goes on the 16-bit grid of its largest element, x = step * x16, step = 2^(e - 14) with
// 2^e <= max |x| < 2^(e + 1), |x16| <= 32767 (exact for elements of at least 2^(e - 8); error at most one step,
// max |x| 2^-14, where rounding would reach 2^15). x16 = 256 hi + lo, hi signed and lo unsigned bytes. A code
// w is signed, and VPDPBUSD multiplies unsigned by signed bytes, so hi meets w + 128 (the code with its top
// bit flipped) and the lanes' share of 128 * hi, known per call, is subtracted: the chunk's sum of w x16 is
// exact in int32 (and in float32: below 2^24), scaled by the chunk's step in one FMA per lane.
constexpr int64_t kChunk = 64;            // x elements on one grid: one 64-byte load of codes
constexpr int kOneRowChannels = 4;        // weight rows in flight together, x loaded once for all
constexpr int64_t kPrefetchBytes = 8192;  // how far ahead of the codes being read they are prefetched

struct GridRow {
  std::vector<int8_t> hi;
  std::vector<uint8_t> lo;      // [chunks * 64], zero past K
  std::vector<float> step;      // per chunk
  std::vector<int32_t> offset;  // [chunks * 16]: per VPDPBUSD lane, 256 * 128 * (sum of its four hi bytes)
  int64_t chunks = 0;
};

void grid_row(const float* x, int64_t K, GridRow& out) {
  out.chunks = (K + kChunk - 1) / kChunk;
  out.hi.assign(static_cast<size_t>(out.chunks * kChunk), 0);
  out.lo.assign(static_cast<size_t>(out.chunks * kChunk), 0);
  out.step.assign(static_cast<size_t>(out.chunks), 0.0f);
  out.offset.assign(static_cast<size_t>(out.chunks * 16), 0);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), limit = _mm512_set1_epi32(32767);
  for (int64_t c = 0; c < out.chunks; ++c) {
    __m512 v[4];
    uint32_t top = 0;
    for (int j = 0; j < 4; ++j) {
      const int64_t k = c * kChunk + 16 * j, left = std::clamp<int64_t>(K - k, 0, 16);
      v[j] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << left) - 1), x + k);
      top = std::max(top, _mm512_reduce_max_epu32(_mm512_and_si512(_mm512_castps_si512(v[j]), magnitude)));
    }
    float inverse;
    out.step[c] = llmserve::grid_step(top, inverse);
    const __m512 scale = _mm512_set1_ps(inverse);  // exact: a power of two
    for (int j = 0; j < 4; ++j) {
      __m512i x16 = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], scale));
      x16 = _mm512_max_epi32(_mm512_min_epi32(x16, limit), _mm512_sub_epi32(_mm512_setzero_si512(), limit));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.hi.data() + c * kChunk + 16 * j),
                       _mm512_cvtepi32_epi8(_mm512_srai_epi32(x16, 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.lo.data() + c * kChunk + 16 * j), _mm512_cvtepi32_epi8(x16));
    }
    const __m512i hi = _mm512_loadu_si512(out.hi.data() + c * kChunk);
    const __m512i lane_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), hi);
    _mm512_storeu_si512(out.offset.data() + c * 16, _mm512_slli_epi32(lane_sums, 15));
  }
}

// C consecutive weight rows against the gridded row; writes out[0, C) (times each row's scale).
template <int C>
void one_row_channels(const GridRow& xg, int64_t K, const int8_t* w, const float* scales, float* out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < xg.chunks; ++b) {
    const int64_t left = K - b * kChunk;
    const __mmask64 bytes = left >= kChunk ? ~0ULL : ~0ULL >> (kChunk - left);
    for (int c = 0; c < C; ++c)  // the C lines these rows' codes advance by per chunk, kPrefetchBytes on
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + (b * C + c) * 64), _MM_HINT_T0);
    const __m512i xh = _mm512_loadu_si512(xg.hi.data() + b * kChunk), xl = _mm512_loadu_si512(xg.lo.data() + b * kChunk);
    const __m512i offset = _mm512_loadu_si512(xg.offset.data() + b * 16);
    const __m512 step = _mm512_set1_ps(xg.step[b]);
    for (int c = 0; c < C; ++c) {
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, w + c * K + b * kChunk);
      const __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(v, flip), xh);
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_sub_epi32(_mm512_slli_epi32(high, 8), offset), xl, v);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), step, acc[c]);
    }
  }
  if constexpr (C == 4) {
    _mm_storeu_ps(out, _mm_mul_ps(llmserve::reduce4(acc[0], acc[1], acc[2], acc[3]), _mm_loadu_ps(scales)));
  } else {
    for (int c = 0; c < C; ++c) out[c] = _mm512_reduce_add_ps(acc[c]) * scales[c];
  }
}
#endif

#if defined(LLMSERVE_AVX2) && !defined(LLMSERVE_INT8_ONE_ROW)
#define LLMSERVE_INT8_ONE_ROW_AVX2 1
// One row on an AVX2 CPU without AVX512-VNNI: the same 16-bit grid of x per 64-element chunk as above, but
// the codes widened to 16 bits and met by VPMADDWD (16-bit pairs summed into int32): exact for any code
// (-128 included), and two instructions per sixteen weights where widening to float32 took three per eight.
// A chunk's int32 sum (64 products below 2^22 each) goes to float32 once, scaled by the chunk's step.
constexpr int64_t kChunkAvx2 = 64;
constexpr int kOneRowChannelsAvx2 = 4;
constexpr int64_t kPrefetchBytesAvx2 = 8192;

// x[0, K) on the grid, chunk by chunk: x16[0, chunks * 64) (zero past K) and step[0, chunks).
void grid_chunks_avx2(const float* x, int64_t K, int16_t* x16, float* step) {
  const int64_t chunks = (K + kChunkAvx2 - 1) / kChunkAvx2;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t k0 = c * kChunkAvx2, n = std::min<int64_t>(kChunkAvx2, K - k0);
    alignas(32) float v[kChunkAvx2] = {};
    std::copy(x + k0, x + k0 + n, v);
    float inverse;
    step[c] = llmserve::grid_step(llmserve::max_magnitude_bits(v, kChunkAvx2), inverse);
    const __m256 scale = _mm256_set1_ps(inverse);  // exact: a power of two
    for (int j = 0; j < 8; j += 2) {
      const __m256i a = llmserve::on_grid(_mm256_load_ps(v + 8 * j), scale);
      const __m256i b = llmserve::on_grid(_mm256_load_ps(v + 8 * j + 8), scale);
      // packs works per 128-bit lane: a0-3 b0-3 a4-7 b4-7; the permute puts them back in order
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x16 + k0 + 8 * j), packed);
    }
  }
}

struct GridRowAvx2 {
  std::vector<int16_t> x16;  // [chunks * 64], zero past K
  std::vector<float> step;   // per chunk
  int64_t chunks = 0;
};

void grid_row_avx2(const float* x, int64_t K, GridRowAvx2& out) {
  out.chunks = (K + kChunkAvx2 - 1) / kChunkAvx2;
  out.x16.assign(static_cast<size_t>(out.chunks * kChunkAvx2), 0);
  out.step.assign(static_cast<size_t>(out.chunks), 0.0f);
  grid_chunks_avx2(x, K, out.x16.data(), out.step.data());
}

// C consecutive weight rows against the gridded row; writes out[0, C) (times each row's scale).
template <int C>
void one_row_channels_avx2(const GridRowAvx2& xg, int64_t K, const int8_t* w, const float* scales, float* out) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const auto chunk = [&](int64_t b, int c, const int8_t* codes) {
    const int16_t* xb = xg.x16.data() + b * kChunkAvx2;
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * j)));
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16 * j));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(wv, xv));
    }
    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(xg.step[b]), acc[c]);
  };
  const int64_t full = K / kChunkAvx2;
  for (int64_t b = 0; b < full; ++b) {
    for (int c = 0; c < C; ++c)  // the C lines these rows' codes advance by per chunk, kPrefetchBytesAvx2 on
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytesAvx2 + (b * C + c) * 64), _MM_HINT_T0);
    for (int c = 0; c < C; ++c) chunk(b, c, w + c * K + b * kChunkAvx2);
  }
  if (full < xg.chunks) {  // the last, partial chunk: its codes copied, zero past K (x16 is zero there too)
    for (int c = 0; c < C; ++c) {
      alignas(16) int8_t tail[kChunkAvx2] = {};
      std::copy(w + c * K + full * kChunkAvx2, w + (c + 1) * K, tail);
      chunk(full, c, tail);
    }
  }
  for (int c = 0; c < C; ++c) out[c] = llmserve::hsum(acc[c]) * scales[c];
}

// Several rows on the same grid (up to `grid_max_rows`), for the 2-64 row decode steps of an AVX2 CPU (where
// `WORKER_QUANTIZATION=auto` is int8): the float path widens every eight codes to float32 once per four rows
// and spends an FMA per row on them; here each sixteen codes are widened to 16 bits once and met by one
// VPMADDWD per row, each row's chunk sums scaled by its own step, so a row's result is the one it gets alone.
// Built -march=haswell on an AMX Xeon, both prefetching: 1.15-1.33x the float rows (docs/STUDY_LOG.md).
struct GridRowsAvx2 {
  std::vector<int16_t> x16;  // [rows, chunks * 64], zero past K
  std::vector<float> step;   // [rows, chunks]
  int64_t chunks = 0;
};

void grid_rows_avx2(const float* x, int64_t M, int64_t K, GridRowsAvx2& out) {
  out.chunks = (K + kChunkAvx2 - 1) / kChunkAvx2;
  out.x16.assign(static_cast<size_t>(M * out.chunks * kChunkAvx2), 0);
  out.step.assign(static_cast<size_t>(M * out.chunks), 0.0f);
  // One thread: a few microseconds even at 64 rows, less than starting the others
  for (int64_t m = 0; m < M; ++m)
    grid_chunks_avx2(x + m * K, K, out.x16.data() + m * out.chunks * kChunkAvx2, out.step.data() + m * out.chunks);
}

// Rows [m0, m0 + R) of the grid against one weight row; writes out[r * ldo] for each row.
template <int R>
void grid_rows_channel_avx2(const GridRowsAvx2& xg, int64_t m0, int64_t K, const int8_t* w, float scale, float* out,
                            int64_t ldo, bool prefetch) {
  const int64_t row_elems = xg.chunks * kChunkAvx2;
  const int16_t* x0 = xg.x16.data() + m0 * row_elems;
  const float* steps = xg.step.data() + m0 * xg.chunks;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const auto chunk = [&](int64_t b, const int8_t* codes) {
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * j)));
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + r * row_elems + b * kChunkAvx2 + 16 * j));
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(wv, xv));
      }
    }
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_set1_ps(steps[r * xg.chunks + b]), acc[r]);
  };
  const int64_t full = K / kChunkAvx2;
  for (int64_t b = 0; b < full; ++b) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(w + b * kChunkAvx2 + kRowsPrefetchBytes), _MM_HINT_T0);
    chunk(b, w + b * kChunkAvx2);
  }
  if (full < xg.chunks) {  // the last, partial chunk: its codes copied, zero past K (x16 is zero there too)
    alignas(16) int8_t tail[kChunkAvx2] = {};
    std::copy(w + full * kChunkAvx2, w + K, tail);
    chunk(full, tail);
  }
  for (int r = 0; r < R; ++r) out[r * ldo] = llmserve::hsum(acc[r]) * scale;
}
#endif
}  // namespace

namespace llmserve {

void int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && codes.device().is_cpu(), "int8_linear runs on CPU tensors");
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 2 && out.dim() == 2, "int8_linear: x [M, K], codes [N, K], out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "int8_linear: float32 x and out");
  TORCH_CHECK(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat, "int8_linear: int8 codes, float32 scales");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(codes.size(1) == K && scales.numel() == N && out.size(0) == M && out.size(1) == N, "int8_linear: shapes differ");
  TORCH_CHECK(x.is_contiguous() && codes.is_contiguous() && scales.is_contiguous() && out.is_contiguous(),
              "int8_linear: contiguous tensors only");
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* op = out.data_ptr<float>();
#ifdef LLMSERVE_BF16_PANEL
  if (M >= llmserve::panel_min_rows.load(std::memory_order_relaxed)) {  // the codes are exact in bfloat16; the scale multiplies the sums
    const auto fill = [&](int64_t n0, int64_t count, c10::BFloat16* dst, int64_t ld) {
      for (int64_t c = 0; c < count; ++c) {
        const int8_t* src = wp + (n0 + c) * K;
        c10::BFloat16* row = dst + c * ld;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
          const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f)));
        }
        for (; k < K; ++k) row[k] = c10::BFloat16(static_cast<float>(src[k]));
      }
    };
    llmserve::bf16_panel_gemm(xp, M, K, N, sp, fill, op);
    return;
  }
#endif
#ifdef LLMSERVE_INT8_ONE_ROW_AVX2
  if (M == 1) {
    llmserve::one_row_with_grid<GridRowAvx2, kOneRowChannelsAvx2>(
        xp, K, N, kChannelBlock, grid_row_avx2, [&](auto width, const GridRowAvx2& xg, int64_t n) {
          one_row_channels_avx2<decltype(width)::value>(xg, K, wp + n * K, sp + n, op + n);
        });
    return;
  }
  if (M <= grid_max_rows.load(std::memory_order_relaxed)) {
    thread_local GridRowsAvx2 scratch;
    grid_rows_avx2(xp, M, K, scratch);
    const GridRowsAvx2& xg = scratch;  // a thread_local named in the lambda would be each worker thread's own
    llmserve::for_each_tile(M, N, kRowChunk, kChannelBlock, kRowTile,
                            [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
      float* orow = op + m0 * N;
      const bool first = llmserve::first_tile_of_chunk(m0, kRowChunk);
      for (int64_t n = n0; n < n1; ++n) {
        const int8_t* w = wp + n * K;
        switch (rows) {
          case 1: grid_rows_channel_avx2<1>(xg, m0, K, w, sp[n], orow + n, N, first); break;
          case 2: grid_rows_channel_avx2<2>(xg, m0, K, w, sp[n], orow + n, N, first); break;
          case 3: grid_rows_channel_avx2<3>(xg, m0, K, w, sp[n], orow + n, N, first); break;
          default: grid_rows_channel_avx2<4>(xg, m0, K, w, sp[n], orow + n, N, first); break;
        }
      }
    });
    return;
  }
#endif
#ifdef LLMSERVE_INT8_ONE_ROW
  if (M == 1) {
    llmserve::one_row_with_grid<GridRow, kOneRowChannels>(
        xp, K, N, kChannelBlock, grid_row, [&](auto width, const GridRow& xg, int64_t n) {
          one_row_channels<decltype(width)::value>(xg, K, wp + n * K, sp + n, op + n);
        });
    return;
  }
#endif
  llmserve::for_each_tile(M, N, kRowChunk, kChannelBlock, kRowTile,
                          [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    const float* xr = xp + m0 * K;
    float* orow = op + m0 * N;
    const bool first = llmserve::first_tile_of_chunk(m0, kRowChunk);
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* w = wp + n * K;
      switch (rows) {
        case 1: dot_rows<1>(xr, K, w, sp[n], orow + n, N, first); break;
        case 2: dot_rows<2>(xr, K, w, sp[n], orow + n, N, first); break;
        case 3: dot_rows<3>(xr, K, w, sp[n], orow + n, N, first); break;
        default: dot_rows<4>(xr, K, w, sp[n], orow + n, N, first); break;
      }
    }
  });
}

// out = bfloat16(codes * scale), the weights whole: a batch of many rows (a prefill chunk) runs faster as
// this plus one bfloat16 GEMM than through int8_linear, on a CPU whose GEMM has native bfloat16 (worker/model/quant.py).
void int8_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out) {
  TORCH_CHECK(codes.device().is_cpu() && out.device().is_cpu(), "int8_dequantize runs on CPU tensors");
  TORCH_CHECK(codes.dim() == 2 && out.sizes() == codes.sizes(), "int8_dequantize: codes and out [N, K]");
  TORCH_CHECK(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kBFloat16,
              "int8_dequantize: int8 codes, float32 scales, bfloat16 out");
  const int64_t N = codes.size(0), K = codes.size(1);
  TORCH_CHECK(scales.numel() == N, "int8_dequantize: one scale per row");
  TORCH_CHECK(codes.is_contiguous() && scales.is_contiguous() && out.is_contiguous(),
              "int8_dequantize: contiguous tensors only");
  const int8_t* wp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* w = wp + n * K;
      c10::BFloat16* o = op + n * K;
      int64_t k = 0;
#ifdef LLMSERVE_AVX2
      const __m256 s = _mm256_set1_ps(sp[n]);
      for (; k + 8 <= K; k += 8) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
        llmserve::store8(o + k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
      }
#endif
      for (; k < K; ++k) o[k] = c10::BFloat16(static_cast<float>(w[k]) * sp[n]);
    }
  });
}

}  // namespace llmserve

namespace {
// From how many rows int8_linear and int4_linear run bf16_panel_gemm.h (x rounded to bfloat16 there), or 0
// where this build has no such path (a CPU without AVX512-BF16).
int64_t bf16_panel_min_rows() {
#ifdef LLMSERVE_BF16_PANEL
  return llmserve::panel_min_rows.load();
#else
  return 0;
#endif
}

// Hold the kernels on one side of the switch (tests, benchmarks): 1 always, a large count never.
void set_bf16_panel_min_rows(int64_t rows) {
  TORCH_CHECK(rows >= 1, "set_bf16_panel_min_rows: at least 1, got ", rows);
#ifdef LLMSERVE_BF16_PANEL
  llmserve::panel_min_rows.store(rows);
#endif
}
}  // namespace

namespace {
// Up to how many rows x runs on the 16-bit grid below the panel GEMM's rows: 1 where the one-row path is
// integer ("vnni", or "avx2" held to one row), every row count on an AVX2 build, 0 where it is "float".
int64_t int8_grid_max_rows() {
#if defined(LLMSERVE_INT8_ONE_ROW_AVX2)
  return std::max<int64_t>(1, grid_max_rows.load());
#elif defined(LLMSERVE_INT8_ONE_ROW)
  return 1;
#else
  return 0;
#endif
}

// Hold an AVX2 build's rows on one side of its switch (tests, benchmarks): 1 runs every batch of 2 or more
// rows in floating point, as before the grid rows existed; elsewhere this does nothing.
void set_int8_grid_max_rows(int64_t rows) {
  TORCH_CHECK(rows >= 1, "set_int8_grid_max_rows: at least 1, got ", rows);
  grid_max_rows.store(rows);
}

// How this build multiplies a single row: on a 16-bit grid of x with AVX512-VNNI ("vnni") or AVX2 ("avx2")
// integer products, or in floating point ("float").
std::string int8_one_row_path() {
#if defined(LLMSERVE_INT8_ONE_ROW)
  return "vnni";
#elif defined(LLMSERVE_INT8_ONE_ROW_AVX2)
  return "avx2";
#else
  return "float";
#endif
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor(a!) out) -> ()");
  m.def("int8_one_row_path() -> str", &int8_one_row_path);
  m.def("int8_grid_max_rows() -> int", &int8_grid_max_rows);
  m.def("set_int8_grid_max_rows(int rows) -> ()", &set_int8_grid_max_rows);
  m.def("int8_dequantize(Tensor codes, Tensor scales, Tensor(a!) out) -> ()");
  m.def("bf16_panel_min_rows() -> int", &bf16_panel_min_rows);
  m.def("set_bf16_panel_min_rows(int rows) -> ()", &set_bf16_panel_min_rows);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("int8_linear", &llmserve::int8_linear);
  m.impl("int8_dequantize", &llmserve::int8_dequantize);
}
