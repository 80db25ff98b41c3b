"""The no-op pipeline's latency tail at low load: Sluice beside the plain per-record loop, in one run.

    python bench/noop_tail.py [--rates 26000,53000] [--rounds 3] [--duration-s 6] [--bootstrap HOST:PORT]

The latency half of ``bench/compare.py`` for the ``noop`` workload only (its harness, its children): a paced
producer offers each rate in turn for ``--duration-s``; a record's latency is its output's produce timestamp
minus its send time. Sluice runs at the compare defaults (``max_batch_size`` 512, ``max_queue_delay_ms`` 5),
the plain loop polls and produces one record at a time. The contenders take turns for ``--rounds`` rounds
(plain first in odd rounds), so drift in the machine's load lands on both; per rate the table gives each
round's p50 / p99 and the median of the rounds' p99 ratios (Sluice over plain). The default rates are the
25 % and 50 % loads of ``bench/results/compare.md``. Writes bench/results/noop_tail.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import broker  # noqa: E402
from compare import _out_topic, _topic  # noqa: E402
from compare_harness import Contender, latency  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def run_once(bootstrap: str, peer: str, rates: list[float], duration_s: float) -> list[dict[str, Any]]:
    contender = Contender(peer, "noop", 1 if peer == "plain" else 512, 0 if peer == "plain" else 5)
    results, extra = latency(bootstrap, contender, _topic(bootstrap, "tail-in"), _out_topic(bootstrap), [
        "a short review of a product"], rates, duration_s)
    rows = []
    for phase, result in enumerate(results):
        waits = sorted(extra.get("queue_wait_ms", {}).get(str(phase), []))
        row = {"peer": peer, "rate": result.rate, "achieved_rate": result.achieved_rate,
               "overloaded": result.overloaded, **result.latency_ms}
        if waits:
            row["queue_wait_p99_ms"] = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="26000,53000", help="offered records/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=6)
    parser.add_argument("--bootstrap", default=os.environ.get("SLUICE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--out", type=Path, default=RESULTS / "noop_tail.json")
    args = parser.parse_args()
    os.chdir(ROOT)
    rates = [float(r) for r in args.rates.split(",")]
    load_start = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with broker(args.bootstrap) as bootstrap:
        for round_ in range(args.rounds):
            for peer in (["plain", "sluice"] if round_ % 2 == 0 else ["sluice", "plain"]):
                for row in run_once(bootstrap, peer, rates, args.duration_s):
                    rows.append({"round": round_, **row})
                    print(f"round {round_ + 1} {peer:<7}{row['rate']:>9.0f}/s  p50 {row.get('p50', float('nan')):7.1f}"
                          f"  p99 {row.get('p99', float('nan')):7.1f} ms  queue wait p99 "
                          f"{row.get('queue_wait_p99_ms', float('nan')):.1f}", flush=True)
                time.sleep(2)
    summary = []
    lines = [f"# No-op latency tail: Sluice vs the plain loop ({args.rounds} rounds, {args.duration_s:g} s per load)",
             "", f"1-minute load average at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f}; 2 CPU cores.",
             "", "| rate /s | contender | p50 ms (rounds) | p99 ms (rounds) |", "|---:|---|---|---|"]
    for rate in rates:
        by_peer = {peer: [r for r in rows if r["peer"] == peer and r["rate"] == rate and "p99" in r]
                   for peer in ("plain", "sluice")}
        for peer, peer_rows in by_peer.items():
            p50s = " / ".join(f"{r['p50']:.0f}" for r in peer_rows)
            p99s = " / ".join(f"{r['p99']:.0f}" for r in peer_rows)
            lines.append(f"| {rate:.0f} | {peer} | {p50s} | {p99s} |")
        ratios = [s["p99"] / p["p99"] for s, p in zip(by_peer["sluice"], by_peer["plain"], strict=False)]
        if ratios:
            summary.append({"rate": rate, "p99_ratio_median": statistics.median(ratios), "p99_ratios": ratios})
    lines.append("")
    for s in summary:
        lines.append(f"- {s['rate']:.0f}/s: Sluice's p99 over the plain loop's, median of the rounds: "
                     f"{s['p99_ratio_median']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in s['p99_ratios'])})")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": summary, "load_average_start": load_start,
                                    "load_average_end": os.getloadavg()}, indent=1))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
