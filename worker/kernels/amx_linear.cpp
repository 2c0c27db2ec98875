// y = x @ W.T for bfloat16 x and W on AMX tiles, for decode batches and prefill chunks alike.
//
// oneDNN's AMX GEMM reads the weights at 12-17 GB/s on a 2-core AMX Xeon at decode row counts, where the same
// cores stream 40+ GB/s with software prefetch (int8_linear.cpp's one-row kernel): a decode step is mostly
// the reading of 270 MB of SmolLM2's bfloat16 weights. Here the weights are laid out once, at load time
// (amx_pack_weight), as AMX's B operand: per block of 16 output channels, per pair of input columns, the 16
// channels' pairs side by side, so one tile (32 columns by 16 channels) is 1 KB of contiguous memory and a
// block of channels one contiguous run, read in order and prefetched 8 KB ahead. x is the A operand as it
// is (16 rows by 32 columns per tile, straight from its rows); C is 16 x rows by 16 channels in float32,
// rounded to bfloat16 into out. Two channel blocks and two groups of 16 x rows run together (all eight
// tiles); past 32 rows the channel blocks are read again from L2. Products of bfloat16 pairs are exact and
// summed in float32, as in oneDNN (the order of the sums differs).
//
// amx_linear_silu_mul runs an MLP's [gate; up] projection and its activation in one pass: the two blocks of a
// pass are gate's block b and up's block b, so both C tiles of a row group are at hand and silu(gate) * up is
// written straight from them (a 512-token prefill step on SmolLM2 9-15% shorter, docs/STUDY_LOG.md: the
// [M, 2 I] product was written, then read back by a separate pass).
//
// Layouts: x [M, K] bfloat16, contiguous; packed [N / 16, K / 2, 32] bfloat16 from amx_pack_weight(w [N, K]),
// K a multiple of 32 and N of 32; out [M, N] bfloat16, written ([M, N / 2] for amx_linear_silu_mul).
// amx_linear_supported() says whether this build and CPU can run them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "ops.h"
#include "vec.h"

namespace {

#ifdef LLMSERVE_AMX
using BF16 = c10::BFloat16;
// Tiles of the two-by-two pass: C for (row group g, channel block b) is
// tile 2g + b; A (row group g) 4 + g; B (channel block b) 6 + b. A and C tiles hold `rows` rows (M itself
// below 16 rows, else 16 with the rows padded to whole groups); every tile row is 64 bytes.
void configure_pairs(int rows) {
  llmserve::TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  for (int t : {0, 1, 2, 3, 4, 5}) cfg.rows[t] = static_cast<uint8_t>(rows);
  cfg.rows[6] = cfg.rows[7] = 16;
  _tile_loadconfig(&cfg);
}

// How far ahead of the weight tiles in use they are prefetched: 2, 4, 8 and 16 KB were within noise of each
// other (a 1-row step of SmolLM2's bfloat16 linears 10.9-11.3 ms); without it, 14 ms.
constexpr int64_t kPairPrefetchBytes = 4096;

// Two channel blocks (B tiles: 1 KB a step, read in order from w0 and from w1) against every group of 16 rows
// of a (row_bytes apart, 64 bytes a step), two groups at a time, over `steps` steps of bfloat16 pairs into
// float32 (TDPBF16PS); the first pass over the rows prefetches the blocks ahead (never past weights_end). Per
// row group g, its two C tiles then go to scratch (block w0's 16 x 16 floats, then w1's) and to
// store(g, scratch).
template <typename Store>
void tile_pair_pass(const char* a, int64_t row_bytes, int64_t groups, const char* w0, const char* w1,
                    int64_t steps, const char* weights_end, float* scratch, const Store& store) {
  for (int64_t g0 = 0; g0 < groups; g0 += 2) {
    const bool two = g0 + 1 < groups;
    const char* a0 = a + g0 * 16 * row_bytes;
    const char* a1 = a0 + 16 * row_bytes;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t step = 0; step < steps; ++step) {
      const char* t0 = w0 + step * 1024;
      const char* t1 = w1 + step * 1024;
      if (g0 == 0)  // the two blocks' tiles are read in order
        for (int64_t line = 0; line < 1024; line += 64)
          for (const char* t : {t0, t1}) {
            const char* ahead = t + kPairPrefetchBytes + line;
            if (ahead < weights_end) _mm_prefetch(ahead, _MM_HINT_T0);
          }
      _tile_loadd(6, t0, 64);
      _tile_loadd(7, t1, 64);
      _tile_loadd(4, a0 + step * 64, row_bytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, a1 + step * 64, row_bytes);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, scratch, 64);  // tile numbers are immediates
    _tile_stored(1, scratch + 256, 64);
    store(g0, static_cast<const float*>(scratch));
    if (two) {
      _tile_stored(2, scratch, 64);
      _tile_stored(3, scratch + 256, 64);
      store(g0 + 1, static_cast<const float*>(scratch));
    }
  }
}

// C tile (rows x 16 channels, float32) into out rows [m0, m0 + rows) that exist, channels [n0, n0 + 16).
void store_tile(const float* c_tile, int64_t m0, int64_t rows, int64_t M, int64_t N, int64_t n0, BF16* out) {
  for (int64_t r = 0; r < rows && m0 + r < M; ++r)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (m0 + r) * N + n0),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(c_tile + 16 * r))));
}

// Channel blocks b0, b0 + 1 (32 channels) against every group of x rows, two groups at a time (tile_pair_pass above).
void channel_pair(const BF16* x, int64_t M, int64_t groups, int rows, int64_t K, const BF16* packed, int64_t N,
                  int64_t b0, BF16* out, float* scratch) {
  const int64_t block_bytes = 16 * K * 2;  // one channel block: K / 2 pairs of 16 channels
  const char* w0 = reinterpret_cast<const char*>(packed) + b0 * block_bytes;
  tile_pair_pass(reinterpret_cast<const char*>(x), K * 2, groups, w0, w0 + block_bytes, K / 32,
                 reinterpret_cast<const char*>(packed) + (N / 16) * block_bytes, scratch,
                 [&](int64_t g, const float* sums) {
                   store_tile(sums, g * 16, rows, M, N, b0 * 16, out);
                   store_tile(sums + 256, g * 16, rows, M, N, (b0 + 1) * 16, out);
                 });
}

// The gated activation of a [gate; up] layer's block b (channels b * 16 .. + 16 of gate and of up, which are
// blocks b and b + I / 16 of the packed weight) for every group of x rows: out = silu(gate) * up, with gate and
// up rounded to bfloat16 first and silu_and_mul's own arithmetic (vec.h's silu_mul16), so the result has the
// bits of amx_linear followed by silu_and_mul, without writing and reading the [M, 2 I] product.
void gated_block(const BF16* x, int64_t M, int64_t groups, int rows, int64_t K, const BF16* packed, int64_t I,
                 int64_t b, BF16* out, float* scratch) {
  const int64_t block_bytes = 16 * K * 2;
  const char* gate = reinterpret_cast<const char*>(packed) + b * block_bytes;
  const BF16* as_bf16 = nullptr;  // selects bfloat16 rounding
  tile_pair_pass(reinterpret_cast<const char*>(x), K * 2, groups, gate, gate + (I / 16) * block_bytes, K / 32,
                 reinterpret_cast<const char*>(packed) + (2 * I / 16) * block_bytes, scratch,
                 [&](int64_t g, const float* sums) {
                   for (int64_t r = 0; r < rows && g * 16 + r < M; ++r) {
                     const __m512 gv = llmserve::round_through16(_mm512_loadu_ps(sums + 16 * r), as_bf16);
                     const __m512 uv = llmserve::round_through16(_mm512_loadu_ps(sums + 256 + 16 * r), as_bf16);
                     llmserve::store16(out + (g * 16 + r) * I + b * 16, llmserve::silu_mul16(gv, uv, as_bf16));
                   }
                 });
}
#endif

}  // namespace

namespace llmserve {

bool amx_linear_supported() {
#ifdef LLMSERVE_AMX
  return llmserve::tiles_permitted();
#else
  return false;
#endif
}

void amx_pack_weight(const at::Tensor& w, const at::Tensor& packed) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(),
              "amx_pack_weight: w must be a contiguous bfloat16 [N, K] CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % 32 == 0 && N % 32 == 0, "amx_pack_weight: K and N must be multiples of 32");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && packed.numel() == N * K,
              "amx_pack_weight: packed must be a contiguous bfloat16 tensor of N * K elements");
  const auto* src = reinterpret_cast<const uint32_t*>(w.data_ptr());  // pairs of columns
  auto* dst = reinterpret_cast<uint32_t*>(packed.data_ptr());
  const int64_t pairs = K / 2;
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t p = 0; p < pairs; ++p)
        for (int64_t c = 0; c < 16; ++c) dst[(b * pairs + p) * 16 + c] = src[(b * 16 + c) * pairs + p];
  });
}

namespace {
// The checks both entry points make; returns M, K and the packed weight's N.
struct Shape {
  int64_t M, K, N;
};
Shape check_amx_args(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out, const char* name) {
  TORCH_CHECK(amx_linear_supported(), name, ": this build or CPU has no AMX bfloat16 tiles");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && out.device().is_cpu(), name, " runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 &&
                  out.scalar_type() == at::kBFloat16,
              name, ": bfloat16 x, packed weight and out");
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && packed.dim() == 3 && packed.size(2) == 32,
              name, ": x [M, K], packed [N / 16, K / 2, 32], out [M, ...]");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 16;
  TORCH_CHECK(packed.size(1) * 2 == K && out.size(0) == M, name, ": shapes differ");
  TORCH_CHECK(M >= 1 && K % 32 == 0 && N % 32 == 0, name, ": at least one row; K and N multiples of 32");
  TORCH_CHECK(x.is_contiguous() && packed.is_contiguous() && out.is_contiguous(), name, ": contiguous tensors only");
  return {M, K, N};
}

#ifdef LLMSERVE_AMX
// Runs pass(xp, groups, rows, unit, scratch) for every unit of each thread's share of [0, units), with the tiles
// configured: xp is x with its rows padded to whole groups of 16 where M is above 16 and not a multiple of it.
template <typename Pass>
void over_tiles(const at::Tensor& x, int64_t units, const Pass& pass) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t groups = (M + 15) / 16;
  const int rows = M < 16 ? static_cast<int>(M) : 16;
  const BF16* xp = x.data_ptr<BF16>();
  thread_local std::vector<BF16> padded_scratch;
  if (M > 16 && M % 16) {  // whole groups of 16 rows for the tiles to read
    padded_scratch.assign(static_cast<size_t>(groups * 16 * K), BF16(0.f));
    std::memcpy(padded_scratch.data(), xp, static_cast<size_t>(M * K) * sizeof(BF16));
    xp = padded_scratch.data();
  }
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float scratch[2 * 16 * 16];  // a row group's two C tiles
    configure_pairs(rows);
    for (int64_t unit = begin; unit < end; ++unit) pass(xp, groups, rows, unit, scratch);
    _tile_release();
  });
}
#endif
}  // namespace

void amx_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out) {
  const auto [M, K, N] = check_amx_args(x, packed, out, "amx_linear");
  TORCH_CHECK(out.size(1) == N, "amx_linear: out is [M, N]");
#ifdef LLMSERVE_AMX
  const BF16* wp = packed.data_ptr<BF16>();
  BF16* op = out.data_ptr<BF16>();
  over_tiles(x, N / 32, [&](const BF16* xp, int64_t groups, int rows, int64_t pair, float* scratch) {
    channel_pair(xp, M, groups, rows, K, wp, N, 2 * pair, op, scratch);
  });
#endif
}

void amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out) {
  const auto [M, K, N] = check_amx_args(x, packed, out, "amx_linear_silu_mul");
  const int64_t I = N / 2;  // the packed weight is [gate; up], I channels each
  TORCH_CHECK(I % 16 == 0 && out.size(1) == I, "amx_linear_silu_mul: out is [M, N / 2], N / 2 a multiple of 16");
#ifdef LLMSERVE_AMX
  const BF16* wp = packed.data_ptr<BF16>();
  BF16* op = out.data_ptr<BF16>();
  over_tiles(x, I / 16, [&](const BF16* xp, int64_t groups, int rows, int64_t b, float* scratch) {
    gated_block(xp, M, groups, rows, K, wp, I, b, op, scratch);
  });
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("amx_linear(Tensor x, Tensor packed, Tensor(a!) out) -> ()");
  m.def("amx_linear_silu_mul(Tensor x, Tensor packed, Tensor(a!) out) -> ()");
  m.def("amx_pack_weight(Tensor w, Tensor(a!) packed) -> ()");
  m.def("amx_linear_supported() -> bool", &llmserve::amx_linear_supported);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("amx_linear", &llmserve::amx_linear);
  m.impl("amx_linear_silu_mul", &llmserve::amx_linear_silu_mul);
  m.impl("amx_pack_weight", &llmserve::amx_pack_weight);
}
