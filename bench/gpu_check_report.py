"""The GPU check's report: completeness (every row measured or a one-line reason), a summary, Markdown.

Pure functions over the report the driver builds::

    {"meta": {...}, "steps": [{"name", "seconds", "status", "rows": [row, ...]}, ...]}

where a row is ``{"name", "kind", "reason", ...values}`` (``reason`` None when measured; see
``gpu_check_common``). The Markdown has one table per step and row kind, columns in first-seen order.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]
_SKIP = {"name", "kind", "reason", "first_divergence"}  # first_divergence: per prompt, in the JSON only


def incomplete(report: dict[str, Any]) -> list[str]:
    """``step / row`` of every row that has neither a measurement nor a reason (should be empty)."""
    bad = []
    for step in report["steps"]:
        if not step["rows"]:
            bad.append(f"{step['name']} / (no rows)")
        for row in step["rows"]:
            reason = row.get("reason")
            measured = reason is None and any(k not in _SKIP for k in row)
            if not measured and not (isinstance(reason, str) and reason.strip() and "\n" not in reason):
                bad.append(f"{step['name']} / {row.get('name')}")
    return bad


def failed_checks(report: dict[str, Any]) -> list[str]:
    """Measured rows whose own verdict is negative (``ok`` false): parity outside tolerance and the like."""
    return [f"{step['name']} / {row['name']}" for step in report["steps"] for row in step["rows"]
            if row.get("reason") is None and row.get("ok") is False]


def counts(report: dict[str, Any]) -> dict[str, int]:
    rows = [row for step in report["steps"] for row in step["rows"]]
    measured = sum(1 for r in rows if r.get("reason") is None)
    return {"rows": len(rows), "measured": measured, "with_reason": len(rows) - measured,
            "failed_checks": len(failed_checks(report)), "incomplete": len(incomplete(report))}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[Row]) -> list[str]:
    columns = list(dict.fromkeys(k for row in rows for k in row if k not in _SKIP))
    lines = ["| " + " | ".join(["row", *columns, "reason"]) + " |", "|" + "---|" * (len(columns) + 2)]
    for row in rows:
        measured = row.get("reason") is None
        cells = [_cell(row["name"]), *(_cell(row.get(c)) if measured else "" for c in columns),
                 _cell(row.get("reason") or "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    total = counts(report)
    lines = [f"# Sluice GPU check ({'dry run on the CPU' if meta.get('dry_run') else 'GPU'})", "",
             f"{meta.get('started', '')}; budget {meta.get('budget_s')} s, took {meta.get('seconds')} s; "
             f"{total['measured']} rows measured, {total['with_reason']} with a reason, "
             f"{total['failed_checks']} failed checks, {total['incomplete']} incomplete.", ""]
    for step in report["steps"]:
        lines += [f"## {step['name']} ({step['seconds']} s, {step['status']})", ""]
        for kind in dict.fromkeys(row.get("kind", "row") for row in step["rows"]):
            lines += _table([row for row in step["rows"] if row.get("kind", "row") == kind]) + [""]
    bad = failed_checks(report)
    if bad:
        lines += ["## Failed checks", "", *(f"- {name}" for name in bad), ""]
    return "\n".join(lines)


# The values worth a line in the printed summary, by row kind (the Markdown and JSON hold everything).
SUMMARY_KEYS = {
    "device": ("device", "memory_gib", "cuda"),
    "versions": ("torch", "triton", "transformers", "onnxruntime", "tensorrt"),
    "bandwidth": ("gb_per_s",),
    "model": ("params", "weight_bytes", "variant"),
    "parity": ("exact", "prompts", "first_divergence_median", "matched_prefix_share", "max_abs_err", "ok"),
    "timing": ("triton_ms", "torch_ops_ms", "sdpa_ms", "sdpa_backend"),
    "decode": ("step_ms", "kernel_ms", "weight_floor_ms", "floor_ms", "x_floor", "busy"),
    "throughput": ("tok_s", "vs_best_hf", "records_per_s", "vs_bs1"),
    "cosine": ("ran_as", "min_cosine", "ok"),
}


def summary(report: dict[str, Any]) -> list[str]:
    """A compact text version for a terminal (the last lines a device call shows)."""
    total = counts(report)
    lines = [f"== Sluice GPU check{' (dry run)' if report['meta'].get('dry_run') else ''}: {total['measured']}/"
             f"{total['rows']} rows measured, {total['with_reason']} with a reason, {total['failed_checks']} "
             f"failed checks, {total['incomplete']} incomplete, {report['meta'].get('seconds')} s =="]
    for step in report["steps"]:
        lines.append(f"{step['name']} ({step['status']}, {step['seconds']} s)")
        rows = step["rows"]
        i = 0
        while i < len(rows):
            row = rows[i]
            if row.get("reason") is not None:  # rows in a row with one reason: one line
                j = i
                while j + 1 < len(rows) and rows[j + 1].get("reason") == row["reason"]:
                    j += 1
                names = row["name"] if j == i else f"{row['name']} .. {rows[j]['name']} ({j - i + 1} rows)"
                lines.append(f"  {names}: {row['reason'][:200]}")
                i = j + 1
                continue
            i += 1
            keys = SUMMARY_KEYS.get(row.get("kind", ""), ())
            values = ", ".join(f"{k} {_cell(row[k])}" for k in keys if k in row)
            lines.append(f"  {row['name']}: {values}")
    lines += [f"FAILED {name}" for name in failed_checks(report)]
    lines += [f"INCOMPLETE {name}" for name in incomplete(report)]
    return lines
