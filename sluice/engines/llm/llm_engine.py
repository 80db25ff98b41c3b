"""``LLM``: Sluice's own continuous-batching LLM engine.

Requests are added one at a time at any moment (``add_request``); every ``step()`` advances all running
requests by one scheduled chunk and returns those that finished::

    out = scheduler.schedule()                 # which requests compute how many tokens (and drafts)
    sampled = runner.execute(out)              # tensors -> model over the paged KV cache -> sampled tokens
    stops = outputs.check_stops(sampled)       # stop tokens / stop strings (max_tokens: the scheduler)
    finished = scheduler.update(out, ...)      # append tokens, cache full blocks, free finished requests

With ``num_speculative_tokens > 0`` a decoding request may emit several tokens in one step (prompt-lookup
drafts verified in the same forward pass, see ``speculation.py``); greedy outputs are the same as without
it, sampled outputs follow the same distribution. A stop inside an accepted run cuts the run there.

Structured output (``SamplingParams.structured_output``, see ``structured/``): the request's grammar is
compiled on a background thread while the rest of the batch steps on; it then runs like any other request,
except that each step fills the token bitmasks of all constrained rows in one call and the sampler masks
their logits. It ends with EOS once its grammar is complete, or with ``length`` at ``max_tokens``; a grammar
that cannot be compiled or followed finishes the request with ``finish_reason == "error"`` and the reason
in ``RequestOutput.error``.

The engine's rooms: the model is found and read by ``loading.py``, scheduled by ``scheduler.py``, run by
``model_runner.py``; per-request stop checks and the :class:`RequestOutput` (its contract: token ids include
a final stop token, text excludes a matched stop string) are ``output_processor.py``'s.

Not thread-safe: one thread drives ``add_request`` / ``step`` / ``abort``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from sluice.engines.llm import kernels
from sluice.engines.llm.config import EngineConfig
from sluice.engines.llm.core.kv_cache import KVCacheManager
from sluice.engines.llm.core.output import EngineStats, RequestOutput
from sluice.engines.llm.core.output_processor import OutputProcessor
from sluice.engines.llm.core.request import Request, RequestStatus, SamplingParams
from sluice.engines.llm.core.scheduler import Scheduler
from sluice.engines.llm.core.speculation import Drafter
from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.kernel_plan import KernelOptions, KernelPlan, Machine, resolve
from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer
from sluice.engines.llm.loading.model_files import describe_loaded, load_model, resolve_model_path
from sluice.engines.llm.model.model_runner import ModelRunner, resolve_device_dtype
from sluice.engines.llm.structured.backend import BACKENDS, BackendFactory, GrammarBackend, backend_class
from sluice.engines.llm.structured.compiler import GrammarCompiler
from sluice.engines.llm.structured.manager import StructuredOutputManager
from sluice.engines.llm.structured.token_table import token_table
from sluice.engines.start_log import StartLog

_GRAMMAR_WAIT_S = 0.01  # a step with nothing to compute waits this long for a grammar, instead of spinning

log = logging.getLogger(__name__)


class LLM:
    """Load a model of a supported family (GGUF file, HF safetensors directory, or a known model name; see
    ``model/families/family_registry.py``) and serve it.

    ``options`` are the fields of :class:`EngineConfig` (``max_num_seqs``, ``max_num_batched_tokens``,
    ``block_size``, ``enable_prefix_caching``, ``kv_cache_memory_bytes``, ``dtype``, ``device``,
    ``max_model_len``, ...); an unknown option is a TypeError. ``structured_output_backend`` is the
    grammar library for constrained requests: a name (``llguidance``, ``xgrammar``) or a factory taking
    the model's :class:`~sluice.engines.llm.structured.backend.TokenTable`; it is built at the first one.
    ``base_dir``: where a relative model path is (default: the working directory; see ``loading/model_files.py``).
    """

    def __init__(self, model: str | Path, *, structured_output_backend: str | BackendFactory = "llguidance",
                 base_dir: str | Path | None = None, **options: object) -> None:
        if isinstance(structured_output_backend, str) and structured_output_backend not in BACKENDS:
            raise ValueError(f"unknown structured_output_backend {structured_output_backend!r}; choose one of "
                             f"{', '.join(BACKENDS)}")
        if isinstance(options.get("kernels"), dict):
            options["kernels"] = KernelOptions(**options["kernels"])  # type: ignore[arg-type]
        self.config = EngineConfig(**options)  # type: ignore[arg-type]
        start = StartLog(f"llm {model}")  # a line per phase of the start, with its duration
        with start.phase("located the model") as phase:
            path = resolve_model_path(model, base_dir)
            phase.detail = str(path)
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        with start.phase("read weights and tokenizer") as phase:
            loaded = load_model(path)
            phase.detail = describe_loaded(loaded, path)
        model_config = self.model_config = loaded.config
        self.tokenizer: ChatTokenizer | None = loaded.tokenizer  # None: token-id prompts only
        self.max_model_len = min(
            self.config.max_model_len or model_config.max_context_len,
            model_config.max_context_len,
        )
        if self.max_model_len < (self.config.max_model_len or 0):
            log.warning("max_model_len %d is more than the model's context of %d tokens; using %d",
                        self.config.max_model_len, model_config.max_context_len, self.max_model_len)  # fmt: skip
        self.kernels = _kernel_plan(self.config.kernels, resolve_device_dtype(self.config)[0].type, start)
        with start.phase("built the model", announce=f"converting {len(loaded.tensors)} tensors") as phase:
            self.runner = ModelRunner(model_config, loaded.tensors, self.config, self.max_model_len, self.kernels,
                                      progress=lambda done, total: phase.progress(done, total, "tensors"))
            phase.detail = (f"{self.runner.device}, {self.runner.num_blocks} KV blocks of {self.config.block_size} "
                            f"tokens, {self.max_model_len} tokens of context")
        del loaded  # the runner holds the weights it placed; the tensors as read can go
        self.runner.capture_graphs(start, required=self.config.kernels.decode_graphs == "on")
        self.kv = KVCacheManager(self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching,
                                 mark_prompt_positions=self.runner.routes_prompt_rows)  # fmt: skip
        c = self.config
        self._grammar_backend = structured_output_backend
        self.structured = StructuredOutputManager(GrammarCompiler(self._make_grammar_backend),
                                                  pin_memory=self.runner.device.type == "cuda")
        self.drafter = (
            Drafter(c.num_speculative_tokens, c.speculative_ngram_max, c.speculative_ngram_min,
                    adaptive=c.speculative_adaptive, constraint=self.structured)
            if c.num_speculative_tokens else None
        )  # fmt: skip
        self.scheduler = Scheduler(
            self.kv, c.max_num_seqs, c.max_num_batched_tokens, max_model_len=self.max_model_len, drafter=self.drafter,
            recompute_past_len=self.runner.long_rope_switch_len,
        )
        self.outputs = OutputProcessor(self.tokenizer, model_config.eos_token_ids, self.structured)
        self._ids = itertools.count()
        self._num_prompt_tokens = 0
        self._num_output_tokens = 0
        self._num_steps = 0
        self._num_requests = 0

    # ---- requests ------------------------------------------------------------------------------------

    def add_request(
        self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue a prompt (text or token ids); return its request id.

        ValueError (naming the lengths) when the prompt cannot fit ``max_model_len`` or the KV pool. A
        request with ``structured_output`` first waits for its grammar (compiled in the background); an
        invalid constraint is not an error here but a finished output with ``finish_reason == "error"``.
        """
        params = params or SamplingParams()
        if isinstance(prompt, str):
            prompt_ids = self._require_tokenizer("text prompts").encode(prompt)
        else:
            prompt_ids = list(prompt)
        if params.stop:
            self._require_tokenizer("stop strings")
        if params.structured_output is not None:
            self._require_tokenizer("constrained requests (structured_output)")
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.outputs:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        request = Request(request_id, prompt_ids, params)
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request_id!r}: prompt has {request.num_tokens} tokens but max_model_len is "
                f"{self.max_model_len}, which leaves no room to generate; shorten the prompt"
            )
        for token_id in prompt_ids:
            if token_id >= self.model_config.vocab_size:
                raise ValueError(f"request {request_id!r}: token id {token_id} >= vocab size "
                                 f"{self.model_config.vocab_size}")  # fmt: skip
        if params.structured_output is not None:
            self.scheduler.check(request)  # fail now, not after the grammar is compiled
            self.structured.add(request)  # joins the scheduler once its grammar is compiled
        else:
            self.scheduler.add(request)
        self.outputs.add(request_id, params)
        self._num_prompt_tokens += request.num_prompt_tokens
        self._num_requests += 1
        return request_id

    def abort(self, request_id: str) -> bool:
        """Drop a request (any state) and free its KV blocks; False if it is unknown or already finished."""
        self.outputs.discard(request_id)
        waiting = self.structured.remove(request_id)
        if waiting is not None:  # still waiting for its grammar: the scheduler never saw it
            waiting.move_to(RequestStatus.FINISHED_ABORTED)
            return True
        return self.scheduler.abort(request_id) is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.structured.num_waiting > 0

    def close(self) -> None:
        """Stop the grammar compile thread. The engine must not be stepped afterwards."""
        self.structured.close()

    # ---- the step ------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Advance every running request by one scheduled chunk; return the requests that finished."""
        outputs = self._admit_compiled()
        out = self.scheduler.schedule()
        if not out.scheduled:
            if not outputs and self.structured.num_waiting:
                self.structured.wait(_GRAMMAR_WAIT_S)  # nothing else to compute: wait for a grammar
            return outputs
        start_s = time.perf_counter()
        sampled = self.runner.execute(out.scheduled, self.structured.fill_bitmask(out.scheduled))
        # The gate weighs drafts against decode steps: fit its cost model on steps without prompt chunks
        # (a long prefill's per-token cost says little about a few more rows in a decode step).
        if self.drafter is not None and all(s.num_new_tokens == 1 + len(s.draft_token_ids) for s in out.scheduled):
            self.drafter.record_step(out.num_batched_tokens, time.perf_counter() - start_s)
        tokens, stops = self.outputs.check_stops(sampled, self.scheduler)
        finished = self.scheduler.update(out, tokens, stops)
        self._num_steps += 1
        self._num_output_tokens += sum(len(t) for t in tokens.values())
        for request in finished:
            self.structured.remove(request.request_id)
        return outputs + [self.outputs.output(r) for r in finished]

    def _admit_compiled(self) -> list[RequestOutput]:
        """Hand requests whose grammar is ready to the scheduler; finish those whose grammar failed."""
        ready, failed = self.structured.poll()
        for request in ready:
            self.scheduler.add(request)
        outputs = []
        for request, reason in failed:
            request.move_to(RequestStatus.FINISHED_ERROR)
            self.outputs.fail(request.request_id, reason)
            outputs.append(self.outputs.output(request))
        return outputs

    # ---- conveniences --------------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run the prompts to completion, batched together; outputs in the order of ``prompts``."""
        param_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(param_list) != len(prompts):
            raise ValueError(f"got {len(param_list)} SamplingParams for {len(prompts)} prompts")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, param_list, strict=True):
                ids.append(self.add_request(prompt, sp))
        except ValueError:
            for request_id in ids:  # all or nothing: no half-added batch left running
                self.abort(request_id)
            raise
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for o in self.step():
                done[o.request_id] = o
        return [done[i] for i in ids]

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self._require_tokenizer("chat templates").apply_chat_template(messages, add_generation_prompt)

    @property
    def stats(self) -> EngineStats:
        return EngineStats(
            num_prompt_tokens=self._num_prompt_tokens,
            num_output_tokens=self._num_output_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=self.kv.stats.hit_rate,
            kv_usage=self.kv.usage,
            num_kv_blocks=self.kv.num_blocks,
            num_steps=self._num_steps,
            num_draft_tokens=self.drafter.stats.num_draft_tokens if self.drafter else 0,
            num_accepted_draft_tokens=self.drafter.stats.num_accepted_tokens if self.drafter else 0,
            spec_acceptance_rate=self.drafter.stats.acceptance_rate if self.drafter else 0.0,
            num_requests=self._num_requests,
            num_prefix_query_tokens=self.kv.stats.num_query_tokens,
            num_prefix_hit_tokens=self.kv.stats.num_hit_tokens,
            structured=self.structured.stats,
            num_graph_steps=self.runner.graphs.num_steps if self.runner.graphs is not None else 0,
        )

    def _make_grammar_backend(self) -> GrammarBackend:
        """The grammar backend over this model's tokens (runs on the compile thread, once)."""
        tokenizer = self._require_tokenizer("constrained requests (structured_output)")
        table = token_table(tokenizer.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids)
        make = self._grammar_backend
        backend: GrammarBackend = (backend_class(make) if isinstance(make, str) else make)(table)
        return backend

    def _require_tokenizer(self, what: str) -> ChatTokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{what} need a tokenizer, and this model directory has none; pass token ids")
        return self.tokenizer


def _kernel_plan(options: KernelOptions, device_type: str, start: StartLog) -> KernelPlan:
    """The engine's kernel plan: what this machine has, asked only where the options want it (the native
    kernels are compiled here at the first start on a machine, logged as a phase)."""
    native = int4 = False
    if device_type == "cpu" and options.native_cpu:
        with start.phase("native CPU kernels ready") as phase:
            native = native_cpu.load() is not None
            int4 = native and native_cpu.int4_matmul_available()
            phase.detail = "available" if native else "unavailable: the torch path"
    wants_triton = options.attention == "triton" or (options.attention == "auto" and device_type != "cpu")
    triton = wants_triton and kernels.triton_importable()
    machine = Machine(device_type, triton, kernels.triton_interpreted(), native, int4)
    plan = resolve(options, machine)
    log.info("llm kernels: %s", plan.describe())
    return plan
