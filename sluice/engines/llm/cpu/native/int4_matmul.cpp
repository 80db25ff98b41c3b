// x @ W.T for an int4 weight in torch's packed CPU layout (the layout of int4_unpack.cpp): every row of an int4
// projection and of the int4 LM head where this CPU has AVX512-BF16. At a few rows a decode step is bound by
// the weight bytes it reads, which torch's _weight_int4pack_mm_for_cpu does not reach: it dequantises every
// weight to float32 ((q - 8) * scale + zero) before its multiply-add, well below the memory's rate (this
// kernel comes near it). At hundreds of rows both are bound by arithmetic; this one does half of torch's, and
// matches a bf16 GEMM over the unpacked weight (bench/int4_matmul.py measures all three).
//
// Here a weight is never dequantised. Nibbles become bfloat16 integers (q - 8, exact) by a table lookup, and
// AVX512-BF16's dot product multiplies them with pairs of activations (k, k + 1) into float32; per group of
// 32 inputs and row, y += scale * sum((q - 8) * x) + zero * sum(x), sum(x) taken once per activation row.
//
// Guarantees:
// * Exact weights: (q - 8) * x is exact in float32 (bfloat16 x, a 4-bit integer); sums are float32. The
//   result differs from torch's kernel by float32 summation order, then both round to bfloat16 (nearest even).
// * A row's result does not depend on the other rows of the call: every (activation row, weight row) pair is
//   summed in one fixed order whatever M is or how rows are grouped (what lets the engine batch rows freely).
// * Whole 64-row tiles take the vector path; the rows past them (Np % 64: 16, 32 or 48) a scalar one, which
//   sums in another order but is likewise independent of M.
//
// Layout reminder: a 64-row tile at row r0 holds, for every k, 32 bytes: byte j = row r0 + j (low nibble),
// row r0 + 32 + j (high nibble), so the bytes of k and k + 1 are 64 adjacent bytes. scale_zero (K / 32, Np, 2)
// bfloat16: per group and row (scale, zero); w = (q - 8) * scale + zero. Or (K / 32, Np, 1): scales only,
// every zero point 0 (a GGUF Q4_0 tensor, a symmetric LM head), which this kernel then never reads: 18 bytes
// per 32 weights instead of 20, a tenth less of what a decode step streams. Same results as the (scale, 0)
// pairs bit for bit (adding zero * sum(x) = 0 changes no float).

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define SLUICE_INT4_AVX512 1
#else
#define SLUICE_INT4_AVX512 0
#endif
#if SLUICE_INT4_AVX512 && defined(__AVX512VBMI__)
#define SLUICE_INT4_VBMI 1
#else
#define SLUICE_INT4_VBMI 0
#endif

namespace {

constexpr int64_t kTile = 64;
constexpr int64_t kGroup = 32;
constexpr int64_t kRowsAtOnce = 4;  // activation rows sharing each converted weight vector

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

inline uint16_t to_bf16_bits(float x) {  // nearest even, as torch rounds (finite values)
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Rows past the last whole tile: nb (16, 32 or 48) rows, for every k nb / 2 bytes, row j in the low nibble
// when j is even, the high one when odd. Plain float32 arithmetic, the same formula as the vector path.
void tail_rows(const uint16_t* x, const float* xsum, int64_t m_rows, int64_t k_size, const uint8_t* packed,
               const uint16_t* sz, int64_t zs, int64_t np, int64_t r0, uint16_t* out) {
  const int64_t nb = np - r0, groups = k_size / kGroup;
  const uint8_t* src = packed + r0 * (k_size / 2);
  for (int64_t m = 0; m < m_rows; ++m) {
    const uint16_t* xm = x + m * k_size;
    for (int64_t j = 0; j < nb; ++j) {
      float y = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float p = 0.f;
        for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) {
          const int q = (src[k * (nb / 2) + j / 2] >> ((j & 1) ? 4 : 0)) & 15;
          p += static_cast<float>(q - 8) * bf16_to_float(xm[k]);
        }
        const uint16_t* s = sz + (g * np + r0 + j) * zs;
        y += bf16_to_float(s[0]) * p;
        if (zs == 2) y += bf16_to_float(s[1]) * xsum[m * groups + g];
      }
      out[m * np + r0 + j] = to_bf16_bits(y);
    }
  }
}

#if SLUICE_INT4_AVX512

// The tile's bytes of k and k + 1 (64 adjacent bytes at b) paired for the bf16 dot product: output c (0, 1)
// holds in 32-bit lane i byte 16c + i of k in its low half and byte 16c + i of k + 1 in its high half, both
// zero-extended: rows r0 + 16c + i (low nibbles) and r0 + 32 + 16c + i (high nibbles) at k and k + 1.
// With VBMI one byte permute per output; without (Intel Cooper Lake), two widening loads, a shift and an or:
// the same vectors, so both give the same results.
// Built once per call and shared by every tile (not per tile: a 1B step visits some 8000 tiles).
struct BytePairs {
  __m512i lut;  // bf16 of (i & 15) - 8 for a 16-bit lane holding i: vpermw reads the low 5 bits of each index
#if SLUICE_INT4_VBMI
  __m512i gather[2];
#endif
  BytePairs() {
    alignas(64) uint16_t table[32];
    for (int i = 0; i < 32; ++i) table[i] = to_bf16_bits(static_cast<float>((i & 15) - 8));
    lut = _mm512_load_si512(table);
#if SLUICE_INT4_VBMI
    alignas(64) uint8_t idx[2][64];
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 16; ++i) {
        idx[c][4 * i] = static_cast<uint8_t>(16 * c + i);
        idx[c][4 * i + 1] = 0;
        idx[c][4 * i + 2] = static_cast<uint8_t>(32 + 16 * c + i);
        idx[c][4 * i + 3] = 0;
      }
    gather[0] = _mm512_load_si512(idx[0]);
    gather[1] = _mm512_load_si512(idx[1]);
#endif
  }
  template <bool kVbmi>
  inline void operator()(const uint8_t* b, __m512i& v0, __m512i& v1) const {
#if SLUICE_INT4_VBMI
    if constexpr (kVbmi) {
      constexpr __mmask64 kEven = 0x5555555555555555ull;  // bytes 0 and 2 of each 32-bit lane
      const __m512i raw = _mm512_loadu_si512(b);
      v0 = _mm512_maskz_permutexvar_epi8(kEven, gather[0], raw);
      v1 = _mm512_maskz_permutexvar_epi8(kEven, gather[1], raw);
      return;
    }
#endif
    const auto widen = [b](int off) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + off))); };
    v0 = _mm512_or_si512(widen(0), _mm512_slli_epi32(widen(32), 16));
    v1 = _mm512_or_si512(widen(16), _mm512_slli_epi32(widen(48), 16));
  }
};

// One whole tile (rows r0 .. r0 + 63) for MT activation rows starting at m0. kScalesOnly: sz holds one
// scale per group and row, no zero points.
template <int MT, bool kVbmi, bool kScalesOnly>
void tile_rows(const BytePairs& pairs, const uint16_t* x, const float* xsum, int64_t m0, int64_t k_size, const uint8_t* packed,
               const uint16_t* sz, int64_t np, int64_t r0, uint16_t* out) {
  const int64_t groups = k_size / kGroup;
  const uint8_t* src = packed + r0 * (k_size / 2);
  const __m512i lut = pairs.lut;
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));

  alignas(64) float acc[MT][kTile];
  for (int m = 0; m < MT; ++m) std::fill(acc[m], acc[m] + kTile, 0.f);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 p[MT][4];  // per activation row: rows 0-15, 32-47, 16-31, 48-63 of the tile
    for (int m = 0; m < MT; ++m)
      for (int b = 0; b < 4; ++b) p[m][b] = _mm512_setzero_ps();
    const uint8_t* bytes = src + g * kGroup * 32;
    for (int64_t pair = 0; pair < kGroup / 2; ++pair) {
      __m512i v0, v1;
      pairs.template operator()<kVbmi>(bytes + pair * 64, v0, v1);
      const __m512bh w[4] = {
          (__m512bh)_mm512_permutexvar_epi16(v0, lut), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v0, 4), lut),
          (__m512bh)_mm512_permutexvar_epi16(v1, lut), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v1, 4), lut)};
      const int64_t k = g * kGroup + 2 * pair;
      for (int m = 0; m < MT; ++m) {
        int32_t xk;
        std::memcpy(&xk, x + (m0 + m) * k_size + k, sizeof(xk));
        const __m512bh xp = (__m512bh)_mm512_set1_epi32(xk);
        for (int b = 0; b < 4; ++b) p[m][b] = _mm512_dpbf16_ps(p[m][b], w[b], xp);
      }
    }
    // rows of p[.][b]: b = 0: r0 + 0..15, 1: r0 + 32..47, 2: r0 + 16..31, 3: r0 + 48..63
    static constexpr int kFirstRow[4] = {0, 32, 16, 48};
    for (int b = 0; b < 4; ++b) {
      if constexpr (kScalesOnly) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sz + g * np + r0 + kFirstRow[b]));
        const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
        for (int m = 0; m < MT; ++m) {
          float* a = acc[m] + kFirstRow[b];
          _mm512_store_ps(a, _mm512_fmadd_ps(p[m][b], scale, _mm512_load_ps(a)));
        }
        continue;
      }
      const __m512i packed_sz = _mm512_loadu_si512(sz + (g * np + r0 + kFirstRow[b]) * 2);
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(packed_sz, 16));
      const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(packed_sz, high_half));
      for (int m = 0; m < MT; ++m) {
        float* a = acc[m] + kFirstRow[b];
        __m512 y = _mm512_fmadd_ps(p[m][b], scale, _mm512_load_ps(a));
        y = _mm512_fmadd_ps(_mm512_set1_ps(xsum[(m0 + m) * groups + g]), zero, y);
        _mm512_store_ps(a, y);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int b = 0; b < kTile; b += 16) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_load_ps(acc[m] + b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (m0 + m) * np + r0 + b), (__m256i)y);
    }
}

template <bool kVbmi, bool kScalesOnly>
void whole_tile(const BytePairs& pairs, const uint16_t* x, const float* xsum, int64_t m_rows, int64_t k_size, const uint8_t* packed,
                const uint16_t* sz, int64_t np, int64_t r0, uint16_t* out) {
  int64_t m = 0;
  for (; m + kRowsAtOnce <= m_rows; m += kRowsAtOnce)
    tile_rows<kRowsAtOnce, kVbmi, kScalesOnly>(pairs, x, xsum, m, k_size, packed, sz, np, r0, out);
  switch (m_rows - m) {
    case 3: tile_rows<3, kVbmi, kScalesOnly>(pairs, x, xsum, m, k_size, packed, sz, np, r0, out); break;
    case 2: tile_rows<2, kVbmi, kScalesOnly>(pairs, x, xsum, m, k_size, packed, sz, np, r0, out); break;
    case 1: tile_rows<1, kVbmi, kScalesOnly>(pairs, x, xsum, m, k_size, packed, sz, np, r0, out); break;
    default: break;
  }
}

template <bool kScalesOnly>
void whole_tile_any(bool vbmi, const BytePairs& pairs, const uint16_t* x, const float* xsum, int64_t m_rows,
                    int64_t k_size, const uint8_t* packed, const uint16_t* sz, int64_t np, int64_t r0, uint16_t* out) {
  if (SLUICE_INT4_VBMI && vbmi)
    whole_tile<true, kScalesOnly>(pairs, x, xsum, m_rows, k_size, packed, sz, np, r0, out);
  else
    whole_tile<false, kScalesOnly>(pairs, x, xsum, m_rows, k_size, packed, sz, np, r0, out);
}

#endif  // SLUICE_INT4_AVX512

}  // namespace

// Whether this build has the vector path (AVX512-BF16 and BW): the engine uses int4_matmul only then.
bool int4_matmul_available() { return SLUICE_INT4_AVX512 != 0; }

// x (M, K) bfloat16 @ W.T -> (M, Np) bfloat16, W in torch's packed int4 CPU layout (see the top). portable:
// pair the bytes without VBMI even where the build has it (tests compare the two forms).
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale_zero,
                          bool portable) {
  TORCH_CHECK(SLUICE_INT4_AVX512, "int4_matmul: this build has no AVX512-BF16 path (check int4_matmul_available)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "int4_matmul: x must be (M, K) contiguous bfloat16");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "int4_matmul: packed must be (Np, K / 2) contiguous uint8");
  const int64_t m_rows = x.size(0), k_size = x.size(1), np = packed.size(0);
  TORCH_CHECK(packed.size(1) * 2 == k_size && k_size % kGroup == 0 && np % 16 == 0,
              "int4_matmul: packed must be (Np, K / 2) with K a multiple of 32 and Np of 16");
  TORCH_CHECK(scale_zero.dim() == 3 && scale_zero.size(0) == k_size / kGroup && scale_zero.size(1) == np &&
                  (scale_zero.size(2) == 2 || scale_zero.size(2) == 1) &&
                  scale_zero.scalar_type() == at::kBFloat16 && scale_zero.is_contiguous(),
              "int4_matmul: scale_zero must be (K / 32, Np, 2) or (K / 32, Np, 1) contiguous bfloat16");
  const int64_t zs = scale_zero.size(2);
  auto out = at::empty({m_rows, np}, x.options());
  if (m_rows == 0) return out;
  const int64_t groups = k_size / kGroup;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  // sum of each group of x, in one fixed order: what the zero points multiply (none kept: not needed)
  std::vector<float> xsum(zs == 2 ? m_rows * groups : 0);
  for (int64_t m = 0; m < (zs == 2 ? m_rows : 0); ++m)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.f;
      for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) s += bf16_to_float(xp[m * k_size + k]);
      xsum[m * groups + g] = s;
    }
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scale_zero.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int64_t full = np / kTile, tasks = full + (np % kTile ? 1 : 0);
#if SLUICE_INT4_AVX512
  const BytePairs pairs;
#endif
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
#if SLUICE_INT4_AVX512
      if (t < full) {
        if (zs == 1)
          whole_tile_any<true>(!portable, pairs, xp, xsum.data(), m_rows, k_size, pp, sp, np, t * kTile, op);
        else
          whole_tile_any<false>(!portable, pairs, xp, xsum.data(), m_rows, k_size, pp, sp, np, t * kTile, op);
        continue;
      }
#endif
      tail_rows(xp, xsum.data(), m_rows, k_size, pp, sp, zs, np, full * kTile, op);
    }
  });
  return out;
}
