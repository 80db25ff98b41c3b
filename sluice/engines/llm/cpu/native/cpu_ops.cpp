// Decode attention over the paged KV cache, CPU, one call per layer and step: store each sequence's new
// key/value in its slot, then attend its one query token over the sequence's cache, reading K and V in place
// through the block table (no gather into a padded copy, no mask tensor).
//
// Semantics are those of sluice/engines/llm/attention.py for decode rows: sequence i has lens[i] positions
// after this step (the new one included); its query attends to positions [start, lens[i]) with
// start = max(0, lens[i] - window) when window > 0, else 0; query head h reads KV head h / group. Scores are
// q.k * scale, with softcap > 0 replaced by softcap * tanh(score / softcap), then softmaxed in float32.
//
// Layout: query (n, H, D) float32 or bfloat16, key / value (n, KVH, D) in its dtype; caches (num_blocks,
// block_size, KVH, D) float32 or bfloat16, contiguous; arithmetic in float32; slots (n,) int64 (< 0 = do not store; empty = all stored already); blocks (n, max_blocks) int64;
// lens (n,) int64. Returns (n, H, D) in the query's dtype. Work is split over (sequence, KV head) pairs; the group's
// query heads share each K / V row read.

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// Widen a row to float32: bfloat16 is the top half of a float32, so a shift (vectorised), no rounding.
inline void load_row(const float* src, float* dst, int64_t d) { std::copy(src, src + d, dst); }
inline void load_row(const c10::BFloat16* src, float* dst, int64_t d) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) dst[j] = std::bit_cast<float>(static_cast<uint32_t>(bits[j]) << 16);
}

// x as the dtype T would hold it (bfloat16: rounded to nearest even; float: as it is), kept in a float.
template <typename T>
inline float rounded(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    return std::bit_cast<float>((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
  }
}

// A cache row as float32: a float32 row in place, a bfloat16 row widened into ``buf``.
template <typename T>
inline const float* widened(const T* row, float* buf, int64_t d) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    load_row(row, buf, d);
    return buf;
  }
}

template <typename T>
inline void prefetch_row(const T* row, int64_t d) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < d * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(bytes + off);
}

inline float dot(const float* a, const float* b, int64_t d) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < d; ++j) acc += a[j] * b[j];
  return acc;
}

template <typename Q, typename T>
void store(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots, int64_t n) {
  const int64_t row = cache.size(2) * cache.size(3);
  const Q* src = rows.data_ptr<Q>();
  T* dst = cache.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    T* out = dst + slots[i] * row;
    if constexpr (std::is_same_v<Q, T>) {
      std::copy(src + i * row, src + (i + 1) * row, out);
    } else {
      for (int64_t j = 0; j < row; ++j) out[j] = static_cast<T>(static_cast<float>(src[i * row + j]));
    }
  }
}

template <typename Q, typename T>
void attend(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const int64_t* blocks, int64_t max_blocks, const int64_t* lens, double scale, int64_t window,
            double softcap, at::Tensor& out) {
  const int64_t n = query.size(0), num_heads = query.size(1), d = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const Q* q_all = query.data_ptr<Q>();
  const T* k_all = k_cache.data_ptr<T>();
  const T* v_all = v_cache.data_ptr<T>();
  Q* o_all = out.data_ptr<Q>();
  const float fscale = static_cast<float>(scale), fcap = static_cast<float>(softcap);

  int64_t total_len = 0;
  for (int64_t i = 0; i < n; ++i) total_len += lens[i];
  const int64_t tasks = n * num_kv_heads;
  // Below ~32k multiply-adds per thread the fork costs more than it saves.
  const int64_t work_per_task = std::max<int64_t>(1, 2 * group * d * total_len / std::max<int64_t>(1, n));
  const int64_t grain = std::max<int64_t>(1, (32768 + work_per_task - 1) / work_per_task);

  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, krow(d), acc(group * d), qf(group * d);
    std::vector<int64_t> row_of;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / num_kv_heads, h = t % num_kv_heads;
      const int64_t len = lens[i];
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t span = len - start;
      Q* o = o_all + (i * num_heads + h * group) * d;  // the group's query heads are adjacent
      if (span <= 0) {
        std::fill(o, o + group * d, static_cast<Q>(0.f));
        continue;
      }
      load_row(q_all + (i * num_heads + h * group) * d, qf.data(), group * d);
      const float* q = qf.data();
      scores.assign(group * span, 0.f);
      const int64_t* table = blocks + i * max_blocks;
      row_of.resize(span);  // where position start + p's row of head h starts, in elements
      for (int64_t p = start, b = start / block_size, off = start % block_size; p < len; ++p) {
        row_of[p - start] = ((table[b] * block_size + off) * num_kv_heads + h) * d;
        if (++off == block_size) off = 0, ++b;  // walk the block table: no division per position
      }
      // The rows are scattered over blocks: prefetch K a few positions ahead, and V for the second pass
      // (without it the reads wait on memory whenever the step's matmuls have evicted the cache).
      constexpr int64_t ahead = 8;
      for (int64_t p = 0; p < span; ++p) {
        if (p + ahead < span) prefetch_row(k_all + row_of[p + ahead], d);
        prefetch_row(v_all + row_of[p], d);
        const float* kf = widened(k_all + row_of[p], krow.data(), d);
        for (int64_t g = 0; g < group; ++g) {
          float s = dot(q + g * d, kf, d) * fscale;
          if (fcap > 0.f) s = fcap * std::tanh(s / fcap);
          scores[g * span + p] = s;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * span;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < span; ++p) mx = std::max(mx, s[p]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t p = 0; p < span; ++p) {
          // Below -87 exp is subnormal: a weight of 0 instead (off by < 1e-38), as subnormal operands
          // make the weighted sum of V below many times slower.
          const float x = s[p] - mx;
          s[p] = x < -87.f ? 0.f : std::exp(x);  // vectorised (libmvec) under -fno-math-errno
          sum += s[p];
        }
        const float inv = 1.f / sum;
        for (int64_t p = 0; p < span; ++p) s[p] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t p = 0; p < span; ++p) {
        const float* vf = widened(v_all + row_of[p], krow.data(), d);
        for (int64_t g = 0; g < group; ++g) {
          const float w = scores[g * span + p];
          float* a = acc.data() + g * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) a[j] += w * vf[j];
        }
      }
      for (int64_t j = 0; j < group * d; ++j) o[j] = static_cast<Q>(acc[j]);
    }
  });
}

}  // namespace

at::Tensor decode_attention(at::Tensor query, at::Tensor key, at::Tensor value,
                               at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots,
                               at::Tensor blocks, at::Tensor lens, double scale, int64_t window,
                               double softcap) {
  const bool do_store = slots.numel() > 0;
  TORCH_CHECK(query.dim() == 3 && (query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16),
              "query must be (n, heads, dim) float32 or bfloat16");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "caches must be (blocks, block_size, kv_heads, dim)");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "caches must share a dtype");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && blocks.scalar_type() == at::kLong && lens.scalar_type() == at::kLong,
              "slots/blocks/lens must be int64");
  const int64_t n = query.size(0);
  TORCH_CHECK(lens.numel() == n && blocks.dim() == 2 && blocks.size(0) == n, "one block-table row and length per query");
  TORCH_CHECK(query.size(2) == k_cache.size(3) && query.size(1) % k_cache.size(2) == 0,
              "query heads must be a multiple of the cache's KV heads, with its head dim");
  if (do_store) {
    TORCH_CHECK(slots.numel() == n && key.dim() == 3 && key.sizes() == value.sizes() && key.size(0) == n &&
                    key.size(1) == k_cache.size(2) && key.size(2) == k_cache.size(3),
                "one slot and (kv_heads, dim) key/value row per query");
    TORCH_CHECK(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(),
                "key/value must have the query's dtype");
    key = key.contiguous();
    value = value.contiguous();
  }
  query = query.contiguous();
  slots = slots.contiguous();
  blocks = blocks.contiguous();
  lens = lens.contiguous();
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  const int64_t* len_ptr = lens.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(!do_store || slot_ptr[i] < num_slots, "slot out of range");
    TORCH_CHECK(len_ptr[i] <= blocks.size(1) * k_cache.size(1), "length beyond the block table");
    const int64_t* row = blocks.data_ptr<int64_t>() + i * blocks.size(1);
    for (int64_t b = 0; b * k_cache.size(1) < len_ptr[i]; ++b)
      TORCH_CHECK(row[b] >= 0 && row[b] < k_cache.size(0), "block id out of range");
  }
  auto out = at::empty_like(query);
  const int64_t* table = blocks.data_ptr<int64_t>();
  const int64_t max_blocks = blocks.size(1);
  auto run = [&](auto q_type, auto cache_type) {
    using Q = decltype(q_type);
    using T = decltype(cache_type);
    if (do_store) {
      store<Q, T>(key, k_cache, slot_ptr, n);
      store<Q, T>(value, v_cache, slot_ptr, n);
    }
    attend<Q, T>(query, k_cache, v_cache, table, max_blocks, len_ptr, scale, window, softcap, out);
  };
  const bool q_bf16 = query.scalar_type() == at::kBFloat16;
  if (k_cache.scalar_type() == at::kFloat) {
    q_bf16 ? run(c10::BFloat16(), float()) : run(float(), float());
  } else {
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "caches must be float32 or bfloat16");
    q_bf16 ? run(c10::BFloat16(), c10::BFloat16()) : run(float(), c10::BFloat16());
  }
  return out;
}

// Llama's RMSNorm on float32 rows: y = x * rsqrt(mean(x^2) + eps) * w, one pass to sum, one to write.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: float32 only");
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == hidden, "rms_norm: weight must be (hidden,)");
  x = x.contiguous();
  weight = weight.contiguous();
  auto out = at::empty_like(x);
  const int64_t rows = hidden == 0 ? 0 : x.numel() / hidden;
  const float* src = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float feps = static_cast<float>(eps), inv_hidden = 1.f / static_cast<float>(hidden);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, hidden));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* a = src + r * hidden;
      float* y = dst + r * hidden;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < hidden; ++j) sq += a[j] * a[j];
      const float k = 1.f / std::sqrt(sq * inv_hidden + feps);
#pragma omp simd
      for (int64_t j = 0; j < hidden; ++j) y[j] = a[j] * k * w[j];
    }
  });
  return out;
}

// Rotary embedding of float32 / bfloat16 heads: rows (n, heads, head_dim) with any token stride, cos / sin
// (n, 1, rotary_dim) in the rows' dtype. Dim j < rotary_dim / 2 becomes x_j cos_j - x_{j+half} sin_j, dim
// j + half becomes x_{j+half} cos_{j+half} + x_j sin_{j+half}; dims past rotary_dim are copied. Rounded as
// torch's x * cos + rotated * sin is, product by product then the sum (no fused multiply-add; in bfloat16
// each to bfloat16): bit for bit the torch path's result in both dtypes.
template <typename T>
__attribute__((optimize("fp-contract=off"))) static void rotate_rows(const T* x, int64_t token_stride, const T* cos,
                                                              const T* sin, T* out, int64_t n, int64_t heads,
                                                              int64_t d, int64_t rd) {
  const int64_t half = rd / 2;
  for (int64_t t = 0; t < n; ++t) {
    const T* c = cos + t * rd;
    const T* s = sin + t * rd;
    for (int64_t h = 0; h < heads; ++h) {
      const T* a = x + t * token_stride + h * d;
      T* o = out + (t * heads + h) * d;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const float lo = static_cast<float>(a[j]), hi = static_cast<float>(a[j + half]);
        const float p1 = rounded<T>(lo * static_cast<float>(c[j])), p2 = rounded<T>(hi * static_cast<float>(s[j]));
        const float p3 = rounded<T>(hi * static_cast<float>(c[j + half]));
        const float p4 = rounded<T>(lo * static_cast<float>(s[j + half]));
        o[j] = static_cast<T>(p1 - p2);
        o[j + half] = static_cast<T>(p3 + p4);
      }
      for (int64_t j = rd; j < d; ++j) o[j] = a[j];
    }
  }
}

at::Tensor rotary(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 3 && cos.sizes() == sin.sizes(), "rotary: x (n, heads, dim), cos/sin (n, 1, rd)");
  TORCH_CHECK(x.scalar_type() == cos.scalar_type() && x.scalar_type() == sin.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rotary: x, cos and sin in one dtype, float32 or bfloat16");
  const int64_t n = x.size(0), heads = x.size(1), d = x.size(2), rd = cos.size(2);
  TORCH_CHECK(cos.size(0) == n && cos.size(1) == 1 && rd <= d && rd % 2 == 0, "rotary: cos/sin must be (n, 1, even rd <= dim)");
  if (x.stride(2) != 1 || x.stride(1) != d) x = x.contiguous();  // each token's heads must be one row
  cos = cos.contiguous();
  sin = sin.contiguous();
  auto out = at::empty({n, heads, d}, x.options());
  if (x.scalar_type() == at::kFloat) {
    rotate_rows<float>(x.data_ptr<float>(), x.stride(0), cos.data_ptr<float>(), sin.data_ptr<float>(),
                       out.data_ptr<float>(), n, heads, d, rd);
  } else {
    rotate_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), x.stride(0), cos.data_ptr<c10::BFloat16>(),
                               sin.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), n, heads, d, rd);
  }
  return out;
}

// The gated MLP's silu(gate) * up of bfloat16 rows (n, 2 * inter) [gate | up] -> (n, inter), rounded as
// torch's bfloat16 F.silu(gate) * up is: silu to bfloat16, then the product (its exp is not torch's, so a
// value on a rounding boundary can land one bfloat16 step away).
at::Tensor silu_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.scalar_type() == at::kBFloat16,
              "silu_mul: (n, 2 * inter) bfloat16");
  gate_up = gate_up.contiguous();
  const int64_t n = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = at::empty({n, inter}, gate_up.options());
  const c10::BFloat16* src = gate_up.data_ptr<c10::BFloat16>();
  c10::BFloat16* dst = out.data_ptr<c10::BFloat16>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inter));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> g(inter), u(inter);
    for (int64_t r = begin; r < end; ++r) {
      load_row(src + r * 2 * inter, g.data(), inter);
      load_row(src + r * 2 * inter + inter, u.data(), inter);
      c10::BFloat16* o = dst + r * inter;
#pragma omp simd
      for (int64_t j = 0; j < inter; ++j) g[j] = rounded<c10::BFloat16>(g[j] / (1.f + std::exp(-g[j]))) * u[j];
      for (int64_t j = 0; j < inter; ++j) o[j] = static_cast<c10::BFloat16>(g[j]);
    }
  });
  return out;
}
