// Every decoder layer of a decode-only step in one call: the plain Llama layer exactly as worker/model/model.py's
// `_forward_native` runs it, with the kernels' entry points (ops.h) chained directly.
//
// At one stream the 135M model's int4 decode step spent about a third of its time outside the kernels:
// ~35 Python and small torch calls per layer (casts, views, fresh output tensors, two index_copy_ for the
// K/V write, a contiguous copy of q). Here the scratch buffers are allocated once per call, the new K/V rows
// and q are copied with memcpy, and each layer makes the same kernel calls in the same order on the same
// values, so the results equal the Python path's.
//
// Inputs (T tokens, one per sequence; L layers; E hidden; H / KV heads of size D):
//   hidden [T, E] float32: the embedded tokens; updated in place to the last layer's residual stream (the
//     final norm and the LM head stay with the caller). x [T, E] float32: scratch for the normed rows.
//   positions, slot_mapping [T]; block_tables [T, max_blocks]; context_lens [T]: int64.
//   cos, sin [max_positions, D]; k_caches, v_caches: L pools [KV, num_blocks, block_size, D] (the new token's
//     K/V goes to slot s = block * block_size + offset, written before attention reads it).
//   input_norms, post_norms: L weights [E].
//   qkv, o_proj, gate_up, down: each layer's tensors for that linear, layer after layer, as worker/model/quant.py's
//   layers hold them for their kernel (int4_linear.cpp, int8_linear.cpp check the layouts):
//     weight_bits 4: packed codes [N, K / 2], scales, mins [N, K / 32]   (3 L tensors)
//     weight_bits 8: codes [N, K], scales [N]                            (2 L tensors)
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops.h"

namespace {

// One quantized linear of one layer: y = x W^T through the int4 or int8 kernel.
struct Linears {
  at::TensorList tensors;
  int64_t per_layer;  // 3 (int4) or 2 (int8)

  void operator()(int64_t layer, const at::Tensor& x, const at::Tensor& out) const {
    const at::Tensor* t = tensors.data() + layer * per_layer;
    if (per_layer == 3) {
      llmserve::int4_linear(x, t[0], t[1], t[2], out);
    } else {
      llmserve::int8_linear(x, t[0], t[1], out);
    }
  }
  int64_t out_features() const { return tensors[0].size(0); }
};

void check_pools(at::TensorList pools, int64_t layers, const at::Tensor& first, const char* what) {
  TORCH_CHECK(static_cast<int64_t>(pools.size()) == layers, "decode_layers: one ", what, " per layer");
  for (const at::Tensor& pool : pools) {
    TORCH_CHECK(pool.sizes() == first.sizes() && pool.scalar_type() == at::kFloat && pool.is_contiguous(),
                "decode_layers: ", what, " must all be contiguous float32 [KV, num_blocks, block_size, D]");
  }
}

// K and V rows of the fused QKV output into their cache slots, and q into its own contiguous buffer
// (what decode_attention reads). qkv row: [q: H D | k: KV D | v: KV D].
void scatter_qkv(const float* qkv, int64_t rows, int64_t q_size, int64_t kv_heads, int64_t dim,
                 const int64_t* slots, int64_t pool_slots, float* k_pool, float* v_pool, float* q) {
  const int64_t width = q_size + 2 * kv_heads * dim;
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = qkv + t * width;
    std::memcpy(q + t * q_size, row, q_size * sizeof(float));
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t offset = (h * pool_slots + slots[t]) * dim;
      std::memcpy(k_pool + offset, row + q_size + h * dim, dim * sizeof(float));
      std::memcpy(v_pool + offset, row + q_size + (kv_heads + h) * dim, dim * sizeof(float));
    }
  }
}
// residual += x, one float32 add per value (as `hidden += down` rounds).
void add_rows(const float* x, float* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] += x[i];
}
}  // namespace

namespace llmserve {

void decode_layers(const at::Tensor& hidden, const at::Tensor& x, const at::Tensor& positions,
                   const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches, at::TensorList v_caches,
                   const at::Tensor& block_tables, const at::Tensor& context_lens, const at::Tensor& slot_mapping,
                   at::TensorList input_norms, at::TensorList post_norms, at::TensorList qkv,
                   at::TensorList o_proj, at::TensorList gate_up, at::TensorList down, int64_t num_heads,
                   int64_t num_kv_heads, int64_t weight_bits, double eps) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat && hidden.dim() == 2 &&
                  hidden.is_contiguous() && x.sizes() == hidden.sizes() && x.scalar_type() == at::kFloat &&
                  x.is_contiguous(),
              "decode_layers: hidden and x are contiguous float32 [T, E] CPU tensors");
  TORCH_CHECK(weight_bits == 4 || weight_bits == 8, "decode_layers: weight_bits is 4 or 8, got ", weight_bits);
  const int64_t layers = static_cast<int64_t>(input_norms.size()), rows = hidden.size(0);
  const int64_t per_layer = weight_bits == 4 ? 3 : 2;
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(post_norms.size()) == layers, "decode_layers: norms per layer");
  for (at::TensorList role : {qkv, o_proj, gate_up, down}) {
    TORCH_CHECK(static_cast<int64_t>(role.size()) == layers * per_layer, "decode_layers: each linear needs ",
                per_layer, " tensors per layer for ", weight_bits, "-bit weights");
  }
  check_pools(k_caches, layers, k_caches.at(0), "k_caches");
  check_pools(v_caches, layers, k_caches.at(0), "v_caches");
  const int64_t dim = k_caches[0].size(3), pool_slots = k_caches[0].size(1) * k_caches[0].size(2);
  TORCH_CHECK(k_caches[0].size(0) == num_kv_heads && num_heads % num_kv_heads == 0,
              "decode_layers: the pools' KV heads differ from num_kv_heads");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == rows,
              "decode_layers: one int64 slot per token");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < pool_slots, "decode_layers: slot out of range");
  }

  const Linears qkv_proj{qkv, per_layer}, out_proj{o_proj, per_layer}, gate_up_proj{gate_up, per_layer},
      down_proj{down, per_layer};
  const int64_t q_size = num_heads * dim, qkv_width = q_size + 2 * num_kv_heads * dim;
  TORCH_CHECK(qkv_proj.out_features() == qkv_width, "decode_layers: the QKV projection has ",
              qkv_proj.out_features(), " outputs, the heads need ", qkv_width);
  const auto options = hidden.options();
  const at::Tensor qkv_out = at::empty({rows, qkv_width}, options);
  const at::Tensor q = at::empty({rows, num_heads, dim}, options);
  const at::Tensor attn = at::empty({rows, num_heads, dim}, options);
  const at::Tensor attn_rows = attn.view({rows, q_size});
  const at::Tensor proj = at::empty({rows, hidden.size(1)}, options);  // o_proj's and down's output
  const at::Tensor gate_up_out = at::empty({rows, gate_up_proj.out_features()}, options);
  const at::Tensor act = at::empty({rows, gate_up_proj.out_features() / 2}, options);
  const double scale = std::pow(static_cast<double>(dim), -0.5);  // Python's head_dim ** -0.5

  rms_norm(hidden, input_norms[0], eps, x);
  for (int64_t l = 0; l < layers; ++l) {
    qkv_proj(l, x, qkv_out);
    rotary_(qkv_out, positions, cos, sin, num_heads + num_kv_heads);
    scatter_qkv(qkv_out.data_ptr<float>(), rows, q_size, num_kv_heads, dim, slots, pool_slots,
                k_caches[l].data_ptr<float>(), v_caches[l].data_ptr<float>(), q.data_ptr<float>());
    decode_attention(q, k_caches[l], v_caches[l], block_tables, context_lens, scale, attn);
    out_proj(l, attn_rows, proj);
    add_rms_norm(proj, hidden, post_norms[l], eps, x);
    gate_up_proj(l, x, gate_up_out);
    silu_and_mul(gate_up_out, act);
    down_proj(l, act, proj);
    if (l + 1 < layers) {
      add_rms_norm(proj, hidden, input_norms[l + 1], eps, x);
    } else {
      add_rows(proj.data_ptr<float>(), hidden.data_ptr<float>(), hidden.numel());
    }
  }
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def(
      "decode_layers(Tensor(a!) hidden, Tensor(b!) x, Tensor positions, Tensor cos, Tensor sin, "
      "Tensor(c!)[] k_caches, Tensor(d!)[] v_caches, Tensor block_tables, Tensor context_lens, "
      "Tensor slot_mapping, Tensor[] input_norms, Tensor[] post_norms, Tensor[] qkv, Tensor[] o_proj, "
      "Tensor[] gate_up, Tensor[] down, int num_heads, int num_kv_heads, int weight_bits, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("decode_layers", &llmserve::decode_layers); }
