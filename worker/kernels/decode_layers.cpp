// Every decoder layer of a decode-only step in one call: the plain Llama layer exactly as worker/model/model.py's
// `_forward_native` runs it, with the kernels' entry points (ops.h) chained directly.
//
// At one stream the 135M model's int4 decode step spent about a third of its time outside the kernels:
// ~35 Python and small torch calls per layer (casts, views, fresh output tensors, two index_copy_ for the
// K/V write, a contiguous copy of q). At 64 sequences in bfloat16 on the AMX tile kernel the same calls were
// ~15% of the forward pass (sampled with py-spy: 594 of 3,760 samples outside any kernel), the same few
// milliseconds at every batch size. Here the scratch buffers are allocated once per call, the new K/V rows
// and q are copied with memcpy, and each layer makes the same kernel calls in the same order on the same
// values, so the results equal the Python path's.
//
// Inputs (T tokens, one per sequence; L layers; E hidden; H / KV heads of size D):
//   hidden [T, E] float32 or bfloat16 (the model's activations): the embedded tokens; updated in place to the
//     last layer's residual stream (the final norm and the LM head stay with the caller). x [T, E], same
//     dtype: scratch for the normed rows.
//   positions, slot_mapping [T]; block_tables [T, max_blocks]; context_lens [T]: int64.
//   cos, sin [max_positions, D]; k_caches, v_caches: L pools [KV, num_blocks, block_size, D] of hidden's dtype
//     (the new token's K/V goes to slot s = block * block_size + offset, written before attention reads it).
//   input_norms, post_norms: L weights [E].
//   qkv, o_proj, gate_up, down: each layer's tensors for that linear, layer after layer, as the Python layers
//   hold them for their kernel (each kernel checks its layouts); `linear` names the kernel:
//     "int4"    int4_linear.cpp, float32 rows: packed codes [N, K / 2], scales, mins [N, K / 32]   (3 L tensors)
//     "int8"    int8_linear.cpp, float32 rows: codes [N, K], scales [N]                            (2 L tensors)
//     "amx"     amx_linear.cpp, bfloat16 rows: the tile layout [N / 16, K / 2, 32]                 (1 L tensor)
//     "w8a8"    w8a8_linear.cpp: packed codes, weight scales [N], compensation                    (3 L tensors)
//     "w4a8"    w4a8_linear.cpp: packed 4-bit codes, float16 scales and mins                      (2 L tensors)
//     "onednn"  oneDNN's prepacked GEMM (torch's mkldnn::_linear_pointwise), the weight as
//               common/linear.py reorders it; rows above 32 padded as its `padded_rows` pads them (1 L tensor)
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ops.h"

namespace {

enum class Kernel { Int4, Int8, Amx, W8A8, W4A8, OneDNN };

struct KernelInfo {
  Kernel kernel;
  int64_t per_layer;  // tensors per layer and linear
};

KernelInfo kernel_info(c10::string_view name) {
  if (name == "int4") return {Kernel::Int4, 3};
  if (name == "int8") return {Kernel::Int8, 2};
  if (name == "amx") return {Kernel::Amx, 1};
  if (name == "w8a8") return {Kernel::W8A8, 3};
  if (name == "w4a8") return {Kernel::W4A8, 2};
  if (name == "onednn") return {Kernel::OneDNN, 1};
  TORCH_CHECK(false, "decode_layers: linear is int4, int8, amx, w8a8, w4a8 or onednn, got ", name);
}

// oneDNN's GEMM on a weight reordered for it (common/linear.py), through the dispatcher: it is torch's op,
// not one of ours. Returns a fresh [rows, N] tensor.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, weight, c10::IValue(), c10::IValue("none"), c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue("")};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// One linear role of every layer: y = x W^T through the kernel `linear` names. x has `linear_rows` rows (the
// step's T, or more for oneDNN's padded shapes); the result's first T rows are what the caller reads.
struct Linears {
  at::TensorList tensors;
  KernelInfo info;

  // Writes into `out` ([linear_rows, N]) for the project's kernels; oneDNN returns its own tensor.
  at::Tensor operator()(int64_t layer, const at::Tensor& x, const at::Tensor& out) const {
    const at::Tensor* t = tensors.data() + layer * info.per_layer;
    switch (info.kernel) {
      case Kernel::Int4: llmserve::int4_linear(x, t[0], t[1], t[2], out); return out;
      case Kernel::Int8: llmserve::int8_linear(x, t[0], t[1], out); return out;
      case Kernel::Amx: llmserve::amx_linear(x, t[0], out); return out;
      case Kernel::W8A8: llmserve::w8a8_linear(x, t[0], t[1], t[2], out); return out;
      case Kernel::W4A8: llmserve::w4a8_linear(x, t[0], t[1], out); return out;
      case Kernel::OneDNN: return onednn_linear(x, t[0]);
    }
    return out;
  }
  // Whether the kernel runs a [gate; up] projection and its activation in one pass (gated below).
  bool has_gated() const { return info.kernel == Kernel::Amx; }
  // silu(gate) * up of layer `layer`'s [gate; up] projection into out ([rows, N / 2]), the same bits as the
  // product followed by silu_and_mul; only where has_gated().
  void gated(int64_t layer, const at::Tensor& x, const at::Tensor& out) const {
    llmserve::amx_linear_silu_mul(x, tensors[layer * info.per_layer], out);
  }
  int64_t out_features() const {
    const at::Tensor& w = tensors[0];
    switch (info.kernel) {
      case Kernel::Amx: case Kernel::W8A8: case Kernel::W4A8: return w.size(0) * 16;  // [N / 16, ...] tile layouts
      default: return w.size(0);
    }
  }
};

// The first `rows` rows of a linear's output: the tensor itself unless it has padded rows (a narrow is a
// dispatcher call; four per layer cost ~0.7 ms of a 6 ms one-stream int4 step).
at::Tensor first_rows(const at::Tensor& t, int64_t rows) { return t.size(0) == rows ? t : t.narrow(0, 0, rows); }

void check_pools(at::TensorList pools, int64_t layers, const at::Tensor& first, at::ScalarType dtype,
                 const char* what) {
  TORCH_CHECK(static_cast<int64_t>(pools.size()) == layers, "decode_layers: one ", what, " per layer");
  for (const at::Tensor& pool : pools) {
    TORCH_CHECK(pool.sizes() == first.sizes() && pool.scalar_type() == dtype && pool.is_contiguous(),
                "decode_layers: ", what, " must all be contiguous [KV, num_blocks, block_size, D] of hidden's dtype");
  }
}

// K and V rows of the fused QKV output into their cache slots, and q into its own contiguous buffer
// (what decode_attention reads). qkv row: [q: H D | k: KV D | v: KV D], `bytes` per value.
void scatter_qkv(const char* qkv, int64_t rows, int64_t q_size, int64_t kv_heads, int64_t dim, int64_t bytes,
                 const int64_t* slots, int64_t pool_slots, char* k_pool, char* v_pool, char* q) {
  const int64_t width = (q_size + 2 * kv_heads * dim) * bytes, head = dim * bytes;
  for (int64_t t = 0; t < rows; ++t) {
    const char* row = qkv + t * width;
    std::memcpy(q + t * q_size * bytes, row, q_size * bytes);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t offset = (h * pool_slots + slots[t]) * head;
      std::memcpy(k_pool + offset, row + q_size * bytes + h * head, head);
      std::memcpy(v_pool + offset, row + q_size * bytes + (kv_heads + h) * head, head);
    }
  }
}
}  // namespace

namespace llmserve {

void decode_layers(const at::Tensor& hidden, const at::Tensor& x, const at::Tensor& positions,
                   const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches, at::TensorList v_caches,
                   const at::Tensor& block_tables, const at::Tensor& context_lens, const at::Tensor& slot_mapping,
                   at::TensorList input_norms, at::TensorList post_norms, at::TensorList qkv,
                   at::TensorList o_proj, at::TensorList gate_up, at::TensorList down, int64_t num_heads,
                   int64_t num_kv_heads, c10::string_view linear, int64_t linear_rows, double eps) {
  const at::ScalarType dtype = hidden.scalar_type();
  TORCH_CHECK(hidden.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) && hidden.dim() == 2 &&
                  hidden.is_contiguous() && x.sizes() == hidden.sizes() && x.scalar_type() == dtype &&
                  x.is_contiguous(),
              "decode_layers: hidden and x are contiguous float32 or bfloat16 [T, E] CPU tensors of one dtype");
  const KernelInfo info = kernel_info(linear);
  TORCH_CHECK(dtype == at::kFloat || (info.kernel != Kernel::Int4 && info.kernel != Kernel::Int8),
              "decode_layers: the int4 and int8 kernels take float32 rows");
  TORCH_CHECK(dtype == at::kBFloat16 || info.kernel != Kernel::Amx, "decode_layers: the amx kernel takes bfloat16 rows");
  const int64_t layers = static_cast<int64_t>(input_norms.size()), rows = hidden.size(0);
  TORCH_CHECK(linear_rows >= rows && (linear_rows == rows || info.kernel == Kernel::OneDNN),
              "decode_layers: only onednn linears run at more rows than the step has");
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(post_norms.size()) == layers, "decode_layers: norms per layer");
  for (at::TensorList role : {qkv, o_proj, gate_up, down}) {
    TORCH_CHECK(static_cast<int64_t>(role.size()) == layers * info.per_layer, "decode_layers: each linear needs ",
                info.per_layer, " tensors per layer for ", linear, " weights");
  }
  check_pools(k_caches, layers, k_caches.at(0), dtype, "k_caches");
  check_pools(v_caches, layers, k_caches.at(0), dtype, "v_caches");
  const int64_t dim = k_caches[0].size(3), pool_slots = k_caches[0].size(1) * k_caches[0].size(2);
  TORCH_CHECK(k_caches[0].size(0) == num_kv_heads && num_heads % num_kv_heads == 0,
              "decode_layers: the pools' KV heads differ from num_kv_heads");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == rows,
              "decode_layers: one int64 slot per token");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < pool_slots, "decode_layers: slot out of range");
  }

  const Linears qkv_proj{qkv, info}, out_proj{o_proj, info}, gate_up_proj{gate_up, info}, down_proj{down, info};
  const int64_t q_size = num_heads * dim, qkv_width = q_size + 2 * num_kv_heads * dim;
  TORCH_CHECK(qkv_proj.out_features() == qkv_width, "decode_layers: the QKV projection has ",
              qkv_proj.out_features(), " outputs, the heads need ", qkv_width);
  const int64_t hidden_size = hidden.size(1), intermediate = gate_up_proj.out_features() / 2;
  const int64_t bytes = hidden.element_size();
  const auto options = hidden.options();
  // The linears' inputs have linear_rows rows; the rows past T stay zero (oneDNN's padded shapes) and the
  // other ops see the first T rows only.
  const bool padded = linear_rows > rows;
  const at::Tensor normed = padded ? at::zeros({linear_rows, hidden_size}, options) : x;
  const at::Tensor normed_rows = padded ? normed.narrow(0, 0, rows) : x;
  const at::Tensor attn = padded ? at::zeros({linear_rows, q_size}, options) : at::empty({rows, q_size}, options);
  const at::Tensor attn_heads = attn.narrow(0, 0, rows).view({rows, num_heads, dim});
  const at::Tensor act = padded ? at::zeros({linear_rows, intermediate}, options) : at::empty({rows, intermediate}, options);
  const at::Tensor act_rows = first_rows(act, rows);
  const at::Tensor q = at::empty({rows, num_heads, dim}, options);
  const at::Tensor qkv_buffer = at::empty({linear_rows, qkv_width}, options);
  const at::Tensor proj_buffer = at::empty({linear_rows, hidden_size}, options);  // o_proj's and down's output
  const at::Tensor gate_up_buffer =
      gate_up_proj.has_gated() ? at::Tensor() : at::empty({linear_rows, 2 * intermediate}, options);
  const double scale = std::pow(static_cast<double>(dim), -0.5);  // Python's head_dim ** -0.5

  rms_norm(hidden, input_norms[0], eps, normed_rows);
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor qkv_out = first_rows(qkv_proj(l, normed, qkv_buffer), rows);
    rotary_(qkv_out, positions, cos, sin, num_heads + num_kv_heads);
    scatter_qkv(static_cast<const char*>(qkv_out.data_ptr()), rows, q_size, num_kv_heads, dim, bytes, slots,
                pool_slots, static_cast<char*>(k_caches[l].data_ptr()), static_cast<char*>(v_caches[l].data_ptr()),
                static_cast<char*>(q.data_ptr()));
    decode_attention(q, k_caches[l], v_caches[l], block_tables, context_lens, scale, attn_heads);
    const at::Tensor projected = first_rows(out_proj(l, attn, proj_buffer), rows);
    add_rms_norm(projected, hidden, post_norms[l], eps, normed_rows);
    if (gate_up_proj.has_gated()) {
      gate_up_proj.gated(l, normed, act);
    } else {
      silu_and_mul(first_rows(gate_up_proj(l, normed, gate_up_buffer), rows), act_rows);
    }
    const at::Tensor down_out = first_rows(down_proj(l, act, proj_buffer), rows);
    if (l + 1 < layers) {
      add_rms_norm(down_out, hidden, input_norms[l + 1], eps, normed_rows);
    } else {
      hidden.add_(down_out);  // as `hidden += down` rounds
    }
  }
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def(
      "decode_layers(Tensor(a!) hidden, Tensor(b!) x, Tensor positions, Tensor cos, Tensor sin, "
      "Tensor(c!)[] k_caches, Tensor(d!)[] v_caches, Tensor block_tables, Tensor context_lens, "
      "Tensor slot_mapping, Tensor[] input_norms, Tensor[] post_norms, Tensor[] qkv, Tensor[] o_proj, "
      "Tensor[] gate_up, Tensor[] down, int num_heads, int num_kv_heads, str linear, int linear_rows, "
      "float eps) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("decode_layers", &llmserve::decode_layers); }
// oneDNN's reordered weights are tensors of the MkldnnCPU backend, which then picks the kernel.
TORCH_LIBRARY_IMPL(llmserve, MkldnnCPU, m) { m.impl("decode_layers", &llmserve::decode_layers); }
