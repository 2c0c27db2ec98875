// The loop order the weight-only linear kernels share (int8_linear.cpp, int4_linear.cpp,
// bf16_weight_linear.cpp): output channels split over torch's intra-op threads, then a chunk of x rows (kept
// in L2) passes over a block of weight rows (kept in L1/L2) tile by tile, so each weight row comes from
// memory once per row chunk and x from cache.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace llmserve {

// Calls tile(m0, rows, n0, n1) for x rows [m0, m0 + rows) against weight rows [n0, n1), every pair once.
template <typename Tile>
void for_each_tile(int64_t M, int64_t N, int64_t row_chunk, int64_t channel_block, int64_t row_tile,
                   const Tile& tile) {
  // Enough channels per task that a thread streams a long run of weight rows.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t c0 = 0; c0 < M; c0 += row_chunk) {
      const int64_t c1 = std::min(M, c0 + row_chunk);
      for (int64_t n0 = begin; n0 < end; n0 += channel_block) {
        const int64_t n1 = std::min(end, n0 + channel_block);
        for (int64_t m0 = c0; m0 < c1; m0 += row_tile) tile(m0, std::min(row_tile, c1 - m0), n0, n1);
      }
    }
  });
}

// Whether the row tile at m0 is the first of its row chunk in for_each_tile: the one that reads the weight block
// from memory (the chunk's later tiles find it in cache), so the one that prefetches the block ahead.
inline bool first_tile_of_chunk(int64_t m0, int64_t row_chunk) { return m0 % row_chunk == 0; }

// One row against every weight row: rows(width, n) for weight rows [n, n + width), width a
// std::integral_constant of C for runs of C rows and of 1 for the rest of each thread's channels.
template <int C, typename Rows>
void for_each_channel_run(int64_t N, int64_t channel_block, const Rows& rows) {
  for_each_tile(1, N, 1, channel_block, 1, [&](int64_t, int64_t, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + C <= n1; n += C) rows(std::integral_constant<int, C>{}, n);
    for (; n < n1; ++n) rows(std::integral_constant<int, 1>{}, n);
  });
}

// One row x against every weight row, x first laid out once per call as a `Grid` by build(x, K, grid):
// the grid is the calling thread's (reused, no allocation per call) and reaches the threads that run the
// weight rows by reference, as rows(width, grid, n) for weight rows [n, n + width) (for_each_channel_run).
template <typename Grid, int C, typename Build, typename Rows>
void one_row_with_grid(const float* x, int64_t K, int64_t N, int64_t channel_block, const Build& build,
                       const Rows& rows) {
  thread_local Grid scratch;
  build(x, K, scratch);
  const Grid& grid = scratch;  // a thread_local named in the lambda would be each worker thread's own
  for_each_channel_run<C>(N, channel_block, [&](auto width, int64_t n) { rows(width, grid, n); });
}

}  // namespace llmserve
