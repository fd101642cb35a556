"""A module-matrix suite's verdict: which operator module's strict/production switch makes the mismatches,
the findings in words, the summary document and its table. Pure functions over the arms' entries.
Example::

    attribution(arms)["modules"][0]["alone_makes_zero"]     # True: that module's R/R alone zeroes the mismatches
"""

from __future__ import annotations

from kit.model.documents import schema_id, sha256_of_document
from kit.run.request import INTERRUPTED_EXIT

MODULES = ("attention", "ffn", "logp")
# reference §1.3: the pipeline order of the module suite
MODULE_ORDER = ("M000", "M100", "M010", "M001", "M110", "M101", "M011", "M111")
MATRIX_NAME = "module"
SUMMARY_SCHEMA = schema_id("suite-summary")
VERDICTS = ("passed", "gates_failed", "failed", "interrupted", "not_run")


# --- attribution -------------------------------------------------------------------------------------

def _total(entry: dict | None):
    return ((entry or {}).get("figures") or {}).get("bitwise_mismatch_count")


def attribution(arms: list[dict]) -> dict:
    """Per module: mismatch totals of its R/R and P/P arms, and its marginal effect P/P → R/R in each
    of the four pairs that hold the other two modules fixed; plus which modules alone make the
    mismatch vanish and whether the all-R/R arm is exactly zero.

    >>> arms = [{"code": c, "arm": c, "figures": {"bitwise_mismatch_count": 0 if c == "M111" else 5,
    ...          "max_abs_dlogp": 0.0 if c == "M111" else 1e-6}} for c in MODULE_ORDER]
    >>> attribution(arms)["modules"][0]["pairs"][3]["delta"]
    -5
    """
    by_code = {a["code"]: a for a in arms}
    modules = []
    for index, module in enumerate(MODULES):
        pairs = []
        for code in MODULE_ORDER:
            if code[1 + index] != "0":
                continue
            to_code = code[:1 + index] + "1" + code[2 + index:]
            src, dst = _total(by_code.get(code)), _total(by_code.get(to_code))
            pairs.append({"from": code, "to": to_code,
                          "from_arm": (by_code.get(code) or {}).get("arm"), "to_arm": (by_code.get(to_code) or {}).get("arm"),
                          "from_total": src, "to_total": dst,
                          "delta": (dst - src) if src is not None and dst is not None else None})
        rr = [c for c in MODULE_ORDER if c[1 + index] == "1"]
        pp = [c for c in MODULE_ORDER if c[1 + index] == "0"]
        rr_totals, pp_totals = [_total(by_code.get(c)) for c in rr], [_total(by_code.get(c)) for c in pp]
        deltas = [p["delta"] for p in pairs]
        alone = "M" + "".join("1" if i == index else "0" for i in range(3))
        alone_total = _total(by_code.get(alone))
        modules.append({
            "module": module,
            "rr_arms": rr, "pp_arms": pp,
            "rr_total": sum(rr_totals) if None not in rr_totals else None,
            "pp_total": sum(pp_totals) if None not in pp_totals else None,
            "pairs": pairs,
            "mean_marginal_effect": (sum(deltas) / len(deltas)) if None not in deltas else None,
            "alone_arm": alone,
            "alone_total": alone_total,
            "alone_makes_zero": (alone_total == 0) if alone_total is not None else None,
            # the mismatch is nonzero in every arm that leaves this module P/P
            "needed_for_zero": all(t != 0 for t in pp_totals) if None not in pp_totals else None,
        })
    zero_arms = [c for c in MODULE_ORDER if _total(by_code.get(c)) == 0]
    top = by_code.get("M111") or {}
    top_fig = top.get("figures") or {}
    exactly_zero = None
    if top_fig.get("bitwise_mismatch_count") is not None:
        exactly_zero = top_fig["bitwise_mismatch_count"] == 0 and top_fig.get("max_abs_dlogp") in (0, 0.0)
    out = {"modules": modules,
           "alone_make_zero": [m["module"] for m in modules if m["alone_makes_zero"]],
           "zero_arms": zero_arms,
           "all_rr_arm": "M111",
           "all_rr_exactly_zero": exactly_zero}
    out["findings"] = findings(out, by_code)
    return out


def findings(table: dict, by_code: dict) -> list[str]:
    """The attribution in plain sentences."""
    out = []
    name = lambda code: (by_code.get(code) or {}).get("arm") or code
    mods = table["modules"]
    if any(m["alone_makes_zero"] is None for m in mods):
        missing = [m["alone_arm"] for m in mods if m["alone_makes_zero"] is None]
        out.append(f"single-module attribution incomplete: no mismatch total for {', '.join(name(c) for c in missing)}")
    alone = table["alone_make_zero"]
    if alone:
        out.append("switching only " + " or only ".join(alone) + " to R/R makes the mismatch vanish ("
                   + ", ".join(f"{name(m['alone_arm'])}: 0" for m in mods if m["alone_makes_zero"]) + ")")
    elif all(m["alone_makes_zero"] is not None for m in mods):
        out.append("no module alone makes the mismatch vanish ("
                   + ", ".join(f"{name(m['alone_arm'])}: {m['alone_total']}" for m in mods) + " bitwise mismatches)")
    needed = [m["module"] for m in mods if m["needed_for_zero"]]
    if needed and table["zero_arms"]:
        out.append(f"zero mismatch needs {' and '.join(needed)} R/R: every arm leaving "
                   f"{'it' if len(needed) == 1 else 'one of them'} P/P mismatches")
    for m in mods:
        if m["mean_marginal_effect"] is not None:
            out.append(f"{m['module']} P/P → R/R changes the mismatch total by {m['mean_marginal_effect']:+g} on average "
                       f"over its four pairs (R/R arms {m['rr_total']}, P/P arms {m['pp_total']})")
    top = by_code.get("M111") or {}
    fig = top.get("figures") or {}
    if table["all_rr_exactly_zero"] is True:
        out.append(f"{name('M111')} is exactly zero: 0 bitwise mismatches over {fig.get('active_tokens')} active tokens, "
                   "max |Δlogp| 0")
    elif table["all_rr_exactly_zero"] is False:
        out.append(f"{name('M111')} is NOT zero: {fig.get('bitwise_mismatch_count')} bitwise mismatches, "
                   f"max |Δlogp| {fig.get('max_abs_dlogp')}")
    else:
        out.append(f"{name('M111')} has no mismatch total ({top.get('verdict', 'not run')}); whether it is zero is unknown")
    return out


# --- the summary document ---------------------------------------------------------------------------

def exit_code_for(arms: list[dict], interrupted: bool) -> int:
    if interrupted:
        return INTERRUPTED_EXIT
    return 0 if arms and all(a["verdict"] == "passed" for a in arms) else 1


def summary_document(plan, arms: list[dict], *, started_at: str, finished_at: str, interrupted: bool,
                     elapsed_s: float) -> dict:
    code = exit_code_for(arms, interrupted)
    counts = {v: sum(1 for a in arms if a["verdict"] == v) for v in VERDICTS}
    req = plan.request
    return {
        "schema": SUMMARY_SCHEMA,
        "suite_id": req.suite_id,
        "kind": "module",
        "status": "interrupted" if interrupted else "complete",
        "interrupted": interrupted,
        "exit_code": code,
        "matrix": {"name": MATRIX_NAME, "source": plan.matrix_source, "sha256": sha256_of_document(plan.matrix),
                   "base_arm": plan.base.arm, "order": list(MODULE_ORDER)},
        "stack": {"name": plan.stack_name, "sha256": plan.stack_sha256},
        "runtime": {"kind": plan.runtime, "image": plan.image, "ray_address": req.ray_address},
        "rollouts": req.rollouts,
        "workspace": str(plan.workspace),
        "suite_dir": str(plan.suite_dir),
        "started_at": started_at,
        "finished_at": finished_at,
        "elapsed_s": round(elapsed_s, 3),
        "counts": counts,
        "arms": arms,
        "attribution": attribution(arms),
    }


def _fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render_table(summary: dict) -> str:
    """The readable form of a summary: arms, attribution, findings."""
    lines = [f"suite {summary['suite_id']}: module matrix on stack {summary['stack']['name']} "
             f"({summary['stack']['sha256'][:12]}), runtime {summary['runtime']['kind']}, "
             f"{summary['rollouts']} rollouts per arm"
             + (" — INTERRUPTED" if summary["interrupted"] else "")]
    head = ("arm", "attn", "ffn", "logp", "verdict", "mismatches", "tokens", "max|Δlogp|", "step s", "run dir / reason")
    rows = []
    for a in summary["arms"]:
        f = a["figures"] or {}
        rows.append((a["arm"], a["operators"]["attention"], a["operators"]["ffn"], a["operators"]["logp"],
                     a["verdict"] + (" (sealed)" if a["sealed"] and a["verdict"] != "passed" else ""),
                     _fmt(f.get("bitwise_mismatch_count")), _fmt(f.get("active_tokens")),
                     _fmt(f.get("max_abs_dlogp"), ".3g"), _fmt(f.get("mean_step_time_s"), ".3f"),
                     a["run_dir"] if a["verdict"] == "passed" else (a["reason"] or "-")))
    lines += _columns(head, rows)
    lines.append("")
    lines.append("attribution (bitwise mismatch totals; Δ = total after switching the module P/P → R/R, others fixed)")
    att = summary["attribution"]
    head = ("module", "P/P arms", "R/R arms", "pair 1", "pair 2", "pair 3", "pair 4", "mean Δ", "alone")
    rows = []
    for m in att["modules"]:
        pairs = [f"{p['from']}→{p['to']} {_fmt(p['delta'], '+g') if p['delta'] is not None else '-'}" for p in m["pairs"]]
        alone = {True: "zero", False: "nonzero", None: "-"}[m["alone_makes_zero"]]
        rows.append((m["module"], _fmt(m["pp_total"]), _fmt(m["rr_total"]), *pairs,
                     _fmt(m["mean_marginal_effect"], "+g"), f"{m['alone_arm']} {alone}"))
    lines += _columns(head, rows)
    lines.append("")
    lines += [f"- {text}" for text in att["findings"]]
    return "\n".join(lines)


def _columns(head, rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
    return [fmt(head)] + [fmt(r) for r in rows]


