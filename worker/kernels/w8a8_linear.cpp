// y = x @ W.T with int8 weights and int8 activations (WORKER_QUANTIZATION=w8a8), for the rows of a decode
// batch: quantize, multiply and rescale in one call.
//
// Each row is quantized with one scale per group of 64 columns (fused_ops.cpp's quantize_rows_u8), as
// llama.cpp's q8 activations are per 32: one scale per row cost the bundled model 1.45% of perplexity, the
// 64-column groups a few tenths (docs/STUDY_LOG.md). A group's sums are exact int32 on the CPU's integer
// dot products, scaled into float32 and added up group by group; the total is scaled once more per channel
// and rounded into out:
//
//     y[m, n] = s_w[n] * sum_g s_x[m, g] ((sum_{k in g} u[m, k] c[n, k]) - 128 sum_{k in g} c[n, k])
//
// with u = q_x + 128 the unsigned row codes (what the u8 x s8 instructions take) and c the weight codes; each
// group's sums start from the `compensation` [K / 64, N], -128 sum_{k in g} c[n, k], made once at load. The
// weights are laid out once (w8a8_pack_weight) as both instruction sets read them: per block of 16 output
// channels, per group of 4 input columns, the 16 channels' 4 codes side by side (64 bytes: one 512-bit
// register for VPDPBUSD, one row of an AMX B tile). Two paths, chosen per build and CPU (w8a8_linear_path; `path` names one, for tests and
// benchmarks):
//   "amx":  AMX-INT8 tiles (TDPBUSD), two channel blocks x two groups of 16 rows at a time (amx.h's loop),
//           the tiles stored and scaled after every 64 columns; from kAmxFromRows rows where VNNI is
//           compiled too.
//   "vnni": AVX512-VNNI (VPDPBUSD), 4 rows x 64 channels of int32 sums in registers, one group of columns
//           at a time: its 4 KB of codes come from memory once and from L1 for the further row chunks. The
//           CPUs without AMX (AMD Zen 4, Intel before Sapphire Rapids) take this one.
//
// Layouts: x [M, K] float32 or bfloat16, contiguous; packed [N / 16, K / 4, 64] int8; weight_scales [N] float32;
// compensation [K / 64, N] int32; out [M, N] float32 or bfloat16, written. K a multiple of 64, N of 32.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "amx.h"
#include "ops.h"
#include "vec.h"

namespace {

using BF16 = c10::BFloat16;

#if defined(LLMSERVE_AVX512) && defined(__AVX512VNNI__)
#define LLMSERVE_W8A8_VNNI 1
#endif
#if defined(LLMSERVE_AMX) && defined(__AMX_INT8__)
#define LLMSERVE_W8A8_AMX 1
#endif

// Where both paths exist, AMX from this many rows: below it one row group's tiles are mostly empty and VNNI
// streams the weights faster (120 distinct SmolLM2 layers, 2-core AMX Xeon, bench/w8a8_kernels.py: 8 rows 6.8
// against 7.8 ms, 16 rows 10.0 against 9.8, 32 rows 15.9 against 13.4).
constexpr int64_t kAmxFromRows = 16;

bool vnni_compiled() {
#ifdef LLMSERVE_W8A8_VNNI
  return true;
#else
  return false;
#endif
}

bool amx_int8_usable() {
#ifdef LLMSERVE_W8A8_AMX
  return llmserve::tiles_permitted();
#else
  return false;
#endif
}

constexpr int64_t kGroup = 64;  // columns per activation scale: one AMX step, 16 VPDPBUSD steps

#if defined(LLMSERVE_W8A8_VNNI) || defined(LLMSERVE_W8A8_AMX)
// How a group's sums become float32 and where the totals of one row and 16 channels go. Every group's sums
// start from `compensation` (-128 times the group's code sum per channel), so they arrive exact.
struct Epilogue {
  const float* weight_scales;   // [N]
  const int32_t* compensation;  // [groups, N]
  const float* group_scales;    // [M, groups]
  int64_t groups;
  void* out;
  bool bf16;
  int64_t N;

  const int32_t* start(int64_t g, int64_t n0) const { return compensation + g * N + n0; }

  // Group g's exact sums of row m, channels [n0, n0 + 16), scaled by the row's scale for the group and added
  // to the running total in partial (set at g = 0); at the last group the total, times the weight scale,
  // goes to out instead.
  void accumulate(__m512i sums, int64_t m, int64_t g, int64_t n0, float* partial) const {
    const __m512 scale = _mm512_set1_ps(group_scales[m * groups + g]);
    const __m512 total = g == 0 ? _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale)
                                : _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, _mm512_loadu_ps(partial));
    if (g < groups - 1) {
      _mm512_storeu_ps(partial, total);
      return;
    }
    const __m512 y = _mm512_mul_ps(total, _mm512_loadu_ps(weight_scales + n0));
    if (bf16) {
      llmserve::store16(static_cast<BF16*>(out) + m * N + n0, y);
    } else {
      llmserve::store16(static_cast<float*>(out) + m * N + n0, y);
    }
  }
};
#endif

#ifdef LLMSERVE_W8A8_VNNI
constexpr int kMaxRows = 4;    // rows of sums in registers: 4 x 4 accumulators + 4 weights + a broadcast
constexpr int kMaxBlocks = 4;  // channel blocks of 16 per pass (64 channels): 4 KB of codes a group
constexpr int64_t kPrefetchBytes = 4096;

// Rows [m0, m0 + R) of the codes against channel blocks [b, b + B), columns of group g; partial: [rows, 64]
// float32, the running totals of these 64 channels.
template <int R, int B>
void vnni_tile(const uint8_t* codes, int64_t K, const int8_t* packed, int64_t b, int64_t m0, int64_t g,
               bool prefetch, float* partial, const Epilogue& epilogue) {
  // Every loop over r and j is unrolled, so that the sums stay in registers (rolled, GCC kept them on the
  // stack: a load and a store around each multiply-add, half the speed); 6 rows spilled too.
  __m512i acc[R][B];
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j) {
    const __m512i start = _mm512_loadu_si512(epilogue.start(g, (b + j) * 16));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][j] = start;
  }
  const int8_t* w = packed + b * 16 * K;  // block b + j starts 16 K bytes after block b + j - 1
  const uint8_t* x = codes + m0 * K;
  for (int64_t k = g * kGroup; k < (g + 1) * kGroup; k += 4) {
    __m512i wj[B];
#pragma GCC unroll 4
    for (int j = 0; j < B; ++j) {
      const int8_t* tile = w + j * 16 * K + k * 16;
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(tile) + kPrefetchBytes, _MM_HINT_T0);
      wj[j] = _mm512_loadu_si512(tile);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i xr = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + r * K + k));
#pragma GCC unroll 4
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xr, wj[j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < B; ++j)
      epilogue.accumulate(acc[r][j], m0 + r, g, (b + j) * 16, partial + (m0 + r) * 64 + j * 16);
}

// Channel blocks [b, b + B) against every row: group by group, every row chunk of 4 passing over the group's
// codes while they are in L1 (the first pass reads them from memory).
template <int B>
void vnni_rows(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t b, float* partial,
               const Epilogue& e) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      switch (std::min<int64_t>(kMaxRows, M - m0)) {
        case 1: vnni_tile<1, B>(codes, K, packed, b, m0, g, m0 == 0, partial, e); break;
        case 2: vnni_tile<2, B>(codes, K, packed, b, m0, g, m0 == 0, partial, e); break;
        case 3: vnni_tile<3, B>(codes, K, packed, b, m0, g, m0 == 0, partial, e); break;
        default: vnni_tile<4, B>(codes, K, packed, b, m0, g, m0 == 0, partial, e); break;
      }
    }
  }
}

void vnni_linear(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t N, const Epilogue& e) {
  at::parallel_for(0, N / 16, kMaxBlocks, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> partial;  // every row's running totals for 64 channels, between groups
    if (partial.size() < static_cast<size_t>(M * 64)) partial.resize(static_cast<size_t>(M * 64));
    for (int64_t b = begin; b < end; b += kMaxBlocks) {
      switch (std::min<int64_t>(kMaxBlocks, end - b)) {
        case 1: vnni_rows<1>(codes, M, K, packed, b, partial.data(), e); break;
        case 2: vnni_rows<2>(codes, M, K, packed, b, partial.data(), e); break;
        case 3: vnni_rows<3>(codes, M, K, packed, b, partial.data(), e); break;
        default: vnni_rows<4>(codes, M, K, packed, b, partial.data(), e); break;
      }
    }
  });
}
#endif

#ifdef LLMSERVE_W8A8_AMX
// Channel blocks b0, b0 + 1 against every group of 16 rows, two groups at a time (amx.h's tile loop: an A tile
// is 16 rows x 64 codes, a B tile 16 groups of 4 codes x 16 channels), the tiles stored after every step (one
// group of 64 columns). partial: [rows, 32] float32, the running totals of these 32 channels.
void amx_channel_pair(const uint8_t* codes, int64_t M, int64_t groups, int rows, int64_t K, const int8_t* packed,
                      int64_t N, int64_t b0, const Epilogue& e, int32_t* scratch, float* partial) {
  const int64_t block_bytes = 16 * K;
  const char* weights = reinterpret_cast<const char*>(packed);
  llmserve::tile_pair_pass<true>(
      reinterpret_cast<const char*>(codes), K, groups, weights + b0 * block_bytes, block_bytes, K / 64, 1,
      weights + (N / 16) * block_bytes, scratch,
      [&](int b, int64_t column_group) -> const void* { return e.start(column_group, (b0 + b) * 16); },
      [&](int64_t g, int b, int64_t column_group, const void* sums) {
        for (int64_t r = 0; r < rows && g * 16 + r < M; ++r) {
          const int64_t m = g * 16 + r;
          e.accumulate(_mm512_loadu_si512(static_cast<const int32_t*>(sums) + 16 * r), m, column_group,
                       (b0 + b) * 16, partial + m * 32 + b * 16);
        }
      });
}

void amx_linear_int8(const uint8_t* codes, int64_t M, int64_t K, const int8_t* packed, int64_t N, const Epilogue& e) {
  const int64_t groups = (M + 15) / 16;
  const int rows = M < 16 ? static_cast<int>(M) : 16;
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    alignas(64) int32_t scratch[16 * 16];
    thread_local std::vector<float> partial;
    if (partial.size() < static_cast<size_t>(M * 32)) partial.resize(static_cast<size_t>(M * 32));
    llmserve::configure_pairs(rows);
    for (int64_t pair = begin; pair < end; ++pair)
      amx_channel_pair(codes, M, groups, rows, K, packed, N, 2 * pair, e, scratch, partial.data());
    _tile_release();
  });
}
#endif

}  // namespace

namespace llmserve {

std::string w8a8_linear_path() {
  if (amx_int8_usable()) return "amx";
#ifdef LLMSERVE_W8A8_VNNI
  return "vnni";
#else
  return "none";
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
                 const at::Tensor& compensation, const at::Tensor& out, c10::string_view path) {
  const std::string usable = w8a8_linear_path();
  TORCH_CHECK(usable != "none", "w8a8_linear: this build or CPU has neither AVX512-VNNI nor AMX-INT8");
  TORCH_CHECK(path == "auto" || path == usable || (path == "vnni" && vnni_compiled()),
              "w8a8_linear: path must be auto or one this build and CPU has (", usable, "), got ", path);
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
#if defined(LLMSERVE_W8A8_VNNI) || defined(LLMSERVE_W8A8_AMX)
  const bool amx = path == "amx" || (path == "auto" && usable == "amx" && (M >= kAmxFromRows || !vnni_compiled()));
  // The AMX path reads whole groups of 16 rows; the rows past M are never stored.
  const int64_t padded = amx && M > 16 ? (M + 15) / 16 * 16 : M;
  const at::Tensor codes = at::empty({padded, K}, x.options().dtype(at::kByte));
  const at::Tensor group_scales = at::empty({M, K / kGroup}, x.options().dtype(at::kFloat));
  llmserve::quantize_rows_u8(x, codes.narrow(0, 0, M), group_scales);
  const Epilogue epilogue{weight_scales.data_ptr<float>(), compensation.data_ptr<int32_t>(),
                          group_scales.data_ptr<float>(), K / kGroup, out.data_ptr(),
                          out.scalar_type() == at::kBFloat16, N};
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const int8_t* wp = packed.data_ptr<int8_t>();
#ifdef LLMSERVE_W8A8_AMX
  if (amx) return amx_linear_int8(cp, M, K, wp, N, epilogue);
#endif
#ifdef LLMSERVE_W8A8_VNNI
  vnni_linear(cp, M, K, wp, N, epilogue);
#endif
#endif
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def("w8a8_linear(Tensor x, Tensor packed, Tensor weight_scales, Tensor compensation, Tensor(a!) out, "
        "str path='auto') -> ()");
  m.def("w8a8_pack_weight(Tensor codes, Tensor(a!) packed, Tensor(b!) compensation) -> ()");
  m.def("w8a8_linear_path() -> str", &llmserve::w8a8_linear_path);
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) {
  m.impl("w8a8_linear", &llmserve::w8a8_linear);
  m.impl("w8a8_pack_weight", &llmserve::w8a8_pack_weight);
}
