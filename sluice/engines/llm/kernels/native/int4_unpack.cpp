// Dequantise rows of an int4 weight in torch's packed CPU layout (what _convert_weight_to_int4pack_for_cpu
// writes and _weight_int4pack_mm_for_cpu reads) into a bfloat16 matrix, for a dense GEMM over many rows.
//
// Layout (checked against torch's packing by tests/engines/test_int4_dense.py): packed is (Np, K / 2)
// uint8, Np a multiple of 16. Rows form tiles of 64; tile b holds, for every k, 32 bytes at
// b * 64 * (K / 2) + k * 32 + j: row 64 b + j in the low nibble and row 64 b + 32 + j in the high one.
// The rows past the last whole tile (nb = Np % 64 of them) hold, for every k, nb / 2 bytes at
// tail + k * (nb / 2) + j / 2: row j in the low nibble when j is even, the high one when odd.
// scale_zero is (K / 32, Np, 2) bfloat16; w = (q - 8) * scale + zero, computed in float32, rounded to
// bfloat16 (nearest even).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <bit>
#include <cstdint>

namespace {

constexpr int64_t kTile = 64;
constexpr int64_t kGroup = 32;

// float32 -> bfloat16 bits, rounded to nearest even: c10's conversion, without its NaN branch (the values
// here are finite), so that the loops vectorise.
inline uint16_t to_bf16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// One whole tile's rows [first, first + 64) into out, a quant group (32 k) at a time: its 1 KB of bytes
// (k-major) transposed to row-major, then each byte row dequantised into two weight rows (vectorised).
void unpack_tile(const uint8_t* src, const c10::BFloat16* sz, int64_t np, int64_t k_size, int64_t first,
                 c10::BFloat16* dst) {
  alignas(64) uint8_t rows[32][kGroup];
  for (int64_t g = 0; g < k_size / kGroup; ++g) {
    const uint8_t* b = src + g * kGroup * 32;
    for (int64_t i = 0; i < kGroup; ++i)
      for (int64_t j = 0; j < 32; ++j) rows[j][i] = b[i * 32 + j];
    const c10::BFloat16* group_sz = sz + (g * np + first) * 2;
    for (int64_t j = 0; j < 32; ++j) {
      const float s_lo = static_cast<float>(group_sz[2 * j]), z_lo = static_cast<float>(group_sz[2 * j + 1]);
      const float s_hi = static_cast<float>(group_sz[2 * (j + 32)]);
      const float z_hi = static_cast<float>(group_sz[2 * (j + 32) + 1]);
      uint16_t* lo = reinterpret_cast<uint16_t*>(dst + j * k_size + g * kGroup);
      uint16_t* hi = reinterpret_cast<uint16_t*>(dst + (j + 32) * k_size + g * kGroup);
      const uint8_t* r = rows[j];
#pragma omp simd
      for (int64_t i = 0; i < kGroup; ++i) {
        lo[i] = to_bf16_bits((static_cast<float>(r[i] & 15) - 8.f) * s_lo + z_lo);
        hi[i] = to_bf16_bits((static_cast<float>(r[i] >> 4) - 8.f) * s_hi + z_hi);
      }
    }
  }
}

// Rows [first, first + count) of the weight into out (row r of the weight -> out row r - out_row0); rows of
// whole tiles go a tile at a time, the tail rows (and any partial tile) one by one.
void unpack_rows(const uint8_t* packed, const c10::BFloat16* sz, int64_t np, int64_t k_size, int64_t first,
                 int64_t count, int64_t out_row0, c10::BFloat16* out) {
  const int64_t full = np / kTile * kTile;
  const int64_t tail = np - full;
  for (int64_t r = first; r < first + count;) {
    if (r < full && r % kTile == 0 && r + kTile <= first + count) {
      unpack_tile(packed + r * (k_size / 2), sz, np, k_size, r, out + (r - out_row0) * k_size);
      r += kTile;
      continue;
    }
    const uint8_t* src;
    int64_t stride;
    int shift;
    if (r < full) {
      const int64_t j = r % kTile;
      src = packed + (r / kTile) * kTile * (k_size / 2) + (j % 32);
      stride = 32;
      shift = j < 32 ? 0 : 4;
    } else {
      const int64_t j = r - full;
      src = packed + full * (k_size / 2) + j / 2;
      stride = tail / 2;
      shift = (j & 1) ? 4 : 0;
    }
    c10::BFloat16* dst = out + (r - out_row0) * k_size;
    for (int64_t g = 0; g < k_size / kGroup; ++g) {
      const float scale = static_cast<float>(sz[(g * np + r) * 2]);
      const float zero = static_cast<float>(sz[(g * np + r) * 2 + 1]);
      const uint8_t* s = src + g * kGroup * stride;
      c10::BFloat16* d = dst + g * kGroup;
      for (int64_t i = 0; i < kGroup; ++i) {
        const float q = static_cast<float>((s[i * stride] >> shift) & 15) - 8.f;
        reinterpret_cast<uint16_t*>(d)[i] = to_bf16_bits(q * scale + zero);
      }
    }
    ++r;
  }
}

}  // namespace

// Rows [row0, row0 + out.size(0)) of the weight, dequantised into out ((rows, K) bfloat16, contiguous).
void int4_unpack(const torch::Tensor& packed, const torch::Tensor& scale_zero, int64_t row0, torch::Tensor& out) {
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "int4_unpack: packed must be (Np, K / 2) contiguous uint8");
  const int64_t np = packed.size(0), k_size = packed.size(1) * 2;
  TORCH_CHECK(np % 16 == 0 && k_size % kGroup == 0, "int4_unpack: Np must be a multiple of 16, K of 32");
  TORCH_CHECK(scale_zero.dim() == 3 && scale_zero.size(0) == k_size / kGroup && scale_zero.size(1) == np &&
                  scale_zero.size(2) == 2 && scale_zero.scalar_type() == at::kBFloat16 && scale_zero.is_contiguous(),
              "int4_unpack: scale_zero must be (K / 32, Np, 2) contiguous bfloat16");
  TORCH_CHECK(out.dim() == 2 && out.size(1) == k_size && out.scalar_type() == at::kBFloat16 && out.is_contiguous(),
              "int4_unpack: out must be (rows, K) contiguous bfloat16");
  const int64_t count = out.size(0);
  TORCH_CHECK(row0 >= 0 && row0 + count <= np, "int4_unpack: rows out of range");
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const c10::BFloat16* sz = scale_zero.data_ptr<c10::BFloat16>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  at::parallel_for(row0, row0 + count, kTile, [&](int64_t begin, int64_t end) {
    unpack_rows(p, sz, np, k_size, begin, end - begin, row0, o);
  });
}
