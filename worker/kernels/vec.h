// Small AVX2 helpers shared by the kernels; every kernel keeps a plain-loop path for other CPUs.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace llmserve {
// The 16-bit grid of the one-row integer paths (int4_linear.cpp, int8_linear.cpp) for a group whose largest
// |x| has the float bits `top` (sign cleared): x16 = x * inverse, x = step * x16, step = 2^(e - 14) where
// 2^e <= max |x| < 2^(e + 1). e is kept where both powers are normal floats; a non-finite x gives a NaN step,
// so the row's output is NaN as on the other paths. Returns the step.
inline float grid_step(uint32_t top, float& inverse) {
  const int32_t e = std::clamp<int32_t>(static_cast<int32_t>(top >> 23), 40, 240);
  const uint32_t inverse_bits = static_cast<uint32_t>(268 - e) << 23, step_bits = static_cast<uint32_t>(e - 14) << 23;
  float step;
  std::memcpy(&inverse, &inverse_bits, 4);
  std::memcpy(&step, &step_bits, 4);
  return (top >> 23) == 0xFF ? std::numeric_limits<float>::quiet_NaN() : step;
}
}  // namespace llmserve

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMSERVE_AVX2 1

namespace llmserve {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bf16 is the top half of a float32
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// float32 -> bfloat16 bits in the low half of each lane, rounded to nearest even with NaN as 0x7FC0: the same
// bits as c10::BFloat16's conversion, eight at a time (a scalar loop of those made the bfloat16 norms and
// activations ~10x slower than float32's).
inline __m256i bf16_bits(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}
inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(v), bf16_bits(v)), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// Round a float vector through T and back: what storing an intermediate in T would do.
inline __m256 round_through(__m256 v, const float*) { return v; }
inline __m256 round_through(__m256 v, const c10::BFloat16*) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16));
}
inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}
// The one-row integer paths' 16-bit grid (grid_step above), eight lanes wide: the largest |x| of x[0, n) as
// float bits (n a multiple of 8; unsigned order is float order, NaN and inf on top), and x on the grid,
// rounded and held within +-32767 steps.
inline uint32_t max_magnitude_bits(const float* x, int n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i top = _mm256_setzero_si256();
  for (int i = 0; i < n; i += 8)
    top = _mm256_max_epu32(top, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude));
  __m128i t = _mm_max_epu32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
  t = _mm_max_epu32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_max_epu32(t, _mm_shuffle_epi32(t, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(t));
}
inline __m256i on_grid(__m256 x, __m256 inverse) {
  const __m256i limit = _mm256_set1_epi32(32767);
  const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(x, inverse));
  return _mm256_max_epi32(_mm256_min_epi32(r, limit), _mm256_sub_epi32(_mm256_setzero_si256(), limit));
}
// exp(x) as 2^n * p(r) with Cephes' polynomial, x clamped to [-87, 88]: relative error below 2e-7. The
// constants are shared by exp8 and exp16, which apply them in the same order (so the same bits per lane).
struct ExpConstants {
  static constexpr float lo = -87.0f, hi = 88.0f, log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  static constexpr float poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                    4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};
inline __m256 exp8(__m256 x) {
  using C = ExpConstants;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(C::lo)), _mm256_set1_ps(C::hi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::ln2_hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::ln2_lo), r);
  __m256 p = _mm256_set1_ps(C::poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::poly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace llmserve

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LLMSERVE_AVX512 1
namespace llmserve {
// The same helpers sixteen lanes wide, lane for lane the same arithmetic (so the same bits) as the eight-lane
// ones: the per-layer kernels of a prefill chunk (hundreds of rows) were a fifth of its step at eight lanes.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline __m512i bf16_bits16(__m512 v) {  // as bf16_bits
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7FC0));
}
// Sixteen float32 -> bfloat16, rounded to nearest even: one instruction where the CPU has AVX512-BF16 (a NaN
// stays a NaN, its payload kept rather than c10's 0x7FC0), else bf16_bits16.
inline __m256i to_bf16x16(__m512 v) {
#ifdef __AVX512BF16__
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
  return _mm512_cvtepi32_epi16(bf16_bits16(v));
#endif
}
inline void store16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16x16(v));
}
inline __m512 round_through16(__m512 v, const float*) { return v; }
inline __m512 round_through16(__m512 v, const c10::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16x16(v)), 16));
}
// The four sums of v0..v3 (a transpose-and-add tree: a third of the shuffles of four separate reductions).
inline __m128 reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
inline __m512 exp16(__m512 x) {  // as exp8
  using C = ExpConstants;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(C::lo)), _mm512_set1_ps(C::hi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(C::log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::ln2_hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::ln2_lo), r);
  __m512 p = _mm512_set1_ps(C::poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::poly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
// silu(g), rounded through T as `F.silu(gate)` rounds, times u: the gated activation's arithmetic, shared by
// silu_and_mul (fused_ops.cpp) and the AMX [gate; up] pass (amx_linear.cpp), which must give the same bits.
template <typename T>
inline __m512 silu_mul16(__m512 g, __m512 u, const T* rounding) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(round_through16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), rounding), u);
}
}  // namespace llmserve
#endif
#endif
