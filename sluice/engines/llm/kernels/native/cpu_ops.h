// The native CPU kernels of the LLM engine, as one extension module (cpu_ops.cpp binds them): each file
// defines one concept, this header lets them call each other without a trip through Python.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

// cpu_ops.cpp
torch::Tensor decode_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, torch::Tensor k_cache,
                               torch::Tensor v_cache, torch::Tensor slots, torch::Tensor blocks, torch::Tensor lens,
                               double scale, int64_t window, double softcap);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor rotary(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gate_up);

// int4_unpack.cpp
void int4_unpack(const torch::Tensor& packed, const torch::Tensor& scale_zero, int64_t row0, torch::Tensor& out);

// int4_matmul.cpp
bool int4_matmul_available();
torch::Tensor int4_matmul(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scale_zero,
                          bool portable = false);

// top_k.cpp
torch::Tensor top_k_rows(const torch::Tensor& x, int64_t k);

// decode_layers.cpp
torch::Tensor decode_layers(torch::Tensor h, const std::vector<std::vector<torch::Tensor>>& layers,
                            const std::vector<std::vector<int64_t>>& sizes, const torch::Tensor& cos,
                            const torch::Tensor& sin, const torch::Tensor& slots, const torch::Tensor& blocks,
                            const torch::Tensor& lens, double eps, double scale);
