// Dequantise rows of an int4 weight in torch's packed CPU layout (what _convert_weight_to_int4pack_for_cpu
// writes and _weight_int4pack_mm_for_cpu reads) into a bfloat16 matrix, transposed, for a dense GEMM over
// many rows: out = W[row0 : row0 + rows].T, (K, rows).
//
// torch's layout depends on the CPU capability its kernels were dispatched to (its BLOCK_N is four float
// vectors), so the caller names it (``block``, found by quant/int4_layout.py from torch's own packing):
// packed is (Np, K / 2) uint8, Np a multiple of 16, in blocks of ``block`` rows (64 under AVX512, 32 under
// AVX2 and without vectors). For every k a block holds block / 2 bytes at b * block * (K / 2) + k * block / 2:
//   * ``halves`` (AVX512, AVX2): byte j holds row j in its low nibble and row j + block / 2 in its high one;
//   * otherwise (no vectors), and in the rows past the last whole block (Np % block of them) in every
//     layout: byte j holds row 2 j (low nibble) and row 2 j + 1 (high).
// Either way a block's bytes for one k are its rows' values in an order that needs no transposition when
// written as columns of out. (tests/engines/llm/quant/test_int4_dense.py packs each layout in Python and
// checks torch's matches the one found.)
// scale_zero is (K / 32, Np, 2) bfloat16, or (K / 32, Np, 1) for scales only (zero points 0);
// w = (q - 8) * scale + zero, computed in float32, rounded to bfloat16 (nearest even).

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <bit>
#include <cstdint>

namespace {

constexpr int64_t kGroup = 32;

// float32 -> bfloat16 bits, rounded to nearest even: c10's conversion, without its NaN branch (the values
// here are finite), so that the loops vectorise.
inline uint16_t to_bf16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// The block whose first row is r0 (``block`` rows, or the tail's np % block) into columns of dst: value
// (k, r) at dst[k * ld + (r - r0)].
template <int64_t Half>
void unpack_block(const uint8_t* packed, const c10::BFloat16* sz, int64_t zs, int64_t np, int64_t k_size,
                  bool halves, int64_t r0, uint16_t* dst, int64_t ld) {
  constexpr int64_t kBlock = 2 * Half;
  const int64_t full = np / kBlock * kBlock;
  const int64_t width = r0 < full ? kBlock : np - full;
  const uint8_t* src = packed + r0 * (k_size / 2);
  alignas(64) float scale[kBlock], zero[kBlock];
  for (int64_t g = 0; g < k_size / kGroup; ++g) {
    const c10::BFloat16* group_sz = sz + (g * np + r0) * zs;
    for (int64_t j = 0; j < width; ++j) {
      scale[j] = static_cast<float>(group_sz[zs * j]);
      zero[j] = zs == 2 ? static_cast<float>(group_sz[2 * j + 1]) : 0.f;
    }
    for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) {
      const uint8_t* b = src + k * (width / 2);
      uint16_t* d = dst + k * ld;
      if (width == kBlock && halves) {
#pragma omp simd
        for (int64_t j = 0; j < Half; ++j) {
          d[j] = to_bf16_bits((static_cast<float>(b[j] & 15) - 8.f) * scale[j] + zero[j]);
          d[j + Half] = to_bf16_bits((static_cast<float>(b[j] >> 4) - 8.f) * scale[j + Half] + zero[j + Half]);
        }
      } else {
        for (int64_t j = 0; j < width; ++j) {
          const int q = (b[j / 2] >> ((j & 1) ? 4 : 0)) & 15;
          d[j] = to_bf16_bits((static_cast<float>(q) - 8.f) * scale[j] + zero[j]);
        }
      }
    }
  }
}

}  // namespace

// Rows [row0, row0 + out.size(1)) of the weight, dequantised and transposed into out ((K, rows) bfloat16,
// contiguous), in torch's layout of ``block`` rows (64 or 32), ``halves`` or not (see the top). row0 must
// start a block; the rows must end on a block or at the last row (Np).
void int4_unpack(const at::Tensor& packed, const at::Tensor& scale_zero, int64_t row0, at::Tensor& out,
                 int64_t block, bool halves) {
  TORCH_CHECK(block == 64 || block == 32, "int4_unpack: block must be 64 or 32 rows");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "int4_unpack: packed must be (Np, K / 2) contiguous uint8");
  const int64_t np = packed.size(0), k_size = packed.size(1) * 2;
  TORCH_CHECK(np % 16 == 0 && k_size % kGroup == 0, "int4_unpack: Np must be a multiple of 16, K of 32");
  TORCH_CHECK(scale_zero.dim() == 3 && scale_zero.size(0) == k_size / kGroup && scale_zero.size(1) == np &&
                  (scale_zero.size(2) == 2 || scale_zero.size(2) == 1) &&
                  scale_zero.scalar_type() == at::kBFloat16 && scale_zero.is_contiguous(),
              "int4_unpack: scale_zero must be (K / 32, Np, 2) or (K / 32, Np, 1) contiguous bfloat16");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == k_size && out.scalar_type() == at::kBFloat16 && out.is_contiguous(),
              "int4_unpack: out must be (K, rows) contiguous bfloat16");
  const int64_t count = out.size(1), full = np / block * block;
  TORCH_CHECK(row0 >= 0 && row0 + count <= np, "int4_unpack: rows out of range");
  TORCH_CHECK(row0 % block == 0 && ((row0 + count) % block == 0 || row0 + count == np),
              "int4_unpack: rows must start on a block of the layout and end on one or at the last row");
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const c10::BFloat16* sz = scale_zero.data_ptr<c10::BFloat16>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int64_t end = row0 + count;
  const int64_t blocks = (std::min(end, full) - row0 + block - 1) / block + (end > full ? 1 : 0);
  const int64_t zs = scale_zero.size(2);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t stop) {
    for (int64_t t = begin; t < stop; ++t) {
      const int64_t r0 = row0 + t * block;  // the tail, if any, is the last block and starts at full
      if (block == 64)
        unpack_block<32>(p, sz, zs, np, k_size, halves, r0, o + (r0 - row0), count);
      else
        unpack_block<16>(p, sz, zs, np, k_size, halves, r0, o + (r0 - row0), count);
    }
  });
}
