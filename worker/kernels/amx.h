// What the AMX kernels share (amx_linear.cpp, prefill_attention.cpp): the process's permission to use the tile
// registers and the tile configuration's memory layout.
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

}  // namespace llmserve
#endif
