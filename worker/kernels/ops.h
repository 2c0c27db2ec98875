// The kernels' entry points, callable from C++ as well as through `torch.ops.llmserve` (each .cpp registers
// its own): a C++ caller such as a whole decode step skips the dispatcher and Python between them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace llmserve {

// fused_ops.cpp
void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out);
void add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                  const at::Tensor& out);
void rotary_(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
             int64_t num_heads);
void silu_and_mul(const at::Tensor& x, const at::Tensor& out);
void quantize_rows_u8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t max_code = 127);
// quantize_rows_u8's codes (q + 128, rows of K, groups of 32 columns) -> the signed codes q and `multiplier`
// times each group's sum of them [M, K / 32] (AVX2 builds).
void signed_row_codes(const uint8_t* codes, int64_t M, int64_t K, int8_t* rows, int32_t* group_sums,
                      int32_t multiplier);

// int8_linear.cpp, int4_linear.cpp
void int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out);
void int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& mins,
                 const at::Tensor& out);
void int8_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out);
void int4_dequantize(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& mins, const at::Tensor& out);

// bf16_weight_linear.cpp
void bf16_weight_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& out);

// amx_linear.cpp
bool amx_linear_supported();
void amx_pack_weight(const at::Tensor& w, const at::Tensor& packed);
void amx_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out);
void amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& out);

// w8a8_linear.cpp
bool w8a8_linear_supported();
int64_t w8a8_row_max_code();
int64_t w8a8_row_group();
void w8a8_pack_weight(const at::Tensor& codes, const at::Tensor& packed, const at::Tensor& compensation);
void w8a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_scales,
                 const at::Tensor& compensation, const at::Tensor& out);

// w4a8_linear.cpp
bool w4a8_linear_supported();
void w4a8_pack_weight(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const at::Tensor& packed, const at::Tensor& scales_mins);
void w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_mins, const at::Tensor& out);

// paged_attention.cpp
void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_mapping, const at::Tensor& k_cache,
              const at::Tensor& v_cache);
void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                      const at::Tensor& out);

// decode_layers.cpp: every decoder layer of a decode-only step (its header comment gives the layouts)
void decode_layers(const at::Tensor& hidden, const at::Tensor& x, const at::Tensor& positions,
                   const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches, at::TensorList v_caches,
                   const at::Tensor& block_tables, const at::Tensor& context_lens, const at::Tensor& slot_mapping,
                   at::TensorList input_norms, at::TensorList post_norms, at::TensorList qkv,
                   at::TensorList o_proj, at::TensorList gate_up, at::TensorList down, int64_t num_heads,
                   int64_t num_kv_heads, c10::string_view linear, int64_t linear_rows, double eps);

}  // namespace llmserve
