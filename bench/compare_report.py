"""Tables and plots of ``bench/compare.py``'s results: compare.md, compare_tuning.md, compare_*.png.

Everything here is derived from the result dict that compare.py also writes as compare.json, so the report
can be regenerated from the JSON alone: ``python bench/compare_report.py [bench/results/compare.json]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAMES = {"sluice": "Sluice", "plain": "per-record loop (confluent-kafka)", "faust": "Faust `take()`",
         "bytewax": "Bytewax `collect`"}
COLORS = {"sluice": "tab:blue", "plain": "tab:orange", "faust": "tab:green", "bytewax": "tab:red"}
TARGETS = {"faust": 1.3, "plain": 1.5}  # required Sluice / contender ratio on the embedding workload
LATENCY_TARGETS_MS = (100, 250, 500, 1000, 2000)


def ratios(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """workload -> contender -> {"default": Sluice records/s over the contender's, each at its default batch;
    "best": the same, each at the best batch size this run measured for it}."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for workload, (batch, _) in result["defaults"].items():
        rows = [r for r in result["saturation"] if r["workload"] == workload]
        default = {r["peer"]: r["records_per_s"] for r in rows if r["batch"] == (1 if r["peer"] == "plain" else batch)}
        best: dict[str, float] = {}
        for r in rows:
            best[r["peer"]] = max(best.get(r["peer"], 0.0), r["records_per_s"])
        if "sluice" in default:
            out[workload] = {peer: {"default": default["sluice"] / default[peer], "best": best["sluice"] / best[peer]}
                             for peer in default if peer != "sluice"}
    return out


def queue_wait_check(result: dict[str, Any]) -> dict[str, Any] | None:
    """Sluice's p99 queue wait at 50 % load (embed) against max_queue_delay_ms + 5 ms."""
    for curve in result["latency"]:
        if curve["peer"] == "sluice" and curve["workload"] == "embed" and len(curve["loads"]) > 1:
            wait = curve["loads"][1].get("queue_wait_ms")
            if wait:
                return {"p99_ms": wait["p99"], "limit_ms": curve["delay_ms"] + 5,
                        "ok": wait["p99"] <= curve["delay_ms"] + 5}
    return None


def queue_wait_meeting(result: dict[str, Any]) -> list[tuple[int, int]]:
    """(max_queue_delay_ms, max_batch_size) of the tuning sweep (50 % load) whose p99 queue wait is within
    the delay + 5 ms."""
    return [(r["delay_ms"], r["batch"]) for r in result["tuning"]
            if r.get("queue_wait_ms") and r["queue_wait_ms"]["p99"] <= r["delay_ms"] + 5]


def _fmt_ms(loads: list[dict[str, Any]], index: int) -> str:
    if index >= len(loads):
        return "–"
    load = loads[index]
    short = " (offered only {:.0f}/s)".format(load["achieved_rate"]) \
        if 0 < load.get("achieved_rate", 0) < 0.95 * load["rate"] else ""  # the paced producer fell behind
    if load["overloaded"]:
        return f"overloaded ({load['delivered']}/{load['offered']} out){short}"
    return f"{load['latency_ms']['p50']:.0f} / {load['latency_ms']['p99']:.0f}{short}"


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [f"# Sluice beside the alternatives ({result['mode']} mode)", "",
             f"{machine['cpu_count']} CPU cores, {machine['platform']}, Python {machine['python']}; 1-minute load "
             f"average {machine['load_average_1m_start']:.1f} at start, {machine['load_average_1m_end']:.1f} at end "
             f"(other work shares the machine when it is above the core count). Versions: "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".", ""]
    for peer, why in result["skipped"].items():
        lines += [f"Skipped {NAMES[peer]}: {why}.", ""]
    lines += _sluice_batching(result)
    lines += ["## Throughput at saturation", "",
              "| workload | contender | max_batch_size | records/s | CPU µs / record | CPU cores busy |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {NAMES[r['peer']]} | {r['batch']} | {r['records_per_s']:,.1f} | "
              f"{r['cpu_us_per_record']:,.0f} | {r['cpu_cores']:.2f} |" for r in result["saturation"]]
    defaults = ", ".join(f"{b} for {w}" for w, (b, _) in result["defaults"].items())
    lines += ["", f"Sluice's records/s over each contender's: both at the default batch size ({defaults}), and each "
                  "at the best batch size measured for it in this run:", ""]
    for workload, by_peer in ratios(result).items():
        for peer, both in by_peer.items():
            target = ""
            if workload == "embed" and peer in TARGETS:
                met = "met" if max(both.values()) >= TARGETS[peer] else "NOT met"
                target = f" (target ≥ {TARGETS[peer]}x: {met})"
            lines.append(f"- {workload}: {both['default']:.2f}x {NAMES[peer]} at the default batch, "
                         f"{both['best']:.2f}x best against best{target}")
    lines += ["", "## End-to-end latency, p50 / p99 ms, at offered loads (fractions of Sluice's maximum)", ""]
    loads = result["loads"]
    lines += ["| workload | contender | " + " | ".join(f"{f:.0%}" for f in loads) + " |",
              "|---|---|" + "---:|" * len(loads)]
    for curve in result["latency"]:
        rates = " / ".join(f"{load['rate']:.0f}" for load in curve["loads"])
        lines.append(f"| {curve['workload']} ({rates} rec/s) | {NAMES[curve['peer']]} | "
                     + " | ".join(_fmt_ms(curve["loads"], i) for i in range(len(loads))) + " |")
    check = queue_wait_check(result)
    if check:
        lines += ["", f"Sluice p99 queue wait at 50 % load (embed): {check['p99_ms']:.1f} ms, limit "
                      f"max_queue_delay_ms + 5 = {check['limit_ms']} ms: {'met' if check['ok'] else 'NOT met'}."]
    if result["tuning"]:
        meeting = queue_wait_meeting(result)
        lines += ["", "In the tuning sweep (50 % load), p99 queue wait within max_queue_delay_ms + 5 ms: "
                      + (", ".join(f"delay {d} ms with batch {b}" for d, b in meeting) if meeting else "none")
                      + " (compare_tuning.md)."]
    lines += ["", "Plots: compare_throughput.png (records/s by batch size), compare_latency.png (latency against "
                  "offered load). Tuning sweep: compare_tuning.md."]
    return "\n".join(lines) + "\n"


def _sluice_batching(result: dict[str, Any]) -> list[str]:
    """A line naming Sluice's batching settings beyond size and delay, when it has any."""
    extra = {w: o for w, o in result.get("sluice_batching", {}).items() if o}
    if not extra:
        return []
    text = "; ".join(f"{w}: " + ", ".join(f"`{k}: {v}`" for k, v in o.items()) for w, o in extra.items())
    return [f"Sluice also runs with {text} (every run below, whatever its `max_batch_size`).", ""]


def tuning_markdown(result: dict[str, Any]) -> str:
    rows = result["tuning"]
    if not rows:
        return "No tuning sweep in this run.\n"
    max_rate = {r["batch"]: r["records_per_s"] for r in result["saturation"]
                if r["workload"] == "embed" and r["peer"] == "sluice"}
    rate = rows[0]["rate"]
    lines = ["# Tuning `max_queue_delay_ms` x `max_batch_size` (Sluice, MiniLM embeddings)", "",
             f"Offered load {rate:.1f} records/s (50 % of Sluice's maximum at the default batch), "
             f"{result['mode']} mode, 1-minute load average {result['machine']['load_average_1m_start']:.1f}.", "",
             *_sluice_batching(result),
             "| max_queue_delay_ms | max_batch_size | p50 ms | p99 ms | p99 queue wait ms | within delay + 5 ms "
             "| saturation records/s |",
             "|---:|---:|---:|---:|---:|:---:|---:|"]
    for r in rows:
        wait = r.get("queue_wait_ms", {}).get("p99")
        lat = r["latency_ms"]
        p50, p99 = (f"{lat['p50']:.0f}", f"{lat['p99']:.0f}") if lat else ("overloaded", "overloaded")
        saturated = f"{max_rate[r['batch']]:.1f}" if r["batch"] in max_rate else "–"
        within = "–" if wait is None else ("yes" if wait <= r["delay_ms"] + 5 else "no")
        lines.append(f"| {r['delay_ms']} | {r['batch']} | {p50} | {p99} | {'–' if wait is None else f'{wait:.1f}'} "
                     f"| {within} | {saturated} |")
    lines += ["", "How to read it: at this load a batch usually closes on `max_queue_delay_ms` (or earlier, once "
                  "a full batch's worth is queued), so p50 is about the delay plus one batch's inference. What the "
                  "p99 queue wait adds above the delay is time a record found the engine still busy with another "
                  "batch when its deadline came -- at 50 % load the engine is busy about half the time, so that "
                  "tail is about one batch's engine time, and a batch capped by tokens keeps it short. "
                  "`max_batch_size` (with the token cap) is the throughput knob: last column, measured at "
                  "saturation with the default delay.", "",
              "Which settings for a p99 target (at this load): among the settings that meet it, the one with the "
              "most throughput at saturation (headroom when load rises), then the lowest p99.", "",
              "| p99 target | choose | measured p99 |", "|---:|---|---:|"]
    for target in LATENCY_TARGETS_MS:
        meeting = [r for r in rows if r["latency_ms"] and r["latency_ms"]["p99"] <= target]
        if not meeting:
            lines.append(f"| {target} ms | none measured meets it | – |")
            continue
        best = max(meeting, key=lambda r: (max_rate.get(r["batch"], 0.0), -r["latency_ms"]["p99"]))
        lines.append(f"| {target} ms | max_batch_size {best['batch']}, max_queue_delay_ms {best['delay_ms']} | "
                     f"{best['latency_ms']['p99']:.0f} ms |")
    return "\n".join(lines) + "\n"


def plots(result: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for peer in NAMES:
        points = sorted((r["batch"], r["records_per_s"]) for r in result["saturation"]
                        if r["workload"] == "embed" and r["peer"] == peer)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", linestyle="-" if len(xs) > 1 else "none", color=COLORS[peer],
                    label=NAMES[peer].replace("`", ""))
    batches = sorted({r["batch"] for r in result["saturation"] if r["workload"] == "embed"})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("max_batch_size (the per-record loop: 1)")
    ax.set_ylabel("records/s at saturation")
    ax.set_title("MiniLM embeddings, topic to topic: throughput by batch size")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "compare_throughput.png", dpi=110)
    plt.close(fig)

    workloads = sorted({c["workload"] for c in result["latency"]})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        for curve in [c for c in result["latency"] if c["workload"] == workload]:
            done = [load for load in curve["loads"] if not load["overloaded"]]
            name, color = NAMES[curve["peer"]].replace("`", ""), COLORS[curve["peer"]]
            for key, style in (("p50", "--"), ("p99", "-")):
                ax.plot([load["rate"] for load in done], [load["latency_ms"][key] for load in done], style,
                        color=color, marker="o" if key == "p99" else ".", label=f"{name} {key}")
            for load in curve["loads"]:
                if load["overloaded"]:
                    ax.axvline(load["rate"], color=color, linestyle=":", alpha=0.6)
        ax.set_yscale("log")
        ax.set_xlabel("offered load, records/s (25 / 50 / 90 % of Sluice's max); dotted: overloaded")
        ax.set_ylabel("end-to-end latency, ms")
        ax.set_title(f"{workload}: latency against offered load")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "compare_latency.png", dpi=110)
    plt.close(fig)


def write_report(result: dict[str, Any], out_dir: Path) -> str:
    """Writes compare.md, compare_tuning.md and the PNGs into ``out_dir``; returns compare.md's text."""
    text = markdown(result)
    (out_dir / "compare.md").write_text(text)
    (out_dir / "compare_tuning.md").write_text(tuning_markdown(result))
    plots(result, out_dir)
    return text


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "compare.json"
    print(write_report(json.loads(path.read_text()), path.parent))
