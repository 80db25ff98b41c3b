"""Which kernels and weight forms the LLM engine computes with: chosen in its configuration (``kernels``),
resolved once at start into one frozen :class:`KernelPlan` that the engine logs and hands down.

Every choice defaults to ``auto``/on, which is what serving wants; turning one off is for comparing paths
(benchmarks, tests) or for working around a kernel. Nothing here imports torch: what the machine offers
(CUDA, Triton, the native CPU kernels) comes in as plain booleans, so :func:`resolve` is a pure function.

================================  =================================================================================
``kernels.attention``             ``auto`` (Triton on CUDA where it imports, torch elsewhere), ``triton``, ``torch``
                                  or ``reference`` (per-sequence loops: what the tests compare against)
``kernels.cpu_attention``         ``planned``: on the CPU, attention planned once per step (the native per-row
                                  kernel where built); ``paged``: padded block tables and the kernels' ops per
                                  layer, as on CUDA (runs CUDA's plumbing on a CPU)
``kernels.native_cpu``            Sluice's C++ CPU kernels (compiled once per machine); off: torch's ops
``kernels.native_decode_layers``  a decode step's layers in one native call (Llama-shaped int4 models)
``kernels.int4_matmul``           ``sluice``: Sluice's int4 matmul where built (AVX512-BF16); ``torch``: torch's
``kernels.int4_scales_only``      symmetric int4 weights keep their scales only (no zero points)
``kernels.int4_dense_prompts``    prompt rows through a dense bf16 GEMM: ``auto`` (where Sluice's int4 matmul is
                                  not used), ``on``, ``off``
``kernels.decode_graphs``         decode-only steps through a compiled graph per batch-size bucket, replayed as a
                                  CUDA graph (``model/decode_graphs.py``): ``auto`` (on CUDA), ``on``, ``off``; on
                                  the CPU ``on`` compiles without CUDA graphs (the tests' check of the graph path)
``kernels.decode_graph_sizes``    the batch sizes compiled (a step of ``n`` requests takes the smallest ``>= n``);
                                  empty: the powers of two below ``max_num_seqs``, and ``max_num_seqs``
================================  =================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_KERNELS = ("auto", "triton", "torch", "reference")
CPU_ATTENTION = ("planned", "paged")
INT4_MATMULS = ("sluice", "torch")
DENSE_PROMPTS = ("auto", "on", "off")
DECODE_GRAPHS = ("auto", "on", "off")


@dataclass(frozen=True)
class KernelOptions:
    """What the configuration asks for (``EngineConfig.kernels``; ``engine.kernels`` in a pipeline)."""

    attention: str = "auto"
    cpu_attention: str = "planned"
    native_cpu: bool = True
    native_decode_layers: bool = True
    int4_matmul: str = "sluice"
    int4_scales_only: bool = True
    int4_dense_prompts: str = "auto"
    decode_graphs: str = "auto"
    decode_graph_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name, allowed in (("attention", ATTENTION_KERNELS), ("cpu_attention", CPU_ATTENTION),
                              ("int4_matmul", INT4_MATMULS), ("int4_dense_prompts", DENSE_PROMPTS),
                              ("decode_graphs", DECODE_GRAPHS)):  # fmt: skip
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"kernels.{name} must be one of {', '.join(allowed)}, got {value!r}")
        object.__setattr__(self, "decode_graph_sizes", tuple(sorted(set(self.decode_graph_sizes))))
        if any(size < 1 for size in self.decode_graph_sizes):
            raise ValueError(f"kernels.decode_graph_sizes must be batch sizes of 1 or more, got "
                             f"{list(self.decode_graph_sizes)}")  # fmt: skip

    def describe(self) -> str:
        """What is asked, for ``sluice validate``: the choices that differ from the defaults, or ``defaults``
        (what the machine makes of them is known at start, and logged then)."""
        def shown(value: object) -> str:
            return {True: "on", False: "off"}.get(value, str(list(value) if isinstance(value, tuple) else value))  # type: ignore[call-overload]

        changed = [f"{name} {shown(getattr(self, name))}"
                   for name in self.__dataclass_fields__ if getattr(self, name) != getattr(DEFAULTS, name)]
        return ", ".join(changed) or "defaults"


DEFAULTS = KernelOptions()


@dataclass(frozen=True)
class Machine:
    """What this process can run, as the engine found it at start."""

    device_type: str  # "cpu" or "cuda"
    triton: bool = False  # triton imports
    triton_interpreted: bool = False  # Triton's CPU interpreter is on (tests)
    native_built: bool = False  # the native CPU kernels compiled and loaded (only asked where wanted)
    int4_kernel_built: bool = False  # ... with Sluice's int4 matmul (a CPU with AVX512-BF16)


@dataclass(frozen=True)
class KernelPlan:
    """The resolved choices, fixed for the engine's life. Read by the runner, the model and its layers."""

    attention: str  # "triton", "torch" or "reference": the KV store and paged attention's path
    cpu_attention_plan: bool  # CPU: attention planned once per step (else padded block tables per layer)
    native_cpu: bool  # the native CPU kernels are used (built, wanted, on the CPU)
    native_decode_layers: bool  # decode steps of eligible models through one native call
    int4_matmul: bool  # Sluice's int4 matmul (else torch's)
    int4_scales_only: bool  # symmetric int4 weights keep their scales only
    dense_prompts: bool  # int4 projections take prompt rows through a dense bf16 GEMM
    decode_graphs: bool = False  # decode-only steps through compiled graphs (CUDA graphs on CUDA)
    decode_graph_sizes: tuple[int, ...] = ()  # the batch sizes compiled; empty: from max_num_seqs

    def describe(self) -> str:
        """One line for the start-up log and ``sluice validate``."""
        on = {True: "on", False: "off"}
        return (f"attention {self.attention}{' (planned per step)' if self.cpu_attention_plan else ''}, "
                f"native CPU kernels {on[self.native_cpu]}, native decode layers {on[self.native_decode_layers]}, "
                f"int4 matmul {'sluice' if self.int4_matmul else 'torch'}, "
                f"int4 scales-only {on[self.int4_scales_only]}, dense prompt rows {on[self.dense_prompts]}, "
                f"decode graphs {on[self.decode_graphs]}")


def resolve(options: KernelOptions, machine: Machine) -> KernelPlan:
    """The plan for ``options`` on ``machine``. ValueError when a forced choice cannot run there."""
    cpu = machine.device_type == "cpu"
    attention = options.attention
    if attention == "auto":
        attention = "triton" if not cpu and machine.triton else "torch"
    if attention == "triton" and not machine.triton:
        raise ValueError("kernels.attention: triton needs the triton package (pip install 'sluice[triton]')")
    if attention == "triton" and cpu and not machine.triton_interpreted:
        raise ValueError("kernels.attention: triton needs a CUDA device (on the CPU only under Triton's "
                         "interpreter, TRITON_INTERPRET=1, which the tests use); use auto")
    native = cpu and options.native_cpu and machine.native_built
    int4 = native and options.int4_matmul == "sluice" and machine.int4_kernel_built
    dense = options.int4_dense_prompts == "on" or (options.int4_dense_prompts == "auto" and not int4)
    graphs = options.decode_graphs == "on" or (options.decode_graphs == "auto" and not cpu)
    if graphs and cpu and (options.cpu_attention != "paged" or native):
        raise ValueError("kernels.decode_graphs: on compiles the decode step through the kernels' ops, which on "
                         "the CPU needs kernels.cpu_attention: paged and kernels.native_cpu: false (a check of "
                         "the GPU's graph path; auto leaves CPU steps eager)")  # fmt: skip
    return KernelPlan(
        attention=attention,
        cpu_attention_plan=cpu and options.cpu_attention == "planned",
        native_cpu=native,
        native_decode_layers=int4 and options.native_decode_layers,
        int4_matmul=int4,
        int4_scales_only=int4 and options.int4_scales_only,
        dense_prompts=native and dense,  # the dense path unpacks int4 rows with a native kernel
        decode_graphs=graphs,
        decode_graph_sizes=options.decode_graph_sizes,
    )
