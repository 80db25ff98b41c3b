// The Python module of the native CPU kernels: the one file that includes pybind11 and torch's tensor type
// casters (the kernels themselves compile against ATen's core headers only: cpu_ops.h).

#include "cpu_ops.h"

#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;

  m.def("decode_attention", &decode_attention, "store this step's K/V and attend each decode row (CPU)");
  m.def("rms_norm", &rms_norm, "Llama's RMSNorm of float32 rows (CPU)");
  m.def("rotary", &rotary, "rotary embedding of float32 / bfloat16 heads (CPU)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of bfloat16 [gate | up] rows (CPU)");
  m.def("int4_unpack", &int4_unpack, "rows of a packed int4 CPU weight as bfloat16 (int4_unpack.cpp)");
  m.def("int4_matmul_available", &int4_matmul_available, "whether int4_matmul has its vector path here");
  m.def("int4_matmul", &int4_matmul, "x @ W.T for a packed int4 CPU weight, bfloat16 (int4_matmul.cpp)",
        py::arg("x"), py::arg("packed"), py::arg("scale_zero"), py::arg("portable") = false);
  m.def("int4_grouped_matmul", &int4_grouped_matmul,
        "rows sorted by expert, each run through its expert's packed int4 weight (int4_grouped.cpp)");
  m.def("decode_layers", &decode_layers, "every int4 Llama layer of a decode-only step (decode_layers.cpp)");
  m.def("top_k_rows", &top_k_rows, "indices of each row's k largest values, float32 / bfloat16 (top_k.cpp)");
}
