// What the AMX kernels share (amx_linear.cpp, prefill_attention.cpp): the process's
// permission to use the tile registers, the tile configuration's memory layout, and the linears' tile loop.
// LLMSERVE_AMX is defined where the build targets a CPU with AMX bfloat16 tiles (the kernels compile
// elsewhere to stubs that say so).
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define LLMSERVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace llmserve {

// Linux hands out the tile registers' state only on request, once per process.
inline bool tiles_permitted() {
  static const bool permitted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

// ldtilecfg's 64-byte operand (palette 1): bytes per row and rows of each of the eight tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles of the two-by-two linear (amx_linear.cpp): C for (row group g, channel block b) is
// tile 2g + b; A (row group g) 4 + g; B (channel block b) 6 + b. A and C tiles hold `rows` rows (M itself
// below 16 rows, else 16 with the rows padded to whole groups); every tile row is 64 bytes.
inline void configure_pairs(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  for (int t : {0, 1, 2, 3, 4, 5}) cfg.rows[t] = static_cast<uint8_t>(rows);
  cfg.rows[6] = cfg.rows[7] = 16;
  _tile_loadconfig(&cfg);
}

// How far ahead of the weight tiles in use they are prefetched: 2, 4, 8 and 16 KB were within noise of each
// other (a 1-row step of SmolLM2's bfloat16 linears 10.9-11.3 ms); without it, 14 ms.
constexpr int64_t kPairPrefetchBytes = 4096;

// Two channel blocks (B tiles: 1 KB a step, read in order from w0 and from w1 = w0 + block_bytes) against every
// group of 16 rows of a (row_bytes apart, 64 bytes a step), two groups at a time, over `steps` steps of bfloat16
// pairs into float32 (TDPBF16PS); the first pass over the rows prefetches the blocks ahead (never past
// weights_end). Each C tile then goes to scratch (16 x 16 floats) and to store(g, b, scratch) for row group g
// and block b.
template <typename Store>
void tile_pair_pass(const char* a, int64_t row_bytes, int64_t groups, const char* w0, int64_t block_bytes,
                    int64_t steps, const char* weights_end, void* scratch, const Store& store) {
  const char* w1 = w0 + block_bytes;
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
    for (int g = 0; g < (two ? 2 : 1); ++g)
      for (int b = 0; b < 2; ++b) {
        switch (2 * g + b) {  // tile numbers are immediates
          case 0: _tile_stored(0, scratch, 64); break;
          case 1: _tile_stored(1, scratch, 64); break;
          case 2: _tile_stored(2, scratch, 64); break;
          default: _tile_stored(3, scratch, 64); break;
        }
        store(g0 + g, b, scratch);
      }
  }
}

}  // namespace llmserve
#endif
