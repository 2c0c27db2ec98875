// Decode attention that reads K/V where they live in the paged pool.
//
// The torch path gathers every sequence's blocks into a contiguous [KV, B, L, D] copy, per layer and
// per step, before two batched matmuls: at 32 sequences of ~250 tokens that copy is most of the
// attention time and grows with context. Here each (sequence, KV head) pair walks its block table and
// reads each key and value row in place; the `group` query heads sharing a KV head reuse the rows while
// they are in L1. Work is split over torch's own intra-op threads (at::parallel_for).
//
// Layouts: q [B, H, D]; k_cache, v_cache [KV, num_blocks, block_size, D]; block_tables [B, max_blocks]
// (int64); context_lens [B] (int64: tokens to attend, the new one included); out [B, H, D], written.
// Scores, softmax and sums are float32 whatever the storage dtype (float32 or bfloat16); with a bfloat16 cache
// on a CPU with AVX512-BF16 the products run on its dot-product instruction and the softmax weights are
// rounded to bfloat16 before p . v (`attend_bf16`). 32 sequences of 256 tokens, SmolLM2's heads, interleaved:
// 400 -> 287 us a layer there, about what reading their 6.3 MB of K/V at this machine's bandwidth takes.
// With K/V hot in cache the bfloat16 path still took two thirds of its time (AMX Xeon): the softmax's scalar
// running max, one dependent compare per score, was most of it. The maximum is now kept lane by lane while
// the scores are made, and the numerators are exponentiated, summed and rounded in one 16-lane pass: 30
// layers of 64 sequences of ~190 tokens 14.1 -> 11.9 ms, 8 of ~600 5.3 -> 4.6 ms (in process, interleaved).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace {

struct Problem {
  int64_t num_heads, num_kv, num_blocks, block_size, group, max_blocks;
  float scale;
};

// Row addresses of one (sequence, KV head): token t lives in block table[t / bs], slot t % bs.
template <typename T>
void row_pointers(const T* base, const int64_t* table, int64_t ctx, int64_t kv, const Problem& p, int64_t dim,
                  std::vector<const T*>& rows) {
  rows.resize(ctx);
  for (int64_t t = 0, b = 0; t < ctx; ++b) {  // block by block: no division per token
    const T* block = base + (kv * p.num_blocks + table[b]) * p.block_size * dim;
    for (int64_t s = 0; s < p.block_size && t < ctx; ++s, ++t) rows[t] = block + s * dim;
  }
}

// Softmax numerators in place (scores - max, exponentiated); returns their sum.
float softmax_numerators(float* s, int64_t n);

// Rows [t0, t1) of K or V requested ahead of use (into L1 with T0, L2 with T1). A block of the paged pool
// is 16 rows (2 KB of a bfloat16 head of 64), too short for the hardware prefetcher to ramp up on before the
// walk jumps to the next block, wherever that lies: without this the walk read memory at 10 GB/s of the 24
// an AMX Xeon's two cores read at.
template <int kHint, typename T>
inline void prefetch_rows(const std::vector<const T*>& rows, int64_t t0, int64_t t1, int64_t row_bytes) {
  for (int64_t t = t0; t < t1; ++t) {
    const char* row = reinterpret_cast<const char*>(rows[t]);
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(row + b, static_cast<_mm_hint>(kHint));
  }
}
// How far ahead of the rows in use. 32 rather than 128 since the AMX linears left attention half of a
// 64-sequence decode step: 30 layers of 64 sequences 14.3-15.3 -> 13.0-13.6 ms at 130 tokens of context and
// 33.0-33.2 -> 31.4-31.9 at 256, 32 sequences of 192 9.4-9.8 -> 8.8-9.3; 8 sequences of 560 a little slower,
// 5.7-6.0 -> 5.9-6.1; one sequence level (interleaved, AMX Xeon, 2 threads; 16 rows was level with 32).
constexpr int64_t kPrefetchRows = 32;

#ifdef LLMSERVE_AVX2
using llmserve::exp8;
using llmserve::hsum;
using llmserve::load8;

// Eight vectors in, one vector of their eight horizontal sums out.
inline __m256 hsum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

float softmax_numerators(float* s, int64_t n) {
  // the maximum eight lanes at a time: a scalar running max is one dependent compare per score
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float m = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) m = std::max(m, s[j]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sumv = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    sumv = _mm256_add_ps(sumv, e);
  }
  float sum = hsum(sumv);
  for (; i < n; ++i) sum += (s[i] = std::exp(s[i] - m));
  return sum;
}

// Rows of K or V as float32, a block of tokens at a time: a bfloat16 cache's rows are widened once per block
// into a scratch every head of the group then reads from L1; a float32 cache's rows are read in place (the
// block's rows stay in L1 while the group's heads pass over them).
template <typename T, int64_t kDim>
const float* block_rows(const std::vector<const T*>& rows, int64_t t0, float* scratch, int64_t r) {
  if constexpr (std::is_same_v<T, float>) {
    (void)t0, (void)scratch;
    return rows[r];
  } else {
    return scratch + (r - t0) * kDim;
  }
}

template <typename T, int64_t kDim>
void widen_block(const std::vector<const T*>& rows, int64_t t0, int64_t n, float* scratch) {
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < kDim; c += 8) _mm256_storeu_ps(scratch + r * kDim + c, load8(rows[t0 + r] + c));
  } else {
    (void)rows, (void)t0, (void)n, (void)scratch;
  }
}

constexpr int64_t kTokenBlock = 64;  // rows per block: 64 x 128 float32 (32 KB) at most, about L1's size

// One (sequence, KV head), head size kDim (a multiple of 8): q . k eight rows at a time, then p . v. The
// `group` query heads sharing the KV head take turns on each block of kTokenBlock rows, so K and V are read
// from memory (and a bfloat16 cache widened) once per KV head, not once per query head.
template <typename T, int64_t kDim>
void attend(const T* query_heads, const std::vector<const T*>& krows, const std::vector<const T*>& vrows,
            int64_t ctx, const Problem& p, std::vector<float>& scores, T* out_heads) {
  constexpr int64_t C = kDim / 8;
  scores.resize(p.group * ctx);
  alignas(32) float scratch[kTokenBlock * kDim];
  for (int64_t t0 = 0; t0 < ctx; t0 += kTokenBlock) {
    const int64_t n = std::min(kTokenBlock, ctx - t0), t1 = t0 + n;
    widen_block<T, kDim>(krows, t0, n, scratch);
    for (int64_t g = 0; g < p.group; ++g) {
      float* s = scores.data() + g * ctx;
      __m256 q[C];
      for (int64_t c = 0; c < C; ++c) q[c] = _mm256_mul_ps(load8(query_heads + g * kDim + 8 * c), _mm256_set1_ps(p.scale));
      int64_t t = t0;
      for (; t + 8 <= t1; t += 8) {
        __m256 dots[8];
        for (int r = 0; r < 8; ++r) {
          const float* row = block_rows<T, kDim>(krows, t0, scratch, t + r);
          __m256 a = _mm256_mul_ps(q[0], _mm256_loadu_ps(row));
          for (int64_t c = 1; c < C; ++c) a = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(row + 8 * c), a);
          dots[r] = a;
        }
        _mm256_storeu_ps(s + t, hsum8(dots));
      }
      for (; t < t1; ++t) {
        const float* row = block_rows<T, kDim>(krows, t0, scratch, t);
        __m256 a = _mm256_mul_ps(q[0], _mm256_loadu_ps(row));
        for (int64_t c = 1; c < C; ++c) a = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(row + 8 * c), a);
        s[t] = hsum(a);
      }
    }
  }
  std::vector<float> sums(p.group * kDim, 0.f);  // each head's running p . v
  std::vector<float> inv(p.group);
  for (int64_t g = 0; g < p.group; ++g) inv[g] = 1.f / softmax_numerators(scores.data() + g * ctx, ctx);
  for (int64_t t0 = 0; t0 < ctx; t0 += kTokenBlock) {
    const int64_t n = std::min(kTokenBlock, ctx - t0);
    widen_block<T, kDim>(vrows, t0, n, scratch);
    for (int64_t g = 0; g < p.group; ++g) {
      const float* s = scores.data() + g * ctx;
      float* sum = sums.data() + g * kDim;
      __m256 acc[C];
      for (int64_t c = 0; c < C; ++c) acc[c] = _mm256_loadu_ps(sum + 8 * c);
      for (int64_t i = t0; i < t0 + n; ++i) {
        const __m256 w = _mm256_set1_ps(s[i]);
        const float* row = block_rows<T, kDim>(vrows, t0, scratch, i);
        for (int64_t c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * c), acc[c]);
      }
      for (int64_t c = 0; c < C; ++c) _mm256_storeu_ps(sum + 8 * c, acc[c]);
    }
  }
  for (int64_t g = 0; g < p.group; ++g) {
    const __m256 scale = _mm256_set1_ps(inv[g]);
    T* dst = out_heads + g * kDim;
    for (int64_t c = 0; c < C; ++c) llmserve::store8(dst + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(sums.data() + g * kDim + 8 * c), scale));
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LLMSERVE_ATTENTION_BF16 1
using BF16 = c10::BFloat16;

// 16 vectors in, one out whose lane r is the sum of vector r's lanes: pairs of rows interleaved and added
// within 128-bit lanes, then pairs of pairs, then the four 128-bit lanes across vectors.
inline __m512 hsum16(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44), _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44), _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

// A bfloat16 cache on a CPU with AVX512-BF16, G query heads per KV head, head size kDim (a multiple of 32).
// q . k: VDPBF16PS over the stored rows as they are (q is bfloat16 too, so every product is exact and the
// sums float32), sixteen rows at a time, each head in turn while the rows are in L1. p . v: the softmax
// numerators rounded to bfloat16 (what a bfloat16 model's own attention multiplies by), two tokens per
// instruction: rows t and t + 1 interleaved element by element, times the pair (p_t, p_t+1) broadcast. The
// interleave puts each 128-bit lane's elements 0-3 in one vector and 4-7 in another; the output is put back
// in order at the end. About 4x fewer instructions than the float32 path for the same rows.
template <int G, int64_t kDim>
void attend_bf16(const BF16* query_heads, const std::vector<const BF16*>& krows, const std::vector<const BF16*>& vrows,
                 int64_t ctx, const Problem& p, std::vector<float>& scores, BF16* out_heads) {
  constexpr int V = kDim / 32;  // vectors per row
  scores.resize(G * ctx);
  __m512bh q[G][V];
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < V; ++v) q[g][v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(query_heads + g * kDim + 32 * v));
  const __m512 scale = _mm512_set1_ps(p.scale);
  __m512 top[G];  // each head's running maximum score, lane by lane: no pass of its own over the scores
  for (int g = 0; g < G; ++g) top[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  constexpr int64_t kRowBytes = kDim * sizeof(BF16);
  prefetch_rows<_MM_HINT_T0>(krows, 0, std::min(kPrefetchRows, ctx), kRowBytes);
  int64_t t = 0;
  for (; t + 16 <= ctx; t += 16) {
    prefetch_rows<_MM_HINT_T0>(krows, std::min(t + kPrefetchRows, ctx), std::min(t + kPrefetchRows + 16, ctx), kRowBytes);
    prefetch_rows<_MM_HINT_T1>(vrows, t, t + 16, kRowBytes);  // for the p . v pass: into L2 meanwhile
    for (int g = 0; g < G; ++g) {
      __m512 dots[16];
      for (int r = 0; r < 16; ++r) {
        const BF16* row = krows[t + r];
        __m512 a = _mm512_setzero_ps();
        for (int v = 0; v < V; ++v) a = _mm512_dpbf16_ps(a, q[g][v], reinterpret_cast<__m512bh>(_mm512_loadu_si512(row + 32 * v)));
        dots[r] = a;
      }
      const __m512 sixteen = _mm512_mul_ps(hsum16(dots), scale);
      _mm512_storeu_ps(scores.data() + g * ctx + t, sixteen);
      top[g] = _mm512_max_ps(top[g], sixteen);
    }
  }
  for (; t < ctx; ++t)
    for (int g = 0; g < G; ++g) {
      __m512 a = _mm512_setzero_ps();
      for (int v = 0; v < V; ++v)
        a = _mm512_dpbf16_ps(a, q[g][v], reinterpret_cast<__m512bh>(_mm512_loadu_si512(krows[t] + 32 * v)));
      scores[g * ctx + t] = _mm512_reduce_add_ps(a) * p.scale;
      top[g] = _mm512_max_ps(top[g], _mm512_set1_ps(scores[g * ctx + t]));
    }
  // p . v over pairs of tokens; an odd last token is paired with a zero row and a zero weight
  const int64_t pairs = (ctx + 1) / 2;
  std::vector<uint32_t> weights(static_cast<size_t>(G * pairs));
  float inv[G];
  for (int g = 0; g < G; ++g) {  // softmax numerators, summed in float32 and rounded to bfloat16 in one pass
    const float* s = scores.data() + g * ctx;
    auto* w = reinterpret_cast<uint16_t*>(weights.data() + g * pairs);
    const float m = _mm512_reduce_max_ps(top[g]);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sumv = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= ctx; i += 16) {  // rounded to nearest even sixteen at a time, as BF16(float) rounds
      const __m512 e = llmserve::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
      sumv = _mm512_add_ps(sumv, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + i), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
    }
    float sum = _mm512_reduce_add_ps(sumv);
    for (; i < ctx; ++i) {
      const float e = std::exp(s[i] - m);
      sum += e;
      w[i] = BF16(e).x;
    }
    inv[g] = 1.f / sum;
    if (ctx % 2) w[ctx] = 0;
  }
  __m512 acc[G][2 * V];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 2 * V; ++j) acc[g][j] = _mm512_setzero_ps();
  prefetch_rows<_MM_HINT_T0>(vrows, 0, std::min(kPrefetchRows, ctx), kRowBytes);
  for (int64_t i = 0; i < pairs; ++i) {
    if (2 * i + kPrefetchRows + 1 < ctx) prefetch_rows<_MM_HINT_T0>(vrows, 2 * i + kPrefetchRows, 2 * i + kPrefetchRows + 2, kRowBytes);
    const BF16* a = vrows[2 * i];
    const bool paired = 2 * i + 1 < ctx;
    __m512i both[2 * V];
    for (int v = 0; v < V; ++v) {
      const __m512i x = _mm512_loadu_si512(a + 32 * v);
      const __m512i y = paired ? _mm512_loadu_si512(vrows[2 * i + 1] + 32 * v) : _mm512_setzero_si512();
      both[2 * v] = _mm512_unpacklo_epi16(x, y);
      both[2 * v + 1] = _mm512_unpackhi_epi16(x, y);
    }
    for (int g = 0; g < G; ++g) {
      const __m512bh w = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(weights[g * pairs + i])));
      for (int j = 0; j < 2 * V; ++j) acc[g][j] = _mm512_dpbf16_ps(acc[g][j], reinterpret_cast<__m512bh>(both[j]), w);
    }
  }
  // lo holds elements 0-3 of each 128-bit lane of the row's 32, hi elements 4-7
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  for (int g = 0; g < G; ++g) {
    const __m512 norm = _mm512_set1_ps(inv[g]);
    BF16* dst = out_heads + g * kDim;
    for (int v = 0; v < V; ++v) {
      const __m512 lo = acc[g][2 * v], hi = acc[g][2 * v + 1];
      const __m512 x0 = _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), norm);
      const __m512 x1 = _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), norm);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * v), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * v + 16), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x1)));
    }
  }
}

// The bfloat16 path where it applies (head size 64 or 128, 1-4 query heads per KV head); false otherwise.
template <typename T>
bool attend_native_bf16(const T* q, const std::vector<const T*>& krows, const std::vector<const T*>& vrows, int64_t ctx,
                        int64_t dim, const Problem& p, std::vector<float>& scores, T* out) {
  if constexpr (!std::is_same_v<T, BF16>) {
    (void)q, (void)krows, (void)vrows, (void)ctx, (void)dim, (void)p, (void)scores, (void)out;
    return false;
  } else {
#define LLMSERVE_ATTEND(G, D) \
  if (p.group == G && dim == D) return attend_bf16<G, D>(q, krows, vrows, ctx, p, scores, out), true;
    LLMSERVE_ATTEND(1, 64) LLMSERVE_ATTEND(2, 64) LLMSERVE_ATTEND(3, 64) LLMSERVE_ATTEND(4, 64)
    LLMSERVE_ATTEND(1, 128) LLMSERVE_ATTEND(2, 128)
#undef LLMSERVE_ATTEND
    return false;
  }
}
#endif
#else
float softmax_numerators(float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - m));
  return sum;
}
#endif

// Any head size, any CPU: plain loops the compiler vectorizes as it can.
template <typename T>
void attend_generic(const T* query_heads, const std::vector<const T*>& krows, const std::vector<const T*>& vrows,
                    int64_t ctx, int64_t dim, const Problem& p, std::vector<float>& scores, T* out_heads) {
  scores.resize(ctx);
  std::vector<float> q(dim), acc(dim);
  for (int64_t g = 0; g < p.group; ++g) {
    for (int64_t d = 0; d < dim; ++d) q[d] = static_cast<float>(query_heads[g * dim + d]) * p.scale;
    for (int64_t t = 0; t < ctx; ++t) {
      float dot = 0.f;
      for (int64_t d = 0; d < dim; ++d) dot += q[d] * static_cast<float>(krows[t][d]);
      scores[t] = dot;
    }
    const float inv = 1.f / softmax_numerators(scores.data(), ctx);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t t = 0; t < ctx; ++t) {
      for (int64_t d = 0; d < dim; ++d) acc[d] += scores[t] * static_cast<float>(vrows[t][d]);
    }
    for (int64_t d = 0; d < dim; ++d) out_heads[g * dim + d] = static_cast<T>(acc[d] * inv);
  }
}

template <typename T>
void decode_attention_typed(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                            const at::Tensor& out) {
  const int64_t num_seqs = q.size(0), dim = q.size(2);
  Problem p{q.size(1), k_cache.size(0), k_cache.size(1), k_cache.size(2), q.size(1) / k_cache.size(0),
            block_tables.size(1), static_cast<float>(scale)};
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k_cache.data_ptr<T>();
  const T* v_ptr = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  T* out_ptr = out.data_ptr<T>();
  at::parallel_for(0, num_seqs * p.num_kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<const T*> krows, vrows;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / p.num_kv, kv = item % p.num_kv;
      const int64_t ctx = lens[seq];
      const int64_t* table = tables + seq * p.max_blocks;
      row_pointers(k_ptr, table, ctx, kv, p, dim, krows);
      row_pointers(v_ptr, table, ctx, kv, p, dim, vrows);
      const int64_t head_offset = (seq * p.num_heads + kv * p.group) * dim;
#ifdef LLMSERVE_ATTENTION_BF16
      if (attend_native_bf16<T>(q_ptr + head_offset, krows, vrows, ctx, dim, p, scores, out_ptr + head_offset)) continue;
#endif
#ifdef LLMSERVE_AVX2
      if (dim == 64) {
        attend<T, 64>(q_ptr + head_offset, krows, vrows, ctx, p, scores, out_ptr + head_offset);
        continue;
      }
      if (dim == 128) {
        attend<T, 128>(q_ptr + head_offset, krows, vrows, ctx, p, scores, out_ptr + head_offset);
        continue;
      }
#endif
      attend_generic<T>(q_ptr + head_offset, krows, vrows, ctx, dim, p, scores, out_ptr + head_offset);
    }
  });
}
}  // namespace

namespace llmserve {

void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_mapping, const at::Tensor& k_cache,
              const at::Tensor& v_cache) {
  TORCH_CHECK(k.device().is_cpu() && k.dim() == 3 && v.sizes() == k.sizes() && k_cache.dim() == 4 &&
                  v_cache.sizes() == k_cache.sizes(),
              "write_kv: k, v [T, KV, D] and caches [KV, num_blocks, block_size, D] on the CPU");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "write_kv: k, v and the caches must share a dtype");
  TORCH_CHECK(k.size(1) == k_cache.size(0) && k.size(2) == k_cache.size(3), "write_kv: heads or head size differ");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == k.size(2) && v.stride(1) == v.size(2),
              "write_kv: each token's heads must be contiguous (a row of the fused QKV output is)");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "write_kv: caches must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == k.size(0),
              "write_kv: one int64 slot per token");
  const int64_t tokens = k.size(0), heads = k.size(1), dim = k.size(2);
  const int64_t pool_slots = k_cache.size(1) * k_cache.size(2), bytes = dim * k.element_size();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slots[t] >= 0 && slots[t] < pool_slots, "write_kv: slot out of range");
  const auto* k_src = static_cast<const char*>(k.data_ptr());
  const auto* v_src = static_cast<const char*>(v.data_ptr());
  auto* k_dst = static_cast<char*>(k_cache.data_ptr());
  auto* v_dst = static_cast<char*>(v_cache.data_ptr());
  const int64_t k_row = k.stride(0) * k.element_size(), v_row = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t cell = (h * pool_slots + slots[t]) * bytes;
      std::memcpy(k_dst + cell, k_src + t * k_row + h * bytes, bytes);
      std::memcpy(v_dst + cell, v_src + t * v_row + h * bytes, bytes);
    }
}

// Moves whole blocks of every pool: for each (src, dst) pair in order, each KV head's block dst becomes a
// copy of its block src (the block manager moves a cached block under another id; a block moved twice in
// one step is moved in turn, so the pairs are never reordered).
void copy_blocks(at::TensorList caches, const at::Tensor& src_ids, const at::Tensor& dst_ids) {
  TORCH_CHECK(src_ids.scalar_type() == at::kLong && dst_ids.scalar_type() == at::kLong && src_ids.is_contiguous() &&
                  dst_ids.is_contiguous() && src_ids.numel() == dst_ids.numel(),
              "copy_blocks: src and dst are int64 block ids of one length");
  const int64_t* src = src_ids.data_ptr<int64_t>();
  const int64_t* dst = dst_ids.data_ptr<int64_t>();
  for (const at::Tensor& cache : caches) {
    TORCH_CHECK(cache.device().is_cpu() && cache.dim() == 4 && cache.is_contiguous(),
                "copy_blocks: pools [KV, num_blocks, block_size, D], contiguous, on the CPU");
    for (int64_t i = 0; i < src_ids.numel(); ++i)
      TORCH_CHECK(src[i] >= 0 && src[i] < cache.size(1) && dst[i] >= 0 && dst[i] < cache.size(1),
                  "copy_blocks: block id out of range");
  }
  for (int64_t i = 0; i < src_ids.numel(); ++i)
    for (const at::Tensor& cache : caches) {
      const int64_t block_bytes = cache.stride(1) * cache.element_size();
      const int64_t head_bytes = cache.stride(0) * cache.element_size();
      auto* base = static_cast<char*>(cache.data_ptr());
      for (int64_t h = 0; h < cache.size(0); ++h)
        std::memcpy(base + h * head_bytes + dst[i] * block_bytes, base + h * head_bytes + src[i] * block_bytes,
                    block_bytes);
    }
}

void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                      const at::Tensor& out) {
  TORCH_CHECK(q.device().is_cpu(), "decode_attention runs on CPU tensors");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "q, out and the caches must share a dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "head dims differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block tables and context lengths must be int64");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0), "batch sizes differ");
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && out.sizes() == q.sizes(), "q and out: same contiguous shape");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && block_tables.is_contiguous() &&
                  context_lens.is_contiguous(),
              "caches, block tables and lengths must be contiguous");
  if (q.scalar_type() == at::kFloat) {
    decode_attention_typed<float>(q, k_cache, v_cache, block_tables, context_lens, scale, out);
  } else if (q.scalar_type() == at::kBFloat16) {
    decode_attention_typed<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, scale, out);
  } else {
    TORCH_CHECK(false, "decode_attention supports float32 and bfloat16, got ", q.scalar_type());
  }
}

}  // namespace llmserve

TORCH_LIBRARY(llmserve, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
      "float scale, Tensor(a!) out) -> ()");
  m.def("write_kv(Tensor k, Tensor v, Tensor slot_mapping, Tensor(a!) k_cache, Tensor(b!) v_cache) -> ()");
  m.def("copy_blocks(Tensor(a!)[] caches, Tensor src, Tensor dst) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("decode_attention", &llmserve::decode_attention);
  m.impl("write_kv", &llmserve::write_kv);
  m.impl("copy_blocks", &llmserve::copy_blocks);
}
