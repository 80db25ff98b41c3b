// The native CPU kernels of the LLM engine, as one extension module (bindings.cpp binds them): each file
// defines one concept, this header lets them call each other without a trip through Python.
//
// The kernels include only ATen's core headers (the tensor type, parallel_for, the few operators they call),
// never <torch/extension.h>: that header costs ~22 s of compile time per file on two cores, these ~2-5 s,
// and the kernels are compiled on the user's machine at the first start (cpu/native_cpu.py).
#pragma once

#define TORCH_ASSERT_ONLY_METHOD_OPERATORS  // per-operator headers below, not all of ATen's functions
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

// cpu_ops.cpp
at::Tensor decode_attention(at::Tensor query, at::Tensor key, at::Tensor value, at::Tensor k_cache,
                               at::Tensor v_cache, at::Tensor slots, at::Tensor blocks, at::Tensor lens,
                               double scale, int64_t window, double softcap);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor rotary(at::Tensor x, at::Tensor cos, at::Tensor sin);
at::Tensor silu_mul(at::Tensor gate_up);

// int4_unpack.cpp
void int4_unpack(const at::Tensor& packed, const at::Tensor& scale_zero, int64_t row0, at::Tensor& out,
                 int64_t block, bool halves);

// int4_matmul.cpp
bool int4_matmul_available();
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale_zero,
                          bool portable = false);

// int4_grouped.cpp
at::Tensor int4_grouped_matmul(const at::Tensor& x, const at::Tensor& ends, const std::vector<at::Tensor>& packed,
                                  const std::vector<at::Tensor>& scale_zero);

// top_k.cpp
at::Tensor top_k_rows(const at::Tensor& x, int64_t k);

// decode_layers.cpp
at::Tensor decode_layers(at::Tensor h, const std::vector<std::vector<at::Tensor>>& layers,
                            const std::vector<std::vector<int64_t>>& sizes, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& slots, const at::Tensor& blocks,
                            const at::Tensor& lens, double eps, double scale);
