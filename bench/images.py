"""Image classification as a bounded file job: images/s against the raw engine on the same batches and a per-record loop.

    .venv/bin/python bench/images.py [--num-images 2000] [--repeats 3] [--threads 2] [--min-ratio 0.9]
    .venv/bin/python bench/images.py --quick    # 96 images, a 4-layer model, one repeat: checks the script runs

The model is a random ViT classifier of ViT-Tiny's shape (224 px, patch 16, hidden 192, 12 layers, 3 heads, MLP
768, 1000 labels: 5.7 M parameters) on ONNX Runtime's CPU provider (``task: image-classification``). The images
are ``--num-images`` JPEG files of photo-like sizes (320x240 to 1024x768, both orientations; gradients, blocks
and grain, 15-175 kB each: a pool of 48 distinct pictures, one file per image) in a temp dir.

Rows, each run in turn in this process with the same warm engine, ``--repeats`` times:

1. ``sluice job (paths)``: what a user runs as a bounded backfill -- a Parquet file of ``image_path`` rows
   (``source.file``, ``codec.input_field: image_path``, ``engine.image.source: location``) -> fetch, decode and
   preprocess on the intake thread's pools -> batches of 32 -> the engine -> a Parquet output with the labels
   (``sink.file``), checkpoints included: the real runner, as bench/file_job.py runs it. images/s is rows over
   the run's wall time (engine start not counted: a warm engine, as in a long job).
2. ``sluice job (slow http)``: the same, but every row's location is a URL of a local HTTP server (a
   ``ThreadingHTTPServer`` in a child process, on the same cores) that sleeps ``--http-delay-ms`` before
   answering each request, with ``fetch_concurrency`` 64: fetching must overlap inference, not idle the engine.
3. ``raw engine, same batches``: every batch the job's engine thread ran in row 1 is recorded (the prepared
   items, as the engine got them) and replayed afterwards through the same warm ``engine.infer``, back to back,
   with nothing else running. Fetching, decoding and resizing are not in it (the operator does them on the
   intake thread, overlapped with inference), so ``job / raw`` of 1.0 means the file path and the image
   pipeline cost the engine nothing. The slow-http job's batches are replayed the same way (its own row).
4. ``per-record loop``: what a user writes without Sluice -- transformers' ``pipeline("image-classification")``
   on the same model directory (torch, ``--threads`` threads), called on one image path at a time.

Before the repeats, full batches warm the engine, and the intake's work alone is timed once (fetch, decode
and resize of a poll of 500 values at a time, no inference: can it keep up?). The two jobs alternate which
runs first from repeat to repeat. The process's CPU time per image of the engine (raw replay) and of the
intake (the paths) bounds the ratio where cores are few: the job needs both, the raw engine only the first.
The ratio reported for each row is the median over repeats of that repeat's ratio to the raw engine on its
job's batches (the per-record loop: to row 3's). Prints a table; writes ``bench/results/images.json``, ``.md``
(date, CPU, the command, load average before and after, versions) and ``.png``; ``--quick`` writes them to the
system's temp dir instead. Exits 1 when row 1's ratio is under ``--min-ratio``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

from file_job import RecordingEngine, run_recorded  # noqa: E402

from tests.support.tiny_images import VIT_TINY, image_bytes, picture, save_vit_classifier  # noqa: E402

RESULTS = ROOT / "bench" / "results"
NUM_LABELS = 1000
QUICK_SHAPE = {**VIT_TINY, "num_hidden_layers": 4}
SIZES = ((320, 240), (640, 480), (800, 600), (1024, 768), (480, 640), (768, 1024), (1024, 683), (500, 375))
DISTINCT_PICTURES = 48
FETCH_CONCURRENCY = 64
POLL_RECORDS = 500  # what the runner polls at once (sluice/operator/runner.py's _POLL_BATCH)
ROWS = {"job_paths": "sluice job (paths)", "job_http": "sluice job (slow http)",
        "raw_paths": "raw engine, same batches", "raw_http": "raw engine, the slow-http job's batches",
        "per_record": "per-record loop (transformers pipeline, torch)"}

# The slow server, run as a child process (its threads do not take this process's GIL): argv root, delay_s.
SLOW_SERVER = """
import sys, time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

class Slow(SimpleHTTPRequestHandler):
    def do_GET(self):
        time.sleep(DELAY_S)
        super().do_GET()

    def log_message(self, *args):
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 512
    daemon_threads = True

DELAY_S = float(sys.argv[2])
server = Server(("127.0.0.1", 0), partial(Slow, directory=sys.argv[1]))
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def write_images(folder: Path, num_images: int) -> list[str]:
    """``num_images`` JPEG files of photo-like sizes in ``folder``; their names."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pool = []
    for i in range(min(num_images, DISTINCT_PICTURES)):
        width, height = SIZES[i % len(SIZES)]
        pixels = np.asarray(picture(width, height, seed=i), dtype=np.float32)
        grain = rng.normal(0, 10, size=((height + 1) // 2, (width + 1) // 2, 3)).repeat(2, 0).repeat(2, 1)
        photo = Image.fromarray(np.clip(pixels + grain[:height, :width], 0, 255).astype(np.uint8), "RGB")
        pool.append(image_bytes(photo, "JPEG", quality=85))
    names = [f"img-{i:05d}.jpg" for i in range(num_images)]
    for i, name in enumerate(names):
        (folder / name).write_bytes(pool[i % len(pool)])
    return names


def write_sources(workdir: Path, names: list[str], base_url: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = pa.array(range(len(names)), pa.int32())
    pq.write_table(pa.table({"id": ids, "image_path": [f"images/{n}" for n in names]}), workdir / "paths.parquet")
    pq.write_table(pa.table({"id": ids, "image_path": [f"{base_url}/{n}" for n in names]}), workdir / "urls.parquet")


def pipeline_yaml(source: str, output: str, threads: int, batch_size: int) -> str:
    return f"""
source: {{file: {{path: {source}}}}}
codec: {{format: json, input_field: image_path}}
batching: {{max_batch_size: {batch_size}, max_queue_delay_ms: 50}}
engine: {{type: onnx, model: vit, providers: [cpu], intra_op_num_threads: {threads}, inter_op_num_threads: 1,
          export_cache_dir: exports, task: image-classification, top_k: 5,
          image: {{source: location, fetch_concurrency: {FETCH_CONCURRENCY}, fetch_timeout_s: 30}}}}
sink: {{file: {{path: {output}, overwrite: true}}, output: {{mode: merge, field: labels}}}}
runtime: {{commit_interval_ms: 1000}}
telemetry: {{status: "off"}}
"""


@contextmanager
def slow_server(root: Path, delay_s: float) -> Iterator[str]:
    """A local HTTP server of ``root``'s files that sleeps ``delay_s`` before each answer: its base URL."""
    server = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, str(root), str(delay_s)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def run_job(workdir: Path, loaded: Any, engine: Any, output: str) -> tuple[dict[str, Any], RecordingEngine]:
    """One job with ``engine``: its figures and the recorder of its batches."""
    import pyarrow.parquet as pq

    (workdir / f"{output}.checkpoint").unlink(missing_ok=True)  # each repeat a fresh job
    started_s = time.perf_counter()
    summary, recorder = run_recorded(loaded, engine, "images")
    written = sum(pq.read_metadata(part).num_rows for part in (workdir / output).glob("part-*.parquet"))
    figures = {"job_s": summary.elapsed_s, "written": written, "dead_lettered": summary.num_dead_lettered,
               "num_batches": len(recorder.batches), "mean_batch_size": summary.mean_batch_size,
               "engine_busy_share": recorder.busy_s / summary.elapsed_s,
               "first_batch_after_s": (recorder.first_batch_s or started_s) - started_s}
    return figures, recorder


def warm(engine: Any, values: list[str]) -> None:
    """Full batches through the engine a few times before anything is timed (arenas sized for them)."""
    items = engine.prepare_each(values)
    for _ in range(3):
        engine.infer(items)


def prepare_only(engine: Any, paths: list[str], urls: list[str]) -> tuple[dict[str, float], float]:
    """The intake's image work alone, a poll (500 values) per call as the runner makes it: seconds for each
    source, and this process's CPU seconds for the paths (fetch, decode, resize, normalise)."""
    seconds, cpu_s = {}, 0.0
    for name, values in (("paths", paths), ("http", urls)):
        start_s, start_cpu_s = time.perf_counter(), time.process_time()
        for first in range(0, len(values), POLL_RECORDS):
            engine.prepare_each(values[first : first + POLL_RECORDS])
        seconds[name] = time.perf_counter() - start_s
        if name == "paths":
            cpu_s = time.process_time() - start_cpu_s
    return seconds, cpu_s


def replay(engine: Any, batches: list[list[Any]]) -> dict[str, float]:
    """The same batches through the raw engine, back to back: seconds, and this process's CPU seconds."""
    start_s, start_cpu_s = time.perf_counter(), time.process_time()
    for items in batches:
        engine.infer(items)
    return {"s": time.perf_counter() - start_s, "cpu_s": time.process_time() - start_cpu_s}


def per_record_loop(model_dir: Path, paths: list[str], threads: int) -> tuple[float, list[str]]:
    """transformers' pipeline, one image path per call: (seconds, each image's top label)."""
    import torch
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()  # the slow-processor fallback notice
    classify = pipeline("image-classification", model=str(model_dir), device="cpu")
    classify(paths[0])  # warm
    top: list[str] = []
    start_s = time.perf_counter()
    for path in paths:
        top.append(classify(path, top_k=5)[0]["label"])
    return time.perf_counter() - start_s, top


def job_top_labels(workdir: Path, output: str) -> dict[int, str]:
    import pyarrow.parquet as pq

    tops: dict[int, str] = {}
    for part in (workdir / output).glob("part-*.parquet"):
        for row in pq.read_table(part, columns=["id", "labels"]).to_pylist():
            tops[row["id"]] = row["labels"][0]["label"]
    return tops


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("onnxruntime", "torch", "transformers", "pillow", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def summarise(repeats: list[dict[str, Any]], num_images: int) -> list[dict[str, Any]]:
    """One row per contender: images/s per repeat and median, ratio to the raw engine (median of repeats)."""
    raw_of = {"job_paths": "raw_paths", "job_http": "raw_http", "raw_paths": "raw_paths", "raw_http": "raw_http",
              "per_record": "raw_paths"}
    rows = []
    for key, name in ROWS.items():
        if not all(key in r for r in repeats):
            continue
        rates = [num_images / r[key]["s"] for r in repeats]
        ratios = [r[raw_of[key]]["s"] / r[key]["s"] for r in repeats]
        row = {"key": key, "name": name, "images_per_s": statistics.median(rates), "images_per_s_repeats": rates,
               "ratio_to_raw": statistics.median(ratios), "ratio_repeats": ratios}
        for extra in ("engine_busy_share", "mean_batch_size", "first_batch_after_s"):
            if extra in repeats[0][key]:
                row[extra] = statistics.median(r[key][extra] for r in repeats)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| row | images/s (median) | per repeat | vs raw engine, same batches | engine busy | "
             "mean batch | first batch after |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        busy = f"{100 * r['engine_busy_share']:.0f}%" if "engine_busy_share" in r else ""
        batch = f"{r['mean_batch_size']:.1f}" if "mean_batch_size" in r else ""
        first = f"{r['first_batch_after_s']:.2f} s" if "first_batch_after_s" in r else ""
        lines.append(f"| {r['name']} | {r['images_per_s']:.1f} | "
                     f"{' / '.join(f'{x:.1f}' for x in r['images_per_s_repeats'])} | {r['ratio_to_raw']:.3f}x | "
                     f"{busy} | {batch} | {first} |")
    return lines


def plot(rows: list[dict[str, Any]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"job_paths": "#1f77b4", "job_http": "#6baed6", "raw_paths": "#7f7f7f", "raw_http": "#bdbdbd",
              "per_record": "#d62728"}
    fig, ax = plt.subplots(figsize=(8, 4.2))
    names = [r["name"].replace(" (", "\n(").replace(", the", ",\nthe") for r in rows]
    bars = ax.barh(names[::-1], [r["images_per_s"] for r in rows][::-1],
                   color=[colors[r["key"]] for r in rows][::-1])
    for bar, r in zip(bars, rows[::-1], strict=True):
        ax.annotate(f"{r['images_per_s']:.1f}/s  ({r['ratio_to_raw']:.2f}x raw)",
                    (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlabel("images/s (median over repeats)")
    ax.set_xlim(0, 1.3 * max(r["images_per_s"] for r in rows))
    ax.set_title(title.replace(", random", ",\nrandom"), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=None, help="default 2000 (--quick: 96)")
    parser.add_argument("--repeats", type=int, default=3, help="each row's figure is the median over repeats")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (torch's too)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--http-delay-ms", type=float, default=100, help="the slow server's wait per request")
    parser.add_argument("--min-ratio", type=float, default=0.9, help="exit 1 when the paths job / raw is under it")
    parser.add_argument("--quick", action="store_true", help="96 images, a 4-layer model, one repeat; results "
                        "to the temp dir, not bench/results")
    parser.add_argument("--out", type=Path, default=None, help="the JSON result (.md and .png beside it); default "
                        "bench/results/images.json")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "bench/images.py", *(sys.argv[1:] if argv is None else argv)])
    shape = VIT_TINY
    if args.quick:
        args.repeats, shape = 1, QUICK_SHAPE
        args.out = args.out or Path(tempfile.gettempdir()) / "sluice-bench-images" / "images.json"
    args.num_images = args.num_images or (96 if args.quick else 2000)
    out: Path = args.out or RESULTS / "images.json"

    from sluice.config import load_pipeline
    from sluice.operator.build import build_engine

    load_start = load_average()
    started = datetime.datetime.now(datetime.timezone.utc)
    repeats: list[dict[str, Any]] = []
    intake_only: dict[str, float] = {}
    intake_cpu_s = 0.0
    with tempfile.TemporaryDirectory(prefix="sluice-bench-images-") as tmp:
        workdir = Path(tmp)
        print(f"images: writing the model and {args.num_images} images", file=sys.stderr, flush=True)
        save_vit_classifier(workdir / "vit", num_labels=NUM_LABELS, shape=shape)
        names = write_images(workdir / "images", args.num_images)
        file_bytes = [(workdir / "images" / n).stat().st_size for n in names[:DISTINCT_PICTURES]]
        with slow_server(workdir / "images", args.http_delay_ms / 1000) as base_url:
            write_sources(workdir, names, base_url)
            for job, source in (("paths", "paths.parquet"), ("http", "urls.parquet")):
                (workdir / f"{job}.yaml").write_text(pipeline_yaml(source, f"out-{job}.parquet", args.threads,
                                                                   args.batch_size))
            loaded = {job: load_pipeline(workdir / f"{job}.yaml") for job in ("paths", "http")}
            print("images: starting the engine (ONNX export, warm-up)", file=sys.stderr, flush=True)
            engine = build_engine(loaded["paths"])  # loaded and warmed up once; every repeat runs warm
            try:
                warm(engine, [f"images/{n}" for n in names[: args.batch_size]])
                intake_only, intake_cpu_s = prepare_only(engine, [f"images/{n}" for n in names],
                                                         [f"{base_url}/{n}" for n in names])
                print("images: the intake alone (fetch, decode, resize; no inference): " + ", ".join(
                    f"{k} {args.num_images / v:.1f}/s" for k, v in intake_only.items()), file=sys.stderr, flush=True)
                for repeat in range(args.repeats):
                    figures: dict[str, Any] = {}
                    for job in ("paths", "http") if repeat % 2 == 0 else ("http", "paths"):
                        job_figures, recorder = run_job(workdir, loaded[job], engine, f"out-{job}.parquet")
                        if job_figures["written"] != args.num_images or job_figures["dead_lettered"]:
                            raise SystemExit(f"images: the {job} job wrote {job_figures['written']} rows and "
                                             f"dead-lettered {job_figures['dead_lettered']} of {args.num_images}")
                        figures[f"job_{job}"] = {"s": job_figures.pop("job_s"), **job_figures}
                        figures[f"raw_{job}"] = replay(engine, recorder.batches)
                        del recorder
                    loop_s, loop_top = per_record_loop(workdir / "vit", [str(workdir / "images" / n) for n in names],
                                                       args.threads)
                    figures["per_record"] = {"s": loop_s}
                    tops = job_top_labels(workdir, "out-paths.parquet")
                    figures["top1_agreement_with_pipeline"] = sum(
                        tops.get(i) == label for i, label in enumerate(loop_top)) / len(loop_top)
                    repeats.append(figures)
                    print(f"images: repeat {repeat + 1}/{args.repeats}: " + ", ".join(
                        f"{key} {args.num_images / figures[key]['s']:.1f}/s" for key in ROWS)
                        + f"; top-1 agreement with the pipeline {figures['top1_agreement_with_pipeline']:.3f}",
                        file=sys.stderr, flush=True)
            finally:
                engine.close()
    load_end = load_average()

    rows = summarise(repeats, args.num_images)
    ratio = next(r["ratio_to_raw"] for r in rows if r["key"] == "job_paths")
    http_ratio = next(r["ratio_to_raw"] for r in rows if r["key"] == "job_http")
    model = "ViT-Tiny" if shape == VIT_TINY else f"ViT-Tiny, {shape['num_hidden_layers']} layers"
    title = (f"Image classification: {model} shape, random weights, ONNX Runtime CPU ({args.threads} threads), "
             f"{args.num_images} JPEGs")
    # The CPU the job needs per image (the engine's, as in the raw replay, and the intake's) against the cores
    # it has: where the intake's work cannot hide behind the engine's, the job cannot pass this share of raw.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    engine_cpu_s = statistics.median(r["raw_paths"]["cpu_s"] for r in repeats)
    raw_s = statistics.median(r["raw_paths"]["s"] for r in repeats)
    ceiling = min(1.0, cores * raw_s / (engine_cpu_s + intake_cpu_s))
    cpu = f"{cpu_model()}, {os.cpu_count()} cores"
    found = versions()
    lines = [f"# {title}", "",
             f"{started:%Y-%m-%d}, {cpu}; load average (1 / 5 / 15 min) before {load_start}, after {load_end}; "
             + ", ".join(f"{k} {v}" for k, v in found.items()) + ".", "", f"`{command}`", "",
             f"Images: {args.num_images} JPEG files, 320x240 to 1024x768 (a pool of {len(file_bytes)} pictures, "
             f"{min(file_bytes) // 1000}-{max(file_bytes) // 1000} kB); batches of {args.batch_size} "
             f"(max_queue_delay_ms 50); the slow server waits {args.http_delay_ms:g} ms per request, "
             f"fetch_concurrency {FETCH_CONCURRENCY}; median of {args.repeats} repeat(s).", "",
             *table(rows), "",
             f"- the paths job over the raw engine on the same batches: {ratio:.3f}x (needed >= {args.min_ratio}); "
             f"the slow-http job over its own batches: {http_ratio:.3f}x",
             "- the intake alone (fetch, decode, resize a poll of 500 at a time; no inference), once: "
             + ", ".join(f"{k} {args.num_images / v:.1f} images/s" for k, v in intake_only.items()),
             f"- CPU per image: the engine {1000 * engine_cpu_s / args.num_images:.2f} ms (raw replay), the intake "
             f"{1000 * intake_cpu_s / args.num_images:.2f} ms (fetch, decode, resize from paths); with {cores} cores "
             f"the job cannot pass {ceiling:.2f}x the raw engine where both use every core",
             "- top-1 label agreement of the paths job with the transformers pipeline: "
             + " / ".join(f"{r['top1_agreement_with_pipeline']:.3f}" for r in repeats)]
    print("\n".join(lines))
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items() if k != "out"}  # no local paths
    out.write_text(json.dumps({"date": f"{started:%Y-%m-%d}", "command": command, "machine": {
        "cpu": cpu, "platform": platform.platform(), "load_average_start": load_start, "load_average_end": load_end},
        "versions": found, "model_shape": shape, "num_labels": NUM_LABELS, "settings": settings,
        "image_file_bytes": file_bytes, "rows": rows, "repeats": repeats,
        "intake_only_images_per_s": {k: args.num_images / v for k, v in intake_only.items()},
        "cpu_ms_per_image": {"engine": 1000 * engine_cpu_s / args.num_images,
                             "intake": 1000 * intake_cpu_s / args.num_images},
        "cores": cores, "cpu_bound_ceiling": ceiling,
        "ratio_job_paths": ratio, "ratio_job_http": http_ratio}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(rows, title, out.with_suffix(".png"))
    print(f"images: wrote {out}, {out.with_suffix('.md').name}, {out.with_suffix('.png').name}", file=sys.stderr)
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
