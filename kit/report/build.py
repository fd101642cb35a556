"""What the reviewer's page shows, gathered from the evidence: a claim's verdict, a comparison of two
runs, or one run. Every run is re-verified here (the page says what ``kit verify`` says now), and the
page ends with the commands that re-check it. Example::

    page = page_for([Path("smoke-mismatch.verdict.json")], Path("report"))
    (Path("report") / "index.html").write_text(render(page))
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from kit import __version__
from kit.analysis.claim_figures import arm_style, claim_figure, read_vmstat, vmstat_figure
from kit.analysis.claims import metric_values
from kit.analysis.replicates import two_level_resamples
from kit.analysis.table import load_arm
from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.evidence.claims import VERDICT_SCHEMAS, claim_verification, verdict_criteria
from kit.evidence.compare import compare_run_dirs
from kit.model.documents import read_json_file
from kit.model.errors import BadInput, KitError
from kit.report.page import Banner, Commands, Figure, Page, Paragraph, Section, Table

METRIC_OPTIONS = ("name", "steady_from", "length_control")


def _slugs(names: list[str]) -> list[str]:
    """An HTML id part per criterion name, distinct: ``step-time``, ``mismatch-count``."""
    out = []
    for name in names:
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "criterion"
        out.append(slug if slug not in out else f"{slug}-{len(out) + 1}")
    return out


def _ci(stat: dict | None) -> str:
    return "-" if not stat else f"{stat['estimate']:.6g} [95 % CI {stat['ci95_low']:.6g}, {stat['ci95_high']:.6g}]"


def metric_options(metric: dict) -> str:
    """``mismatch_count, steady_from 0, length_control none, bootstrap two-level, 2000 draws, seed 1234``."""
    out = ", ".join([str(metric.get("name", "-"))] + [f"{k} {metric[k]}" for k in METRIC_OPTIONS[1:] if k in metric])
    b = metric.get("bootstrap")
    return out + (f", bootstrap {b.get('scheme')}, {b.get('draws')} draws, seed {b.get('seed')}" if b else "")


def criteria_table(criteria: list[dict]) -> Table:
    """One row per criterion: its metric, its rule, the statistic the rule reads with its CI (or the token
    totals for zero-and-positive), and its sub-verdict."""
    rows = []
    for c in criteria:
        m, stats = c.get("metric") or {}, c.get("statistics") or {}
        if "error" in stats:
            shown = stats["error"]
        elif not stats:
            shown = "-"
        elif stats.get("totals"):
            t = stats["totals"]
            shown = (f"treatment {t['treatment_mismatches']:,.0f} mismatched of {t['treatment_tokens']:,.0f} compared tokens; "
                     f"reference {t['reference_mismatches']:,.0f} of {t['reference_tokens']:,.0f}")
        elif (c.get("rule") or {}).get("kind") == "ratio-upper-bound":
            shown = "ratio " + _ci(stats.get("ratio"))
        else:
            shown = "difference " + _ci(stats.get("difference"))
        rows.append((c["name"], m.get("name", stats.get("metric", "-")), c["rule_text"], shown, c["verdict"]))
    return Table("criteria", "Criteria: the claim is supported only when every one is, not supported when any is not",
                 ("criterion", "metric", "decision rule", "statistic (95 % CI) or token totals", "verdict"), tuple(rows),
                 toned_columns=(4,))


def criterion_tables(c: dict, styles: dict, suffix: str) -> list:
    """A criterion's seed means per arm, its effects with their CIs, and its token totals."""
    stats = c["statistics"]
    rows = [(styles[role][0], len(a["seed_means"]), ", ".join(f"{m:.6g}" for m in a["seed_means"]), f"{a['mean']:.6g}",
             "-" if a["noise_floor"] is None else f"{a['noise_floor']:.6g}") for role, a in stats["arms"].items()]
    effects = [(k, f"{v['estimate']:.6g}", f"{v['ci95_low']:.6g}", f"{v['ci95_high']:.6g}")
               for k, v in (("treatment − reference", stats["difference"]), ("treatment ÷ reference", stats["ratio"]))
               if v]
    head = f"{c['name']}: " if suffix else ""
    parts = [Paragraph(f"{c['name']}: {c['verdict']}, because {'; '.join(c['reasons'])}"),
             Table("statistics" + suffix, f"{head}{stats['metric']} ({stats['unit']}): seed means per arm",
                   ("arm", "seeds", "seed means", "mean", "noise floor (range)"), tuple(rows)),
             Table("effects" + suffix, f"{head}effect with its two-level bootstrap 95 % CI",
                   ("statistic", "estimate", "CI low", "CI high"), tuple(effects))]
    if stats.get("totals"):
        parts.append(Table("totals" + suffix, f"{head}token totals over every declared run's steps from "
                                              f"{(c.get('metric') or {}).get('steady_from', 0)} on", ("total", "value"),
                           tuple((k, f"{v:g}") for k, v in stats["totals"].items())))
    return parts


def _q(path) -> str:
    return shlex.quote(str(path))


def _read(path: Path):
    try:
        return read_json_file(path)
    except KitError:
        return None


def gates_table(run_dirs: dict) -> Table:
    """One row per gate, one column per run: the status each run's sealed validation.json gives it."""
    gates, status = {}, {}
    for label, run_dir in run_dirs.items():
        validation = _read(Path(run_dir) / E.VALIDATION) or {}
        for gate in validation.get("gates", []):
            gates.setdefault(gate.get("id"), gate.get("message"))
            problems = "; ".join(gate.get("problems") or [])
            status[(gate.get("id"), label)] = gate.get("status") + (f": {problems}" if problems else "")
    rows = tuple((gid, msg, *(status.get((gid, label), "-") for label in run_dirs)) for gid, msg in gates.items())
    return Table("gates", "Gates per run (each run's sealed validation.json)", ("gate", "what it checks", *run_dirs),
                 rows, toned_columns=tuple(range(2, 2 + len(run_dirs))))


def evidence_table(run_dirs: dict) -> Table:
    rows = []
    for label, run_dir in run_dirs.items():
        checked = verify_run_dir(Path(run_dir))
        rows.append((label, "verified" if checked.status == "ok" else "failed", checked.trust or "unsigned",
                     "; ".join(f"{p or '/'}: {m}" for p, m in checked.problems[:3]) or "-"))
    return Table("evidence", "Each run re-verified now (kit verify)", ("run", "kit verify", "trust", "problems"),
                 tuple((r[0], "succeeded" if r[1] == "verified" else "failed", *r[2:]) for r in rows),
                 toned_columns=(1,))


def monitors_table(run_dirs: dict) -> Table:
    rows = []
    for label, run_dir in run_dirs.items():
        doc = _read(Path(run_dir) / "monitors" / "monitors.json") or {}
        for s in doc.get("samplers", []):
            rows.append((label, s.get("name"), s.get("status"), s.get("samples"), s.get("what"), s.get("note") or "-"))
    return Table("monitors", "Monitors each run recorded (monitors/monitors.json)",
                 ("run", "sampler", "status", "samples", "what", "note"), tuple(rows))


def identity_table(differences: list, provenance, scope) -> list:
    rows = tuple((d["path"], d["a"], d["b"], d["status"]) for d in differences)
    return [Paragraph(f"Provenance of identity: {scope or provenance or 'unknown'}."),
            Table("identity", "Identity: every difference between the pair, declared or uncontrolled",
                  ("field", "A / reference", "B / treatment", "status"), rows)]


def _figure(path: Path | None, fig_id: str, caption: str) -> list:
    return [Figure(fig_id, path.read_bytes(), caption)] if path and path.is_file() else []


def _monitor_figure(run_dirs: dict, styles: dict, tmp: Path) -> list:
    series = {label: read_vmstat(Path(d)) for label, d in run_dirs.items()}
    name = vmstat_figure(series, styles, tmp)
    if name is None:
        return [Paragraph("No host monitor series was recorded (monitors/vmstat.txt).")]
    return _figure(tmp / name, "figure-monitors", "Host CPU and free memory during each run (vmstat)")


def verdict_page(path: Path, tmp: Path) -> Page:
    doc = read_json_file(path)
    problems, _ = claim_verification(path, doc)
    base = Path(path).resolve().parent
    claim_path = (base / doc["claim"]["path"]).resolve()
    claim = _read(claim_path) or {}
    runs = {r["run_id"]: (base / r["run_dir"]).resolve() for r in doc["runs"] if r["run_dir"] and r["status"] == "counted"}
    short = {r["run_id"]: f"{r['role']} s{r['seed']}" for r in doc["runs"]}
    criteria = verdict_criteria(doc, claim)
    styles, arms = {}, {}
    per_step = {c["name"]: {"reference": [], "treatment": []} for c in criteria}
    for r in doc["runs"]:
        if r["run_id"] in runs:
            manifest = _read(runs[r["run_id"]] / E.MANIFEST) or {}
            arms[r["role"]] = manifest.get("arm") or {}
            loaded = load_arm(runs[r["run_id"]])
            for c in criteria:
                if c.get("metric"):
                    per_step[c["name"]][r["role"]].append(metric_values(loaded, c["metric"]))
    for role in ("reference", "treatment"):
        name = (claim.get("arms", {}).get(role) or {}).get("name", role)
        styles[role] = arm_style(name, arms.get(role, {}))
    banner = Banner(doc["verdict"], "; ".join(doc["reasons"]) or "-")
    if problems:
        banner = Banner("failed", "kit verify refuses this verdict now: " + "; ".join(f"{p}: {m}" for p, m in problems[:3]))
    sections = [
        Section("Claim", [Paragraph(doc["claim"]["hypothesis"]),
                          Paragraph("Verdict: " + ("supported only when every criterion is supported, not supported "
                                                   "when any is not, inconclusive otherwise (and whenever the pair is not "
                                                   "controlled)" if len(criteria) > 1 else "the decision rule's")),
                          criteria_table(criteria),
                          Paragraph("Inconclusive when: " + str(claim.get("inconclusive", "-"))),
                          Table("claim-options", f"Fixed before any run (claim sha256 {doc['claim']['sha256']})",
                                ("option", "value"),
                                tuple([(f"criterion {c['name']}", metric_options(c.get("metric") or {})) for c in criteria]
                                      + [("seeds", claim.get("seeds")), ("rollouts", claim.get("rollouts"))]
                                      + [(f"{role} arm", f"{a.get('name')} ({a.get('sha256')})")
                                         for role, a in claim.get("arms", {}).items()]))]),
        Section("Runs", [Table("runs", "Declared runs (arm x seed), as the verdict counted them",
                               ("run id", "role", "seed", "status", "seal sha256", "problems"),
                               tuple((r["run_id"], r["role"], r["seed"], "succeeded" if r["status"] == "counted" else
                                      r["status"], r["seal_sha256"] or "-", "; ".join(r["problems"]) or "-")
                                     for r in doc["runs"]), toned_columns=(3,)),
                         Table("refused", "Runs refused (not bound to the claim, or of another arm, seed or rollouts)",
                               ("run", "reason"), tuple((r["run"], r["reason"]) for r in doc["refused"])),
                         evidence_table(runs)]),
        Section("Identity", identity_table(doc["identity"]["differences"], doc["identity"]["provenance"],
                                           doc["identity"]["scope"])),
        Section("Gates", [gates_table({short[k]: v for k, v in runs.items()})]),
    ]
    shown = [c for c in criteria if c["statistics"] and "arms" in c["statistics"]]
    if shown:
        suffixes = ["" if len(criteria) == 1 else f"-{slug}" for slug in _slugs([c["name"] for c in criteria])]
        parts = [part for c, suffix in zip(criteria, suffixes) if c in shown for part in criterion_tables(c, styles, suffix)]
        parts += _figure(tmp / claim_figure(shown, per_step, styles, tmp), "figure-claim",
                         "Each criterion's metric (one row each): seed means per arm and every run step by step")
        sections.append(Section("Statistics", parts))
    by_label = {rid: d for rid, d in runs.items()}
    role_of = {r["run_id"]: r["role"] for r in doc["runs"]}
    sections.append(Section("Monitors", [monitors_table(by_label),
                                         *_monitor_figure(by_label, {k: styles[role_of[k]][1] for k in by_label}, tmp)]))
    sections.append(Section("What this does not prove", [Paragraph(p) for p in doc["does_not_prove"]]))
    sections.append(Section("How to re-check it", [Commands((
        f"kit verify {_q(path)}          # the verdict, its claim, every counted run's seal",
        f"kit verify {_q(claim_path)}",
        *(f"kit verify {_q(d)}" for d in runs.values()),
        f"kit claim evaluate {_q(claim_path)} {' '.join(_q(d) for d in runs.values())} --out re-evaluated.json"))]))
    return Page(f"Claim {doc['claim']['name']}", banner, sections,
                f"verdict {doc['verdict_sha256']}, evaluated {doc['evaluated_at']} by kit {doc['kit_version']}; "
                f"page by kit {__version__}")


def _pair_statistics(a: Path, b: Path) -> list:
    import numpy as np

    arms = [load_arm(a), load_arm(b)]
    rows = []
    for name in ("step_time_s", "mismatch_count", "mean_abs_dlogp", "reward"):
        metric = {"name": name, "steady_from": 1, "length_control": "none"}
        va, vb = (metric_values(x, metric) for x in arms)
        if not va or not vb:
            continue
        ra, rb = two_level_resamples([va], [vb], 2000, 1234)
        lo, hi = np.percentile(rb - ra, [2.5, 97.5])
        ma, mb = sum(va) / len(va), sum(vb) / len(vb)
        rows.append((name, f"{ma:.6g}", f"{mb:.6g}", f"{mb - ma:+.6g}", f"[{lo:+.6g}, {hi:+.6g}]", f"{len(va)} / {len(vb)}"))
    return [Table("statistics", "Per-step means from step 1 on, B − A with a bootstrap 95 % CI over steps (2000 draws, seed 1234)",
                  ("metric", "A", "B", "B − A", "95 % CI", "steps"), tuple(rows))]


def comparison_page(a: Path, b: Path, tmp: Path) -> Page:
    result = compare_run_dirs(a, b)
    doc = result.to_json()
    verdict = "controlled" if result.controlled else "not controlled"
    detail = (f"{len(result.uncontrolled)} uncontrolled differences; " if result.uncontrolled else "") + (result.scope() or "")
    runs = {"A " + a.name: a, "B " + b.name: b}
    styles = {}
    for label, d in runs.items():
        manifest = _read(d / E.MANIFEST) or {}
        styles[label] = arm_style((manifest.get("arm") or {}).get("name", label), manifest.get("arm") or {})[1]
    sections = [Section("Identity", identity_table(doc["differences"], doc["provenance"], doc["scope"])
                        + [Paragraph(n) for n in doc["notes"]]),
                Section("Runs", [evidence_table(runs),
                                 Table("not-comparable", "Runs that are no comparable evidence", ("run", "reason"),
                                       tuple((n["run"], n["reason"]) for n in doc["not_comparable"]))]),
                Section("Gates", [gates_table(runs)]),
                Section("Statistics", _pair_statistics(a, b)),
                Section("Monitors", [monitors_table(runs), *_monitor_figure(runs, styles, tmp)]),
                Section("How to re-check it", [Commands((f"kit verify {_q(a)} {_q(b)}", f"kit compare {_q(a)} {_q(b)}"))])]
    return Page(f"Comparison {a.name} vs {b.name}", Banner(verdict, detail or "-"), sections, f"page by kit {__version__}")


def run_page(run_dir: Path, tmp: Path) -> Page:
    status = (_read(run_dir / E.STATUS) or {}).get("status", "unknown")
    checked = verify_run_dir(run_dir)
    verdict = "succeeded" if status == "succeeded" and checked.status == "ok" else "failed"
    summary = (_read(run_dir / E.VALIDATION) or {}).get("summary", {})
    manifest = _read(run_dir / E.MANIFEST) or {}
    label, color = arm_style((manifest.get("arm") or {}).get("name", run_dir.name), manifest.get("arm") or {})
    runs = {run_dir.name: run_dir}
    sections = [Section("Run", [Table("summary", f"{label}: validation summary", ("field", "value"),
                                      tuple((k, v) for k, v in summary.items())), evidence_table(runs)]),
                Section("Gates", [gates_table(runs)]),
                Section("Monitors", [monitors_table(runs), *_monitor_figure(runs, {run_dir.name: color}, tmp)]),
                Section("How to re-check it", [Commands((f"kit verify {_q(run_dir)}",))])]
    return Page(f"Run {run_dir.name}", Banner(verdict, f"status {status}; kit verify {checked.status}"), sections,
                f"page by kit {__version__}")


def page_for(paths: list[Path]) -> Page:
    """The page for a verdict file, two run dirs (a comparison) or one run dir; BadInput otherwise."""
    with tempfile.TemporaryDirectory(prefix="rlk-report-") as tmp:
        tmp = Path(tmp)
        if len(paths) == 1 and paths[0].is_file():
            doc = _read(paths[0])
            if not isinstance(doc, dict) or doc.get("schema") not in VERDICT_SCHEMAS:
                raise BadInput(f"ARGS {paths[0]}: not a {' or '.join(VERDICT_SCHEMAS)} document; give a verdict, one "
                               "run dir or two")
            return verdict_page(paths[0], tmp)
        for p in paths:
            if not (p / E.MANIFEST).is_file():
                raise BadInput(f"ARGS {p}: not a run dir (no {E.MANIFEST}); give a verdict file, one run dir or two")
        if len(paths) == 2:
            return comparison_page(paths[0], paths[1], tmp)
        if len(paths) == 1:
            return run_page(paths[0], tmp)
        raise BadInput(f"ARGS: {len(paths)} given; give a verdict file, one run dir or two run dirs")
