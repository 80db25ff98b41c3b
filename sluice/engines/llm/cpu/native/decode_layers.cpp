// Every decoder layer of a decode-only step in one call, for Llama-shaped models whose projections are int4:
// the same kernels in the same order, with the same dtypes, as the Python modules call them one by one
// (models/llama.py, layers/), so the result is bit for bit theirs -- without the per-operation cost of
// Python and nn.Module, which at one sequence is as large as the weights' matmuls.
//
// Per layer (h float32 (n, hidden), the residual stream):
//   x = rms_norm(h) -> bf16 -> qkv = int4(x); rotate the q and k heads together; v as it is;
//   o = decode_attention(store k, v; attend) -> h += int4_o(o);
//   x = rms_norm(h) -> bf16 -> gate_up = int4(x) -> h += int4_down(silu(gate) * up)
// h + a bf16 projection promotes to float32, as torch's add does.
//
// layers[i]: input_norm (hidden,) f32, qkv packed, qkv scale_zero, o packed, o scale_zero, post_norm (hidden,)
// f32, gate_up packed, gate_up scale_zero, down packed, down scale_zero, k_cache, v_cache (bf16).
// sizes[i]: num_heads, num_kv_heads, head_dim, qkv rows, o rows, gate_up rows, down rows, sliding window (0:
// none). cos / sin (n, 1, rotary_dim) bf16; slots (n,), blocks (n, max_blocks), lens (n,) int64 as for
// decode_attention.

#include "cpu_ops.h"

namespace {

// x @ W.T through the int4 kernel: x as bf16 (contiguous), the padding rows cut (Int4Weight.matmul).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale_zero,
                          int64_t rows) {
  at::Tensor y = int4_matmul(x.to(at::kBFloat16).contiguous(), packed, scale_zero);
  return y.size(1) == rows ? y : y.slice(1, 0, rows);
}

}  // namespace

at::Tensor decode_layers(at::Tensor h, const std::vector<std::vector<at::Tensor>>& layers,
                            const std::vector<std::vector<int64_t>>& sizes, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& slots, const at::Tensor& blocks,
                            const at::Tensor& lens, double eps, double scale) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat, "decode_layers: h must be (n, hidden) float32");
  TORCH_CHECK(layers.size() == sizes.size(), "decode_layers: one sizes entry per layer");
  const int64_t n = h.size(0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& t = layers[i];
    const auto& s = sizes[i];
    TORCH_CHECK(t.size() == 12 && s.size() == 8, "decode_layers: layer ", i, " needs 12 tensors and 8 sizes");
    const int64_t heads = s[0], kv_heads = s[1], d = s[2];
    const int64_t q_size = heads * d, kv_size = kv_heads * d;
    TORCH_CHECK(s[3] == q_size + 2 * kv_size, "decode_layers: layer ", i, ": qkv rows do not match the heads");
    const at::Tensor qkv = int4_linear(rms_norm(h, t[0], eps), t[1], t[2], s[3]);
    const at::Tensor qk = rotary(qkv.slice(1, 0, q_size + kv_size).view({n, heads + kv_heads, d}), cos, sin);
    const at::Tensor v = qkv.slice(1, q_size + kv_size, s[3]).view({n, kv_heads, d});
    const at::Tensor o = decode_attention(qk.slice(1, 0, heads), qk.slice(1, heads, heads + kv_heads), v, t[10],
                                             t[11], slots, blocks, lens, scale, s[7], 0.0);
    h = h.add(int4_linear(o.reshape({n, q_size}), t[3], t[4], s[4]));
    const at::Tensor gate_up = int4_linear(rms_norm(h, t[5], eps), t[6], t[7], s[5]);
    h = h.add(int4_linear(silu_mul(gate_up), t[8], t[9], s[6]));
  }
  return h;
}
