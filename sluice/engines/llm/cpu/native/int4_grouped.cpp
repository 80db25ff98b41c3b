// The experts of a mixture-of-experts layer in one call: the rows sorted by expert, each expert's run of
// rows multiplied by that expert's packed int4 weight (int4_matmul.cpp). The loop over experts stays here,
// out of Python; an expert no row chose costs nothing. Each row's result is int4_matmul's for that row.

#include "cpu_ops.h"

// x (R, K) contiguous bfloat16, rows of expert e at [ends[e - 1], ends[e]) (ends (E,) int64, non-decreasing)
// -> (R, Np) bfloat16; packed[e] / scale_zero[e]: expert e's weight in int4_matmul's layout, Np rows each.
at::Tensor int4_grouped_matmul(const at::Tensor& x, const at::Tensor& ends, const std::vector<at::Tensor>& packed,
                                  const std::vector<at::Tensor>& scale_zero) {
  const int64_t experts = static_cast<int64_t>(packed.size());
  TORCH_CHECK(experts > 0 && static_cast<int64_t>(scale_zero.size()) == experts,
              "int4_grouped_matmul: one packed weight and one scale_zero per expert");
  TORCH_CHECK(ends.dim() == 1 && ends.size(0) == experts && ends.scalar_type() == at::kLong && ends.is_contiguous(),
              "int4_grouped_matmul: ends must be (experts,) contiguous int64");
  TORCH_CHECK(x.dim() == 2, "int4_grouped_matmul: x must be (R, K)");
  const int64_t rows = x.size(0), np = packed[0].size(0);
  auto out = at::empty({rows, np}, x.options());
  const int64_t* end = ends.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t e = 0; e < experts; ++e) {
    TORCH_CHECK(end[e] >= start && end[e] <= rows, "int4_grouped_matmul: ends must be non-decreasing, <= R");
    TORCH_CHECK(packed[e].size(0) == np, "int4_grouped_matmul: every expert must have Np rows");
    if (end[e] > start) {
      const int64_t n = end[e] - start;
      out.narrow(0, start, n).copy_(int4_matmul(x.narrow(0, start, n), packed[e], scale_zero[e], false));
    }
    start = end[e];
  }
  return out;
}
