"""One workload on one engine: Sluice's LLM engine, ``llama-server`` or HF ``generate``; see ``llm_peers.py``.

Each run happens in a process of its own (a spawned child for Sluice and HF, the server itself for
llama.cpp), so its peak RSS is its own: ``ru_maxrss`` of the child, ``VmHWM`` of the server. Times: output
tokens per second over the whole workload (first submission to last token), and per request the time from
its submission to its first token (TTFT). Model loading is not timed; a short warm-up runs first.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import resource
import socket
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_peers_workloads import Workload


@dataclass
class RunResult:
    engine: str  # e.g. "sluice", "llama-server-8", "hf-static-8"
    workload: str
    elapsed_s: float
    output_tokens: int
    ttft_s: list[float]
    peak_rss_mb: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _status_mb(field: str, pid: int | str = "self") -> float:
    """A memory line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


# ---------------------------------------------------------------- Sluice (runs in a child process)


def run_sluice(model: str, workload: Workload, threads: int, weights: str, kv_tokens: int,
               options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    import torch

    from sluice.engines.llm import LLM, SamplingParams

    torch.set_num_threads(threads)
    runtime_rss_mb = _status_mb("VmRSS")  # torch and Sluice imported, nothing loaded: the runtime's floor
    llm = LLM(model, weights=weights, max_num_seqs=max(1, min(64, workload.concurrency)),
              kv_cache_memory_bytes=kv_tokens * _kv_bytes_per_token(model, weights), **options)  # fmt: skip
    if llm.runner.kv_dtype.itemsize != (4 if weights == "fp32" else 2):
        raise RuntimeError(f"unexpected KV dtype {llm.runner.kv_dtype}: the pool is not sized as llama-server's")
    llm.generate([workload.prompts[0][:8]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    llm.kv.reset_prefix_cache()
    queue = deque(range(len(workload.prompts)))
    submitted: dict[str, float] = {}
    first: dict[str, float] = {}
    start = time.perf_counter()

    def submit() -> None:
        i = queue.popleft()
        rid = llm.add_request(workload.prompts[i], SamplingParams(max_tokens=workload.max_tokens[i], ignore_eos=True))
        submitted[rid] = time.perf_counter()

    for _ in range(min(workload.concurrency, len(queue))):
        submit()
    num_tokens = 0
    while llm.has_unfinished():
        finished = llm.step()
        now = time.perf_counter()
        for rid, request in llm.scheduler.requests.items():
            if rid not in first and request.num_output_tokens:
                first[rid] = now
        for out in finished:
            first.setdefault(out.request_id, now)
            num_tokens += len(out.token_ids)
            if queue:
                submit()
    elapsed = time.perf_counter() - start
    stats = llm.stats
    return {"elapsed_s": elapsed, "output_tokens": num_tokens, "ttft_s": [first[r] - submitted[r] for r in submitted],
            "peak_rss_mb": _rss_mb(), "extra": {"runtime_rss_mb": runtime_rss_mb, "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
                                                "num_steps": stats.num_steps, "num_preemptions": stats.num_preemptions}}  # fmt: skip


def run_sluice_at(root: str, *args: Any) -> dict[str, Any]:
    """``run_sluice`` with Sluice imported from ``root`` (a checkout of another commit: ``--baseline-ref``).
    Runs in a fresh spawned child, where nothing has imported Sluice yet."""
    from baseline import import_sluice_from

    import_sluice_from(root)
    return run_sluice(*args)


def _kv_bytes_per_token(model: str, weights: str) -> int:
    """K and V of every layer for one token: float32 for ``weights: fp32``, else bf16 (what ``kv_cache_dtype:
    auto`` gives packed weights; ``run_sluice`` checks it)."""
    try:
        from sluice.engines.llm.loading import checkpoint, gguf_file
    except ImportError:  # a --baseline-ref commit from before the engine's loading/ folder
        from sluice.engines.llm import checkpoint, gguf_file  # type: ignore[attr-defined,no-redef]

    gguf = checkpoint.find_gguf(model)
    if gguf is not None:
        cfg = checkpoint.model_config_from_gguf(gguf_file.GGUFFile(gguf))
    else:
        cfg = checkpoint.model_config_from_hf(json.loads((Path(model) / "config.json").read_text()))
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (4 if weights == "fp32" else 2)


# ---------------------------------------------------------------- llama-server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_llama_server(server: Path, model: str, workload: Workload, threads: int, slots: int,
                     log_dir: Path) -> RunResult:  # fmt: skip
    """Start ``llama-server`` with ``slots`` parallel sequences (continuous batching), each with room for the
    workload's longest request; send the workload; stop it."""
    ctx_per_slot = -(-(workload.max_request_tokens + 16) // 256) * 256
    port = _free_port()
    cmd = [str(server), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb",
           str(threads), "-np", str(slots), "-c", str(slots * ctx_per_slot), "--cont-batching", "--no-webui",
           "-fa", "auto"]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"llama-server-{workload.name}-{slots}.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(port, proc)
        _completion(port, workload.prompts[0][:8], 4)  # warm-up
        ttft: list[float] = []
        counts: list[int] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            t0 = time.perf_counter()
            first, n = _completion(port, workload.prompts[i], workload.max_tokens[i])
            with lock:
                ttft.append(first - t0)
                counts.append(n)

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workload.concurrency) as pool:
            list(pool.map(one, range(len(workload.prompts))))
        elapsed = time.perf_counter() - start
        rss = _status_mb("VmHWM", proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    if sum(counts) != workload.num_output_tokens:
        raise RuntimeError(f"llama-server produced {sum(counts)} tokens, expected {workload.num_output_tokens}")
    return RunResult(f"llama-server-{slots}", workload.name, elapsed, sum(counts), ttft, rss, {"slots": slots})


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready (see its log)")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server did not become ready")


def _completion(port: int, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """Stream one greedy completion of exactly ``max_tokens`` tokens: (time of the first token, tokens)."""
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0.0,
                       "top_k": 1, "stream": True, "cache_prompt": True})  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    first, tokens = 0.0, 0
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        event = json.loads(line[6:])
        if event.get("stop"):
            tokens = int(event.get("tokens_predicted", tokens))
            break
        if not first:
            first = time.perf_counter()
    conn.close()
    return first, tokens


# ---------------------------------------------------------------- HF generate (runs in a child process)


def run_hf(model: str, workload: Workload, threads: int, batch_size: int) -> dict[str, Any]:
    """Static padded batches of ``batch_size`` in order; a batch runs until its longest ``max_tokens``."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(threads)
    path = Path(model)
    if path.suffix == ".gguf":
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    else:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    class FirstToken(BaseStreamer):  # put() gets the prompt, then each step's new tokens
        def __init__(self) -> None:
            self.calls, self.at = 0, 0.0

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2:
                self.at = time.perf_counter()

        def end(self) -> None:
            pass

    def generate(batch: list[list[int]], new_tokens: int, streamer: Any = None) -> None:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, pad_token_id=0, streamer=streamer)  # fmt: skip

    generate([workload.prompts[0][:8]], 4)  # warm-up
    ttft: list[float] = []
    start = time.perf_counter()
    for b in range(0, len(workload.prompts), batch_size):
        streamer = FirstToken()
        batch = workload.prompts[b : b + batch_size]
        generate(batch, max(workload.max_tokens[b : b + batch_size]), streamer)
        ttft += [streamer.at - start] * len(batch)  # every request was submitted at the start
    return {"elapsed_s": time.perf_counter() - start, "output_tokens": workload.num_output_tokens, "ttft_s": ttft,
            "peak_rss_mb": _rss_mb(), "extra": {"batch_size": batch_size}}  # fmt: skip


def in_child(engine: str, workload: str, fn: Any, *args: Any) -> RunResult:
    """``fn(*args)`` in a fresh spawned process (its own peak RSS), as a RunResult."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        out = dict(pool.apply(fn, args))
    return RunResult(engine, workload, out["elapsed_s"], out["output_tokens"], out["ttft_s"], out["peak_rss_mb"],
                     out.get("extra", {}))  # fmt: skip


def environment_note() -> dict[str, Any]:
    return {"load_avg": os.getloadavg(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpu": cpu_note()}


_SIMD = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni")


def cpu_note() -> str:
    """The CPU's model name and the SIMD extensions both engines' kernels pick from: the ratios depend on them
    (llama.cpp has AVX-512 / AMX paths that torch's int4 kernel has not), so a table names its CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return f"{fields.get('model name', 'unknown CPU')} ({', '.join(f for f in _SIMD if f in flags) or 'no AVX2'})"
