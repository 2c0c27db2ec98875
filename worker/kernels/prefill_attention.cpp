// Attention of a step's prefill chunks over their sequences' paged K/V (the cached context and the chunks' own
// rows), on AMX tiles or, on CPUs with AVX512-BF16 but no AMX, on VDPBF16PS, for a bfloat16 cache of head size 64.
//
// The torch path gathers each chunk's blocks into a contiguous copy per layer (index_select) and calls SDPA's
// CPU flash kernel per chunk; for eight requests of 32 new tokens over a cached 512-token prefix that was 39 ms
// of a 100 ms step on a 2-core AMX Xeon (SDPA ~0.3 TFLOP/s at these shapes). Here, in two passes:
//
// 1. Each KV head's context is laid out as the tiles' operands, 32 tokens a step: K transposed into pairs of
//    dimensions (the B operand of q . k), V interleaved in pairs of tokens (the B operand of p . v), rows past
//    the context zeros (a weight of 0 times a NaN in the pool's unused rows would be NaN). A step of 32 whole
//    tokens is keyed by its pool slots, so chunks over one cached prefix share its steps, laid out once.
// 2. Each task is one chunk's KV head and 16 query rows (the group's query heads stacked as rows, as the
//    grouped-rows SDPA path does). Its p . v sums stay in four accumulator tiles for the whole walk over the
//    context: per step, q . k into two score tiles, FlashAttention's online softmax per row in float32, the
//    weights rounded to bfloat16 as the decode kernels do, and p . v added into the sums. The running max a
//    row's weights are taken against moves (and the sums are rescaled, through memory) only when a score
//    exceeds it by more than kSlack: weights up to e^kSlack are exact enough in float32 and bfloat16 alike,
//    and after the first steps the max seldom moves, so the sums seldom leave their tiles.
// A query sees the keys at or before its own position (context_len - n + i): causal within the chunk.
//
// Without AMX (attend_rows_avx512) pass 2 reads the same laid-out operands with VDPBF16PS: a task is 4 query
// rows, whose 4 x 64 p . v sums stay in 16 vector registers for the whole walk; per step, q . k for the 4 rows
// x 32 keys (one K register of 16 keys' pairs of dimensions against a query pair broadcast), the same online
// softmax, and p . v with a weight pair broadcast against V's interleaved pairs of keys. On an AVX512-BF16
// EPYC (2 cores) eight chunks of 40 tokens over a cached 530-token prefix took SDPA ~115 ms a step (30 layers;
// ~107 GFLOP/s at these shapes, each chunk's K/V gathered first).
//
// Layouts: q, out [T, H, D] bfloat16, each token's heads contiguous (q may be a view of the QKV rows), D = 64;
// k_cache, v_cache [KV, num_blocks, block_size, D], block_size a multiple of 16; chunks and block tables as
// prefill_attention says.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "amx.h"
#include "vec.h"

#if defined(LLMSERVE_AVX512) && defined(__AVX512BF16__)
#define LLMSERVE_BF16_PREFILL 1  // pass 1 and the VDPBF16PS pass 2
#endif
#if defined(LLMSERVE_AMX) && defined(LLMSERVE_BF16_PREFILL)
#define LLMSERVE_AMX_PREFILL 1
#endif

namespace {

#ifdef LLMSERVE_BF16_PREFILL
using BF16 = c10::BFloat16;
constexpr int64_t kDim = 64;
constexpr int64_t kStep = 32;     // keys per step of the walk
constexpr float kSlack = 8.f;     // how far a score may exceed its row's running max before the max moves
constexpr float kInf = std::numeric_limits<float>::infinity();

#ifdef LLMSERVE_AMX_PREFILL
// Tiles: 0-3 the rows' p . v sums (16 dimensions each); 4, 5 the scores of the step's two 16-key halves; 6 the
// A operand (a half of the query rows' dimensions, then the weights); 7 the B operand (K's, then V's pairs).
void configure() {
  llmserve::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}
#endif

struct alignas(64) StepOperands {  // one step's 32 keys and values of one KV head, as B tiles
  uint32_t keys[2][2][16][16];     // [dimension half][key half][pair of dimensions][key]
  uint32_t values[16][kDim];       // [pair of keys][dimension]
};

#ifdef LLMSERVE_AMX_PREFILL
struct alignas(64) RowTile {  // one task's 16 query rows and their softmax state
  BF16 queries[16][kDim];
  float scores[16][kStep];
  BF16 weights[16][kStep];
  float sums[16][kDim];
  float partial[16][16];  // each row's sum of rounded weights, 16 lanes apart
  float max[16], correction[16];
  int32_t position[16];
};
#endif

// 16 keys' rows (64 dimensions) as B tiles: dst[h][p][t] = the pair (k[t][32h + 2p], k[t][32h + 2p + 1]), a
// 16 x 16 transpose of 32-bit words per half: pairs of rows interleaved, then pairs of pairs, then the four
// 128-bit lanes across vectors (64 shuffles a half, where 16 gathers cost several times that).
void transpose_keys(const BF16* block_rows, uint32_t (*dst_half0)[16], uint32_t (*dst_half1)[16]) {
  const auto* words = reinterpret_cast<const int*>(block_rows);  // [16 tokens][32 pairs]
  for (int h = 0; h < 2; ++h) {
    uint32_t (*dst)[16] = h ? dst_half1 : dst_half0;
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(words + 32 * i + 16 * h);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + k], lane L: rows 4i .. 4i + 3 of column 4L + k
      u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
      const __m512i x0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
      const __m512i x2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44), x3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
      _mm512_store_si512(dst[k], _mm512_shuffle_i32x4(x0, x2, 0x88));
      _mm512_store_si512(dst[4 + k], _mm512_shuffle_i32x4(x0, x2, 0xDD));
      _mm512_store_si512(dst[8 + k], _mm512_shuffle_i32x4(x1, x3, 0x88));
      _mm512_store_si512(dst[12 + k], _mm512_shuffle_i32x4(x1, x3, 0xDD));
    }
  }
}

// 16 values' rows as 8 rows of B: dst[i][d] = the pair (v[2i][d], v[2i + 1][d]).
void pair_values(const BF16* block_rows, uint32_t (*dst)[kDim]) {
  const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
  for (int i = 0; i < 8; ++i) {
    const BF16* a = block_rows + 2 * i * kDim;
    const BF16* b = a + kDim;
    for (int half = 0; half < 2; ++half) {
      const __m512i x = _mm512_loadu_si512(a + 32 * half), y = _mm512_loadu_si512(b + 32 * half);
      _mm512_store_si512(dst[i] + 32 * half, _mm512_permutex2var_epi16(x, first, y));
      _mm512_store_si512(dst[i] + 32 * half + 16, _mm512_permutex2var_epi16(x, second, y));
    }
  }
}

// Pass 1: the KV head's step `s` of the context laid out as B tiles.
void lay_out_step(const BF16* k_head, const BF16* v_head, const int64_t* table, int64_t block_size,
                  int64_t context_len, int64_t s, StepOperands& dst) {
  for (int j = 0; j < 2; ++j) {
    const int64_t t0 = kStep * s + 16 * j, valid = std::min<int64_t>(16, context_len - t0);
    if (valid <= 0) {
      std::memset(dst.keys[0][j], 0, sizeof(dst.keys[0][j]));
      std::memset(dst.keys[1][j], 0, sizeof(dst.keys[1][j]));
      std::memset(dst.values[8 * j], 0, 8 * sizeof(dst.values[0]));
      continue;
    }
    const int64_t offset = (table[t0 / block_size] * block_size + t0 % block_size) * kDim;
    const BF16 *k_rows = k_head + offset, *v_rows = v_head + offset;
    alignas(64) BF16 k_copy[16][kDim], v_copy[16][kDim];
    if (valid < 16) {  // the context ends inside these rows: zeros past it
      std::memset(k_copy, 0, sizeof(k_copy));
      std::memset(v_copy, 0, sizeof(v_copy));
      std::memcpy(k_copy, k_rows, valid * kDim * sizeof(BF16));
      std::memcpy(v_copy, v_rows, valid * kDim * sizeof(BF16));
      k_rows = k_copy[0], v_rows = v_copy[0];
    }
    transpose_keys(k_rows, dst.keys[0][j], dst.keys[1][j]);
    pair_values(v_rows, dst.values + 8 * j);
  }
}

#ifdef LLMSERVE_AMX_PREFILL
// Tile numbers are immediates, hence the four lines.
void store_sums(RowTile& tile) {
  _tile_stored(0, tile.sums[0], kDim * sizeof(float));
  _tile_stored(1, tile.sums[0] + 16, kDim * sizeof(float));
  _tile_stored(2, tile.sums[0] + 32, kDim * sizeof(float));
  _tile_stored(3, tile.sums[0] + 48, kDim * sizeof(float));
}

// The sums leave their tiles to be rescaled: rows whose max moved are multiplied by their correction.
void rescale_sums(RowTile& tile) {
  store_sums(tile);
  for (int r = 0; r < 16; ++r) {
    if (tile.correction[r] == 1.f) continue;
    const __m512 c = _mm512_set1_ps(tile.correction[r]);
    for (int d = 0; d < kDim; d += 16) _mm512_store_ps(tile.sums[r] + d, _mm512_mul_ps(_mm512_load_ps(tile.sums[r] + d), c));
  }
  _tile_loadd(0, tile.sums[0], kDim * sizeof(float));
  _tile_loadd(1, tile.sums[0] + 16, kDim * sizeof(float));
  _tile_loadd(2, tile.sums[0] + 32, kDim * sizeof(float));
  _tile_loadd(3, tile.sums[0] + 48, kDim * sizeof(float));
}
#endif

// e^x for x <= kSlack: Taylor's degree 4 after taking out the power of two (relative error under 1e-4, where
// the weights are rounded to bfloat16's 4e-3 right after), half the work of vec.h's exp16.
inline __m512 exp_for_weights(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945309f), x);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(1.f / 24), _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// One row's scores of a step (x0 the keys t0 .. t0 + 15, x1 the next 16; seen0, seen1 the keys it may see) into
// its 32 weights, rounded to bfloat16, and onto its running max and its partial sums of the rounded weights.
// Returns what the row's p . v sums must be multiplied by: 1 unless the max moved (0 while nothing is summed).
inline float weigh_row(__m512 x0, __m512 x1, __mmask16 seen0, __mmask16 seen1, float scale, float& max,
                       float* partial, void* weights) {
  const __m512 scale_v = _mm512_set1_ps(scale), slack = _mm512_set1_ps(kSlack);
  __m512 m = _mm512_set1_ps(max);
  __m512 y0 = _mm512_fmsub_ps(x0, scale_v, m), y1 = _mm512_fmsub_ps(x1, scale_v, m);
  float correction = 1.f;
  if (_mm512_mask_cmp_ps_mask(seen0, y0, slack, _CMP_GT_OQ) | _mm512_mask_cmp_ps_mask(seen1, y1, slack, _CMP_GT_OQ)) {
    // the row's max moves to this step's: what it summed so far shrinks by e^(before - now)
    const float before = max;
    const float now = std::max(seen0 ? _mm512_mask_reduce_max_ps(seen0, x0) : -kInf,
                               seen1 ? _mm512_mask_reduce_max_ps(seen1, x1) : -kInf) * scale;
    correction = before == -kInf ? 0.f : std::exp(before - now);
    _mm512_store_ps(partial, _mm512_mul_ps(_mm512_load_ps(partial), _mm512_set1_ps(correction)));
    max = now;
    m = _mm512_set1_ps(now);
    y0 = _mm512_fmsub_ps(x0, scale_v, m), y1 = _mm512_fmsub_ps(x1, scale_v, m);
  }
  const __m512 p0 = _mm512_maskz_mov_ps(seen0, exp_for_weights(y0)), p1 = _mm512_maskz_mov_ps(seen1, exp_for_weights(y1));
  const __m512i rounded = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0));  // keys 0-15, then 16-31
  _mm512_store_si512(weights, rounded);
  // the weights as rounded are what p . v multiplies by, so their sum is the normalizer
  const __m512 kept0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(rounded)), 16));
  const __m512 kept1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(rounded, 1)), 16));
  _mm512_store_ps(partial, _mm512_add_ps(_mm512_load_ps(partial), _mm512_add_ps(kept0, kept1)));
  return correction;
}

// A step's key indices (t0 .. t0 + 31), made once per step: which of them a row at `position` may see (all,
// where the step ends at or before the nearest row's position: `causal` false).
struct StepKeys {
  __m512i key0, key1;
  bool causal;

  StepKeys(int64_t t0, bool causal_) : causal(causal_) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    key0 = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(t0)));
    key1 = _mm512_add_epi32(key0, _mm512_set1_epi32(16));
  }

  void seen(int32_t position, __mmask16& seen0, __mmask16& seen1) const {
    seen0 = seen1 = 0xFFFF;
    if (!causal) return;
    const __m512i at = _mm512_set1_epi32(position);
    seen0 = _mm512_cmp_epi32_mask(key0, at, _MM_CMPINT_LE);
    seen1 = _mm512_cmp_epi32_mask(key1, at, _MM_CMPINT_LE);
  }
};

#ifdef LLMSERVE_AMX_PREFILL
// The softmax of one step's scores into bfloat16 weights; returns whether some row's sums need rescaling.
bool weigh_step(RowTile& tile, int64_t t0, bool causal, float scale) {
  const StepKeys keys(t0, causal);
  bool rescale = false;
  for (int r = 0; r < 16; ++r) {
    __mmask16 seen0, seen1;
    keys.seen(tile.position[r], seen0, seen1);
    const float before = tile.max[r];
    tile.correction[r] = weigh_row(_mm512_load_ps(tile.scores[r]), _mm512_load_ps(tile.scores[r] + 16), seen0, seen1,
                                   scale, tile.max[r], tile.partial[r], tile.weights[r]);
    rescale |= tile.max[r] != before && before != -kInf;  // sums that are still zeros need no rescaling
  }
  return rescale;
}

// Pass 2: one task, 16 query rows of one chunk's KV head (row r: head r / n, token r % n; rows past G n repeat
// the last row, computed and dropped) over the head's laid-out context, steps[s] its step s.
void attend_rows(const BF16* q, int64_t q_stride, BF16* out, int64_t out_stride, StepOperands* const* steps,
                 int64_t n, int64_t context_len, int64_t kv, int64_t G, int64_t tile_index, float scale, RowTile& tile) {
  int32_t nearest = std::numeric_limits<int32_t>::max(), furthest = 0;
  for (int64_t r = 0; r < 16; ++r) {
    const int64_t row = std::min(16 * tile_index + r, G * n - 1), g = row / n, i = row % n;
    tile.position[r] = static_cast<int32_t>(context_len - n + i);
    nearest = std::min(nearest, tile.position[r]), furthest = std::max(furthest, tile.position[r]);
    std::memcpy(tile.queries[r], q + i * q_stride + (kv * G + g) * kDim, kDim * sizeof(BF16));
    tile.max[r] = -kInf;
    _mm512_store_ps(tile.partial[r], _mm512_setzero_ps());
  }
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; kStep * s <= furthest; ++s) {
    const StepOperands& step = *steps[s];
    _tile_zero(4);
    _tile_zero(5);
    for (int h = 0; h < 2; ++h) {
      _tile_loadd(6, tile.queries[0] + 32 * h, kDim * sizeof(BF16));
      _tile_loadd(7, step.keys[h][0], 64);
      _tile_dpbf16ps(4, 6, 7);
      _tile_loadd(7, step.keys[h][1], 64);
      _tile_dpbf16ps(5, 6, 7);
    }
    _tile_stored(4, tile.scores[0], kStep * sizeof(float));
    _tile_stored(5, tile.scores[0] + 16, kStep * sizeof(float));
    const int64_t t0 = kStep * s;
    if (weigh_step(tile, t0, t0 + kStep - 1 > nearest, scale)) rescale_sums(tile);
    _tile_loadd(6, tile.weights[0], kStep * sizeof(BF16));
    _tile_loadd(7, step.values[0], kDim * 4);
    _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(7, step.values[0] + 16, kDim * 4);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(7, step.values[0] + 32, kDim * 4);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(7, step.values[0] + 48, kDim * 4);
    _tile_dpbf16ps(3, 6, 7);
  }
  store_sums(tile);
  for (int64_t r = 0; r < 16 && 16 * tile_index + r < G * n; ++r) {
    const int64_t row = 16 * tile_index + r, g = row / n, i = row % n;
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_load_ps(tile.partial[r])));
    BF16* dst = out + i * out_stride + (kv * G + g) * kDim;
    for (int c = 0; c < kDim; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(tile.sums[r] + c), inv))));
  }
}
#endif

// The laid-out context, kept by the calling thread between calls (a fresh allocation of this size would be
// fresh pages, faulted in on every call).
StepOperands* operands_for(int64_t count) {
  struct Buffer {
    StepOperands* data = nullptr;
    int64_t capacity = 0;
    ~Buffer() { std::free(data); }
  };
  static thread_local Buffer buffer;
  if (count > buffer.capacity) {
    std::free(buffer.data);
    buffer.data = static_cast<StepOperands*>(std::aligned_alloc(64, count * sizeof(StepOperands)));
    TORCH_CHECK(buffer.data != nullptr, "prefill_attention: out of memory for the laid-out context");
    buffer.capacity = count;
  }
  return buffer.data;
}

// Which laid-out step each chunk's step s reads: chunks over the same cached prefix share its blocks, so a
// step of 32 whole keys is keyed by the pool slots of its two halves and laid out once for all of them.
struct Plan {
  std::vector<int64_t> first_step;     // [C + 1]: chunk c's steps are entries first_step[c] ..
  std::vector<int64_t> unique_of;      // [all steps]: the laid-out step each reads
  std::vector<int64_t> chunk_of, step_of;  // [unique steps]: a chunk and step that lays it out
};

Plan plan_steps(const int64_t* tables, int64_t table_width, const int64_t* chunks, int64_t C, int64_t block_size) {
  Plan plan;
  plan.first_step.assign(C + 1, 0);
  for (int64_t c = 0; c < C; ++c) plan.first_step[c + 1] = plan.first_step[c] + (chunks[3 * c + 2] + kStep - 1) / kStep;
  const int64_t total = plan.first_step[C];
  plan.unique_of.resize(total);
  int64_t slots = 16;
  while (slots < 2 * total) slots *= 2;
  struct Entry {  // open addressing on the two halves' pool slots, compared whole (a hash alone may collide)
    uint64_t first = 0, second = 0;
    int64_t unique = -1;
  };
  std::vector<Entry> seen(slots);
  for (int64_t c = 0; c < C; ++c) {
    const int64_t* table = tables + c * table_width;
    const int64_t context_len = chunks[3 * c + 2];
    for (int64_t st = 0; kStep * st < context_len; ++st) {
      const int64_t t0 = kStep * st;
      int64_t* unique = &plan.unique_of[plan.first_step[c] + st];
      if (t0 + kStep <= context_len) {
        const auto slot = [&](int64_t t) { return static_cast<uint64_t>(table[t / block_size] * block_size + t % block_size); };
        const uint64_t first = slot(t0), second = slot(t0 + 16), mixed = first * 0x9E3779B97F4A7C15ull ^ second;
        uint64_t h = (mixed ^ (mixed >> 29)) & (slots - 1);
        while (seen[h].unique >= 0 && (seen[h].first != first || seen[h].second != second)) h = (h + 1) & (slots - 1);
        if (seen[h].unique >= 0) {
          *unique = seen[h].unique;
          continue;
        }
        seen[h] = {first, second, static_cast<int64_t>(plan.chunk_of.size())};
      }
      *unique = static_cast<int64_t>(plan.chunk_of.size());
      plan.chunk_of.push_back(c);
      plan.step_of.push_back(st);
    }
  }
  return plan;
}

constexpr int kRowsAvx = 4;  // query rows per task without AMX: their 4 x 64 p . v sums fill 16 registers

struct alignas(64) RowsAvx {  // one task's query rows (as pairs of dimensions) and softmax state
  uint32_t queries[kRowsAvx][kDim / 2];
  uint32_t weights[kRowsAvx][kStep / 2];  // the step's weights rounded to bfloat16, as pairs of keys
  float partial[kRowsAvx][16];            // each row's sum of rounded weights, 16 lanes apart
  float max[kRowsAvx];
  int32_t position[kRowsAvx];
};

inline __m512bh as_bf16(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Pass 2 without AMX: rows [4 t, 4 t + 4) of one chunk's KV head (as attend_rows: row r is head r / n, token
// r % n; rows past G n repeat the last row, computed and dropped) over the head's laid-out context.
void attend_rows_avx512(const BF16* q, int64_t q_stride, BF16* out, int64_t out_stride, StepOperands* const* steps,
                        int64_t n, int64_t context_len, int64_t kv, int64_t G, int64_t tile_index, float scale,
                        RowsAvx& rows) {
  constexpr int R = kRowsAvx;
  int32_t nearest = std::numeric_limits<int32_t>::max(), furthest = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t row = std::min(R * tile_index + r, G * n - 1), g = row / n, i = row % n;
    rows.position[r] = static_cast<int32_t>(context_len - n + i);
    nearest = std::min(nearest, rows.position[r]), furthest = std::max(furthest, rows.position[r]);
    std::memcpy(rows.queries[r], q + i * q_stride + (kv * G + g) * kDim, kDim * sizeof(BF16));
    rows.max[r] = -kInf;
    _mm512_store_ps(rows.partial[r], _mm512_setzero_ps());
  }
  __m512 sums[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) sums[r][c] = _mm512_setzero_ps();
  for (int64_t s = 0; kStep * s <= furthest; ++s) {
    const StepOperands& step = *steps[s];
    // q . k: 16 keys a register, one pair of dimensions a multiply-add
    __m512 scores[R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) scores[r][0] = scores[r][1] = _mm512_setzero_ps();
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
      for (int p = 0; p < 16; ++p) {
        const __m512bh k0 = as_bf16(_mm512_load_si512(step.keys[h][0][p]));
        const __m512bh k1 = as_bf16(_mm512_load_si512(step.keys[h][1][p]));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512bh pair = as_bf16(_mm512_set1_epi32(static_cast<int32_t>(rows.queries[r][16 * h + p])));
          scores[r][0] = _mm512_dpbf16_ps(scores[r][0], k0, pair);
          scores[r][1] = _mm512_dpbf16_ps(scores[r][1], k1, pair);
        }
      }
    }
    // the online softmax (weigh_row)
    const StepKeys keys(kStep * s, kStep * s + kStep - 1 > nearest);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __mmask16 seen0, seen1;
      keys.seen(rows.position[r], seen0, seen1);
      const float correction = weigh_row(scores[r][0], scores[r][1], seen0, seen1, scale, rows.max[r], rows.partial[r],
                                         rows.weights[r]);
      if (correction != 1.f) {
        const __m512 c = _mm512_set1_ps(correction);
#pragma GCC unroll 4
        for (int d = 0; d < 4; ++d) sums[r][d] = _mm512_mul_ps(sums[r][d], c);
      }
    }
    // p . v: 16 dimensions a register, one pair of keys a multiply-add
#pragma GCC unroll 2
    for (int i = 0; i < kStep / 2; ++i) {
      __m512bh v[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) v[c] = as_bf16(_mm512_load_si512(step.values[i] + 16 * c));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512bh pair = as_bf16(_mm512_set1_epi32(static_cast<int32_t>(rows.weights[r][i])));
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) sums[r][c] = _mm512_dpbf16_ps(sums[r][c], v[c], pair);
      }
    }
  }
#pragma GCC unroll 4
  for (int64_t r = 0; r < R; ++r) {
    if (R * tile_index + r >= G * n) break;
    const int64_t row = R * tile_index + r, g = row / n, i = row % n;
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_load_ps(rows.partial[r])));
    BF16* dst = out + i * out_stride + (kv * G + g) * kDim;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * c),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_mul_ps(sums[r][c], inv))));
  }
}
#endif

}  // namespace

namespace llmserve {

bool prefill_attention_supported() {
#ifdef LLMSERVE_BF16_PREFILL
  return true;
#else
  return false;
#endif
}

// Every chunk of a step in one call: chunks [C, 3] int64 rows (first token in q and out, tokens, context
// length with the chunk), block_tables [C, width] int64.
void prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_tables, const at::Tensor& chunks, double scale, const at::Tensor& out) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: this build or CPU has neither AMX nor AVX512-BF16");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "prefill_attention: bfloat16 only");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && q.stride(2) == 1 && q.stride(1) == q.size(2) &&
                  out.stride(2) == 1 && out.stride(1) == out.size(2),
              "prefill_attention: q and out [T, H, D], each token's heads contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "prefill_attention: caches [KV, num_blocks, block_size, D], contiguous");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(0), block_size = k_cache.size(2);
  TORCH_CHECK(D == 64 && k_cache.size(3) == 64, "prefill_attention: head size 64 only");
  TORCH_CHECK(H % KV == 0, "prefill_attention: query heads must be a multiple of KV heads");
  TORCH_CHECK(block_size % 16 == 0, "prefill_attention: blocks of a multiple of 16 tokens");
  TORCH_CHECK(chunks.scalar_type() == at::kLong && chunks.dim() == 2 && chunks.size(1) == 3 && chunks.is_contiguous(),
              "prefill_attention: chunks [C, 3] int64 (start, tokens, context length)");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 && block_tables.is_contiguous() &&
                  block_tables.size(0) == chunks.size(0),
              "prefill_attention: block_tables [C, width] int64, a row per chunk");
#ifdef LLMSERVE_BF16_PREFILL
#ifdef LLMSERVE_AMX_PREFILL
  const bool tiles = llmserve::tiles_permitted();
#else
  constexpr bool tiles = false;
#endif
  const int64_t rows_per_task = tiles ? 16 : kRowsAvx;
  const int64_t C = chunks.size(0), width = block_tables.size(1), G = H / KV, num_blocks = k_cache.size(1);
  const int64_t* chunk_rows = chunks.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  std::vector<int64_t> first_task(C + 1, 0);  // chunk c's tasks (a KV head's rows_per_task query rows each) start here
  for (int64_t c = 0; c < C; ++c) {
    const int64_t start = chunk_rows[3 * c], n = chunk_rows[3 * c + 1], context_len = chunk_rows[3 * c + 2];
    TORCH_CHECK(n >= 1 && start >= 0 && start + n <= T, "prefill_attention: a chunk outside q");
    TORCH_CHECK(context_len >= n && context_len < std::numeric_limits<int32_t>::max(),
                "prefill_attention: the context holds the chunk");
    TORCH_CHECK(width * block_size >= context_len, "prefill_attention: a block table shorter than its context");
    for (int64_t b = 0; b < (context_len + block_size - 1) / block_size; ++b)
      TORCH_CHECK(tables[c * width + b] >= 0 && tables[c * width + b] < num_blocks,
                  "prefill_attention: block id out of range");
    first_task[c + 1] = first_task[c] + KV * ((G * n + rows_per_task - 1) / rows_per_task);
  }
  const Plan plan = plan_steps(tables, width, chunk_rows, C, block_size);
  const int64_t unique = static_cast<int64_t>(plan.chunk_of.size());
  const BF16* qp = q.data_ptr<BF16>();
  BF16* op = out.data_ptr<BF16>();
  const BF16* kp = k_cache.data_ptr<BF16>();
  const BF16* vp = v_cache.data_ptr<BF16>();
  const int64_t head_stride = num_blocks * block_size * kDim;
  StepOperands* operands = operands_for(KV * unique);  // [KV][unique steps]
  at::parallel_for(0, KV * unique, 4, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv = task / unique, u = task % unique, c = plan.chunk_of[u];
      lay_out_step(kp + kv * head_stride, vp + kv * head_stride, tables + c * width, block_size,
                   chunk_rows[3 * c + 2], plan.step_of[u], operands[task]);
    }
  });
  // chunk c's KV head and row tile of a task, and the laid-out steps it walks
  const auto task_of = [&](int64_t task, std::vector<StepOperands*>& steps, int64_t& c, int64_t& kv, int64_t& tile) {
    c = std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
    const int64_t tiles_per_head = (G * chunk_rows[3 * c + 1] + rows_per_task - 1) / rows_per_task;
    kv = (task - first_task[c]) / tiles_per_head, tile = (task - first_task[c]) % tiles_per_head;
    steps.clear();
    for (int64_t i = plan.first_step[c]; i < plan.first_step[c + 1]; ++i)
      steps.push_back(operands + kv * unique + plan.unique_of[i]);
  };
#ifdef LLMSERVE_AMX_PREFILL
  if (tiles) {
    at::parallel_for(0, first_task[C], 1, [&](int64_t begin, int64_t end) {
      auto tile = std::make_unique<RowTile>();
      std::vector<StepOperands*> steps;
      configure();
      for (int64_t task = begin; task < end; ++task) {
        int64_t c, kv, index;
        task_of(task, steps, c, kv, index);
        const int64_t start = chunk_rows[3 * c];
        attend_rows(qp + start * q.stride(0), q.stride(0), op + start * out.stride(0), out.stride(0), steps.data(),
                    chunk_rows[3 * c + 1], chunk_rows[3 * c + 2], kv, G, index, static_cast<float>(scale), *tile);
      }
      _tile_release();
    });
    return;
  }
#endif
  at::parallel_for(0, first_task[C], 4, [&](int64_t begin, int64_t end) {
    auto rows = std::make_unique<RowsAvx>();
    std::vector<StepOperands*> steps;
    for (int64_t task = begin; task < end; ++task) {
      int64_t c, kv, index;
      task_of(task, steps, c, kv, index);
      const int64_t start = chunk_rows[3 * c];
      attend_rows_avx512(qp + start * q.stride(0), q.stride(0), op + start * out.stride(0), out.stride(0), steps.data(),
                         chunk_rows[3 * c + 1], chunk_rows[3 * c + 2], kv, G, index, static_cast<float>(scale), *rows);
    }
  });
#else
  (void)T, (void)scale, (void)out;
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def(
      "prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor chunks, "
      "float scale, Tensor(a!) out) -> ()");
  m.def("prefill_attention_supported() -> bool", &llmserve::prefill_attention_supported);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("prefill_attention", &llmserve::prefill_attention); }
