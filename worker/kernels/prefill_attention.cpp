// Attention of one prefill chunk over its sequence's paged K/V (the cached context and the chunk's own rows),
// on AMX tiles, for a bfloat16 cache of head size 64.
//
// The torch path gathers the context's blocks into a contiguous copy per layer (index_select) and calls
// SDPA's CPU flash kernel per chunk; for eight requests of 32 new tokens over a cached 512-token prefix that
// was 39 ms of a 100 ms step on a 2-core AMX Xeon (SDPA ~0.3 TFLOP/s at these shapes). Here each task is one
// KV head and 16 query rows (the group's query heads stacked as rows, as the grouped-rows SDPA path does):
// the rows stay in two A tiles for the whole walk, and each 16-token block of the pool is read where it lies:
// K's block transposed once into the B operand's pairs of dimensions (two tiles), scores 16 x 16 in one C
// tile, an online softmax per row in float32 (FlashAttention's running max and sum), the weights rounded to
// bfloat16 as the decode kernels do, and p . v against V's block interleaved in pairs of tokens (four tiles of
// 16 dimensions), added into the rows' float32 sums after rescaling them by the change of the running max.
// A query sees the keys at or before its own position (context_len - n + i): causal within the chunk.
//
// Layouts: q, out [n, H, D] bfloat16, contiguous, D = 64; k_cache, v_cache [KV, num_blocks, block_size, D],
// block_size a multiple of 16; block_table [>= ceil(context_len / block_size)] int64.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "amx.h"
#include "vec.h"

#if defined(LLMSERVE_AMX) && defined(LLMSERVE_AVX512)
#define LLMSERVE_AMX_PREFILL 1
#endif

namespace {

#ifdef LLMSERVE_AMX_PREFILL
using BF16 = c10::BFloat16;
constexpr int64_t kDim = 64;

// Tiles: 1, 2 the query rows (dimensions 0-31, 32-63); 0 scores, then with 3, 6, 7 the four quarters of
// p . v; 3 K's pairs of dimensions before that; 4 the weights (16 rows x 16 tokens); 5 V's pairs of tokens.
void configure() {
  llmserve::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  cfg.colsb[4] = 32;  // 16 tokens of bfloat16
  cfg.rows[5] = 8;    // 8 pairs of tokens
  _tile_loadconfig(&cfg);
}

constexpr int64_t kTilesPerTask = 4;  // query tiles sharing one pass over the context's blocks

struct RowTile {  // one tile of 16 query rows: its rows, positions and running softmax state
  alignas(64) BF16 queries[16][kDim];
  alignas(64) float sums[16][kDim];
  int64_t position[16];
  int64_t furthest;  // the largest position: blocks past it are seen by no row of the tile
  float max[16], total[16];
};

struct Scratch {
  alignas(64) uint32_t keys[2][16][16];  // [dimension half][pair of dimensions][token]
  alignas(64) uint32_t values[8][kDim];  // [pair of tokens][dimension]
  alignas(64) float scores[16][16];
  alignas(64) BF16 weights[16][16];
  alignas(64) float quarter[16][16];
  RowTile tiles[kTilesPerTask];
};

// K's 16 rows (64 dimensions) as B tiles: keys[h][p][t] = the pair (k[t][32h + 2p], k[t][32h + 2p + 1]), a
// 16 x 16 transpose of 32-bit words per half: pairs of rows interleaved, then pairs of pairs, then the four
// 128-bit lanes across vectors (64 shuffles a half, where 16 gathers cost several times that).
void transpose_keys(const BF16* block_rows, Scratch& s) {
  const auto* words = reinterpret_cast<const int*>(block_rows);  // [16 tokens][32 pairs]
  for (int h = 0; h < 2; ++h) {
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
      _mm512_store_si512(s.keys[h][k], _mm512_shuffle_i32x4(x0, x2, 0x88));
      _mm512_store_si512(s.keys[h][4 + k], _mm512_shuffle_i32x4(x0, x2, 0xDD));
      _mm512_store_si512(s.keys[h][8 + k], _mm512_shuffle_i32x4(x1, x3, 0x88));
      _mm512_store_si512(s.keys[h][12 + k], _mm512_shuffle_i32x4(x1, x3, 0xDD));
    }
  }
}

// V's 16 rows as B tiles: values[i][d] = the pair (v[2i][d], v[2i + 1][d]); rows from `valid` on (past the
// context) are zeros, not the pool's contents: a weight of 0 times a NaN there would still be NaN.
void pair_values(const BF16* block_rows, int64_t valid, Scratch& s) {
  const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
  for (int i = 0; i < 8; ++i) {
    const BF16* a = block_rows + 2 * i * kDim;
    const BF16* b = a + kDim;
    for (int half = 0; half < 2; ++half) {
      const __m512i x = 2 * i < valid ? _mm512_loadu_si512(a + 32 * half) : _mm512_setzero_si512();
      const __m512i y = 2 * i + 1 < valid ? _mm512_loadu_si512(b + 32 * half) : _mm512_setzero_si512();
      _mm512_store_si512(s.values[i] + 32 * half, _mm512_permutex2var_epi16(x, first, y));
      _mm512_store_si512(s.values[i] + 32 * half + 16, _mm512_permutex2var_epi16(x, second, y));
    }
  }
}

// One block of 16 keys for one tile of query rows: scores, the online softmax, p . v into the sums.
void attend_block(RowTile& tile, int64_t t0, float scale, Scratch& s) {
  _tile_loadd(1, tile.queries[0], kDim * sizeof(BF16));
  _tile_loadd(2, tile.queries[0] + 32, kDim * sizeof(BF16));
  _tile_zero(0);
  _tile_loadd(3, s.keys[0], 64);
  _tile_dpbf16ps(0, 1, 3);
  _tile_loadd(3, s.keys[1], 64);
  _tile_dpbf16ps(0, 2, 3);
  _tile_stored(0, s.scores, 64);
  const __m512 keys = _mm512_add_ps(_mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                    _mm512_set1_ps(static_cast<float>(t0)));
  alignas(64) float new_max[16], correction[16];
  __mmask16 seen[16];
  for (int r = 0; r < 16; ++r) {  // each row's running max over these keys
    seen[r] = _mm512_cmp_ps_mask(keys, _mm512_set1_ps(static_cast<float>(tile.position[r])), _CMP_LE_OQ);
    const float block_max =
        seen[r] ? _mm512_mask_reduce_max_ps(seen[r], _mm512_load_ps(s.scores[r])) * scale : -std::numeric_limits<float>::infinity();
    new_max[r] = std::max(tile.max[r], block_max);
  }
  {  // the sixteen rows' rescaling of what they summed so far, one vector exp (a row seeing nothing yet: 1)
    const __m512 now = _mm512_load_ps(new_max), before = _mm512_loadu_ps(tile.max);
    const __mmask16 empty = _mm512_cmp_ps_mask(now, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    const __m512 factor = llmserve::exp16(_mm512_sub_ps(_mm512_mask_blend_ps(empty, before, _mm512_setzero_ps()),
                                                        _mm512_mask_blend_ps(empty, now, _mm512_setzero_ps())));
    _mm512_store_ps(correction, _mm512_mask_blend_ps(empty, factor, _mm512_set1_ps(1.f)));
  }
  for (int r = 0; r < 16; ++r) {
    const __m512 x = _mm512_mul_ps(_mm512_load_ps(s.scores[r]), _mm512_set1_ps(scale));
    const __m512 p = _mm512_maskz_mov_ps(seen[r], llmserve::exp16(_mm512_sub_ps(x, _mm512_set1_ps(new_max[r]))));
    const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p));
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.weights[r]), rounded);
    // the weights as rounded are what p . v multiplies by, so their sum is the normalizer
    const __m512 kept = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
    tile.total[r] = tile.total[r] * correction[r] + _mm512_reduce_add_ps(kept);
    tile.max[r] = new_max[r];
  }
  _tile_loadd(4, s.weights[0], 32);
  for (int quarter = 0; quarter < 4; ++quarter) {
    _tile_loadd(5, s.values[0] + 16 * quarter, kDim * 4);
    _tile_zero(0);
    _tile_dpbf16ps(0, 4, 5);
    _tile_stored(0, s.quarter, 64);
    for (int r = 0; r < 16; ++r) {
      float* sum = tile.sums[r] + 16 * quarter;
      _mm512_store_ps(sum, _mm512_fmadd_ps(_mm512_load_ps(sum), _mm512_set1_ps(correction[r]), _mm512_load_ps(s.quarter[r])));
    }
  }
}

// One KV head, query tiles [first, last) of its stacked group (row r: head r / n, token r % n; rows past G n
// repeat the last row, computed and dropped). Each block of keys is laid out once for all these tiles.
void attend_tiles(const BF16* q, BF16* out, const BF16* k_head, const BF16* v_head, const int64_t* table,
                  int64_t block_size, int64_t n, int64_t context_len, int64_t H, int64_t kv, int64_t G,
                  int64_t first, int64_t last, float scale, Scratch& s) {
  int64_t furthest = 0;  // keys past the furthest row's position are seen by no row here
  for (int64_t t = first; t < last; ++t) {
    RowTile& tile = s.tiles[t - first];
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t row = std::min(16 * t + r, G * n - 1), g = row / n, i = row % n;
      tile.position[r] = context_len - n + i;
      furthest = std::max(furthest, tile.position[r]);
      std::memcpy(tile.queries[r], q + (i * H + kv * G + g) * kDim, kDim * sizeof(BF16));
      tile.max[r] = -std::numeric_limits<float>::infinity();
      tile.total[r] = 0.f;
    }
    std::memset(tile.sums, 0, sizeof(tile.sums));
    tile.furthest = *std::max_element(tile.position, tile.position + 16);
  }
  for (int64_t t0 = 0; t0 <= furthest; t0 += 16) {
    const int64_t offset = (table[t0 / block_size] * block_size + t0 % block_size) * kDim;
    transpose_keys(k_head + offset, s);
    pair_values(v_head + offset, context_len - t0, s);
    for (int64_t t = first; t < last; ++t) {
      RowTile& tile = s.tiles[t - first];
      if (t0 <= tile.furthest) attend_block(tile, t0, scale, s);
    }
  }
  for (int64_t t = first; t < last; ++t) {
    const RowTile& tile = s.tiles[t - first];
    for (int64_t r = 0; r < 16 && 16 * t + r < G * n; ++r) {
      const int64_t row = 16 * t + r, g = row / n, i = row % n;
      const __m512 inv = _mm512_set1_ps(1.f / tile.total[r]);
      BF16* dst = out + (i * H + kv * G + g) * kDim;
      for (int c = 0; c < kDim; c += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(tile.sums[r] + c), inv))));
    }
  }
}
#endif

}  // namespace

namespace llmserve {

bool prefill_attention_supported() {
#ifdef LLMSERVE_AMX_PREFILL
  return llmserve::tiles_permitted();
#else
  return false;
#endif
}

void prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_table, int64_t context_len, double scale, const at::Tensor& out) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: this build or CPU has no AMX bfloat16 tiles");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "prefill_attention: bfloat16 only");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && q.is_contiguous() && out.is_contiguous(),
              "prefill_attention: q and out [n, H, D], contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "prefill_attention: caches [KV, num_blocks, block_size, D], contiguous");
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(0), block_size = k_cache.size(2);
  TORCH_CHECK(D == 64 && k_cache.size(3) == 64, "prefill_attention: head size 64 only");
  TORCH_CHECK(H % KV == 0, "prefill_attention: query heads must be a multiple of KV heads");
  TORCH_CHECK(block_size % 16 == 0, "prefill_attention: blocks of a multiple of 16 tokens");
  TORCH_CHECK(n >= 1 && context_len >= n, "prefill_attention: the context holds the chunk");
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.is_contiguous() &&
                  block_table.numel() * block_size >= context_len,
              "prefill_attention: an int64 block table covering the context");
#ifdef LLMSERVE_AMX_PREFILL
  const int64_t G = H / KV, tiles = (G * n + 15) / 16, num_blocks = k_cache.size(1);
  const int64_t* table = block_table.data_ptr<int64_t>();
  for (int64_t b = 0; b < (context_len + block_size - 1) / block_size; ++b)
    TORCH_CHECK(table[b] >= 0 && table[b] < num_blocks, "prefill_attention: block id out of range");
  const BF16* qp = q.data_ptr<BF16>();
  BF16* op = out.data_ptr<BF16>();
  const BF16* kp = k_cache.data_ptr<BF16>();
  const BF16* vp = v_cache.data_ptr<BF16>();
  const int64_t parts = (tiles + kTilesPerTask - 1) / kTilesPerTask;
  at::parallel_for(0, KV * parts, 1, [&](int64_t begin, int64_t end) {
    auto scratch = std::make_unique<Scratch>();
    configure();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv = task / parts, first = (task % parts) * kTilesPerTask;
      const int64_t head = kv * num_blocks * block_size * 64;
      attend_tiles(qp, op, kp + head, vp + head, table, block_size, n, context_len, H, kv, G, first,
                   std::min(tiles, first + kTilesPerTask), static_cast<float>(scale), *scratch);
    }
    _tile_release();
  });
#else
  (void)scale, (void)out;
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def(
      "prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, int context_len, "
      "float scale, Tensor(a!) out) -> ()");
  m.def("prefill_attention_supported() -> bool", &llmserve::prefill_attention_supported);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("prefill_attention", &llmserve::prefill_attention); }
