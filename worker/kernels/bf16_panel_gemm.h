// y = x @ W.T for weight-only quantized W on a CPU with AVX512-BF16, for batches of a few to a few dozen rows
// (decode steps of several sequences), shared by the int8 and 4-bit kernels.
//
// Their row-at-a-time paths form each weight in registers and multiply it into at most four activation
// rows, so their cost grows with the rows almost as if each row were alone (30 layers of this model: int8
// 14 ms at 8 rows, 47 at 32, where oneDNN's bfloat16 GEMM takes 12 and 23). Here a block of 16 output
// channels is first turned into bfloat16 rows in a small buffer (the caller's `fill`: int8 codes as they are,
// exact; 4-bit d q + m rounded once), and every activation row then runs against that buffer on the
// bfloat16 dot-product instruction: 16 rows per vector (one lane a row), each of the 16 channels' weight pairs
// broadcast from the buffer, so one x load serves 16 dot products and the buffer's conversion is paid once
// per 16 channels, not once per row. Sums are float32; x is rounded to bfloat16 once per call.
//
// Layouts: x [M, K] float32; out [M, N] float32, written; scales: one float32 per output channel, applied to
// the sums (int8's per-channel scale), or nullptr. fill(n0, count, dst, ld) writes the bfloat16 weights of
// channels n0 .. n0 + count - 1 (count <= 16) to dst + c * ld, K values each (ld: K rounded up to even; the
// pad and the channels past N are zeroed here).
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LLMSERVE_BF16_PANEL 1

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace llmserve {

constexpr int64_t kPanelLanes = 16;     // rows per vector, and channels per weight block
constexpr int64_t kPanelMinRows = 10;   // below this the row-at-a-time paths win (bench/quant_kernels.py)
// The row count the kernels switch at: kPanelMinRows unless a test or benchmark holds one path
// (`set_bf16_panel_min_rows`).
inline std::atomic<int64_t> panel_min_rows{kPanelMinRows};

// x rounded to bfloat16 as [M / 16][K / 2][16 rows] pairs (one 32-bit pair of k, k + 1 per row and lane),
// rows past M and the odd k's partner zero.
inline std::vector<uint32_t> pack_rows(const float* x, int64_t M, int64_t K, int64_t pairs) {
  const int64_t blocks = (M + kPanelLanes - 1) / kPanelLanes;
  std::vector<uint32_t> packed(static_cast<size_t>(blocks * pairs * kPanelLanes), 0);
  std::vector<uint16_t> row(static_cast<size_t>(2 * pairs), 0);
  for (int64_t m = 0; m < M; ++m) {
    const float* src = x + m * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row.data() + k), reinterpret_cast<__m256i>(b));
    }
    for (; k < K; ++k) row[k] = c10::BFloat16(src[k]).x;
    uint32_t* dst = packed.data() + (m / kPanelLanes) * pairs * kPanelLanes + m % kPanelLanes;
    for (int64_t p = 0; p < pairs; ++p) {
      dst[p * kPanelLanes] = static_cast<uint32_t>(row[2 * p]) | (static_cast<uint32_t>(row[2 * p + 1]) << 16);
    }
  }
  return packed;
}

// 16 rows (one x block) against 16 channels (the weight buffer): acc[c] lane r = sum_k x[r][k] w[c][k].
inline void panel_tile(const uint32_t* xblock, const uint32_t* w, int64_t pairs, __m512 (&acc)[16]) {
  for (int c = 0; c < 16; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xblock + p * kPanelLanes));
    for (int c = 0; c < 16; ++c) {
      const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(w[c * pairs + p])));
      acc[c] = _mm512_dpbf16_ps(acc[c], xv, wv);
    }
  }
}

template <typename Fill>
void bf16_panel_gemm(const float* x, int64_t M, int64_t K, int64_t N, const float* scales, const Fill& fill,
                     float* out) {
  const int64_t pairs = (K + 1) / 2;
  const std::vector<uint32_t> xp = pack_rows(x, M, K, pairs);
  const int64_t row_blocks = (M + kPanelLanes - 1) / kPanelLanes;
  const int64_t channel_blocks = (N + kPanelLanes - 1) / kPanelLanes;
  at::parallel_for(0, channel_blocks, 4, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> buffer(static_cast<size_t>(kPanelLanes * pairs));
    auto* w = reinterpret_cast<c10::BFloat16*>(buffer.data());
    alignas(64) float tile[16][16];
    const __m512i columns = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(16));
    for (int64_t cb = begin; cb < end; ++cb) {
      const int64_t n0 = cb * kPanelLanes, count = std::min(kPanelLanes, N - n0);
      fill(n0, count, w, 2 * pairs);
      if (K % 2)  // the odd k's partner
        for (int64_t c = 0; c < count; ++c) w[c * 2 * pairs + K] = c10::BFloat16(0.0f);
      if (count < kPanelLanes)  // channels past N
        std::memset(buffer.data() + count * pairs, 0, (kPanelLanes - count) * pairs * sizeof(uint32_t));
      const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
      const __m512 s = scales ? _mm512_maskz_loadu_ps(valid, scales + n0) : _mm512_set1_ps(1.0f);
      for (int64_t rb = 0; rb < row_blocks; ++rb) {
        __m512 acc[16];
        panel_tile(xp.data() + rb * pairs * kPanelLanes, buffer.data(), pairs, acc);
        for (int c = 0; c < 16; ++c) _mm512_store_ps(tile[c], acc[c]);
        const int64_t rows = std::min(kPanelLanes, M - rb * kPanelLanes);
        for (int64_t r = 0; r < rows; ++r) {  // column r of the tile: row r's 16 channels
          const __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(columns, _mm512_set1_epi32(static_cast<int>(r))),
                                               &tile[0][0], 4);
          _mm512_mask_storeu_ps(out + (rb * kPanelLanes + r) * N + n0, valid, _mm512_mul_ps(v, s));
        }
      }
    }
  });
}

}  // namespace llmserve

#endif
