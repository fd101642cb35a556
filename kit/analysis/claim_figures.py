"""Figures of a claim's verdict and of a run's host monitors, for the reviewer's page (``kit report``).

One colour and one label per arm, from its operator cases (P/P production blue, R/R strict orange,
mixed purple): ``arm_style``. Units on every axis. Each figure is one PNG (the page embeds it); a claim's
figure has one row of panels per criterion. Example::

    claim_figure(verdict["criteria"], {"mismatches": {"reference": [[40.0, 47.0], ...], "treatment": [...]}},
                 styles, Path("out"))                                                       # 'claim-metric.png'
"""

from __future__ import annotations

from pathlib import Path

from kit.analysis.monitors import parse_vmstat
from kit.analysis.plots import DPI, _pyplot, case_style, operators_label
from kit.model.regular_files import MAX_LOG_BYTES, read_regular_text



def arm_style(name: str, arm_doc: dict) -> tuple[str, str]:
    """``(label, colour)`` of an arm, the same in every figure: ``("smoke (R/R)", "#d9730d")``."""
    label, color = case_style(name, operators_label(arm_doc))
    return label, color or "#555555"


def _save_png(fig, out_dir: Path, stem: str, note: str) -> str:
    fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=7, color="#333333")
    fig.savefig(out_dir / f"{stem}.png", dpi=DPI, metadata={"Software": None}, pil_kwargs={"compress_level": 1})
    return f"{stem}.png"


def _statistic(criterion: dict) -> tuple[str, dict]:
    """The effect a criterion's rule reads: the ratio for ratio-upper-bound (when defined), else the difference."""
    stats = criterion["statistics"]
    if (criterion.get("rule") or {}).get("kind") == "ratio-upper-bound" and stats.get("ratio"):
        return "treatment ÷ reference", stats["ratio"]
    return "treatment − reference", stats["difference"]


def claim_figure(criteria: list[dict], per_step: dict, styles: dict, out_dir: Path) -> str:
    """One row of two panels per criterion (``criteria``: the verdict's per-criterion results, each with
    statistics). Left: each arm's seed means (dots), their range (bar), the arm mean (line). Right: the metric
    at each step of every run. ``per_step``: criterion name -> role -> list of per-run lists; ``styles``:
    role -> (label, colour)."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, axes = plt.subplots(len(criteria), 2, figsize=(10, 3.8 * len(criteria)), squeeze=False)
    for (left, right), criterion in zip(axes, criteria):
        stats, name = criterion["statistics"], criterion["name"]
        unit = stats["unit"]
        for i, role in enumerate(("reference", "treatment")):
            arm = stats["arms"][role]
            label, color = styles[role]
            means = arm["seed_means"]
            left.plot([i] * len(means), means, "o", ms=5, color=color, label=label)
            left.plot([i, i], [min(means), max(means)], lw=8, color=color, alpha=0.25, solid_capstyle="butt")
            left.plot([i - 0.2, i + 0.2], [arm["mean"]] * 2, lw=2, color=color)
            for j, values in enumerate(per_step.get(name, {}).get(role, [])):
                right.plot(range(len(values)), values, "-o", ms=3, lw=1, color=color, alpha=0.8,
                           label=label if j == 0 else None)
        left.set_xticks([0, 1], [styles["reference"][0], styles["treatment"][0]], fontsize=8)
        left.set_xlim(-0.6, 1.6)
        left.set_ylabel(f"{stats['metric']} ({unit}), mean per seed", fontsize=8)
        what, d = _statistic(criterion)
        prefix = f"{name}: " if len(criteria) > 1 else ""
        left.set_title(f"{prefix}{what} {d['estimate']:+.4g} [95 % CI {d['ci95_low']:+.4g}, {d['ci95_high']:+.4g}]",
                       fontsize=9)
        right.xaxis.set_major_locator(MaxNLocator(integer=True))
        right.set_xlabel("step index within the steady window", fontsize=8)
        right.set_ylabel(f"{stats['metric']} ({unit})", fontsize=8)
        right.set_title(f"{prefix}every declared run, step by step", fontsize=9)
        right.legend(fontsize=7, loc="best")
    rows = len(criteria)
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.12 / rows, bottom=0.2 / rows, wspace=0.3, hspace=0.45)
    boot = criteria[0]["statistics"]["bootstrap"]
    same = all(c["statistics"]["bootstrap"] == boot for c in criteria)
    note = (f"two-level bootstrap ({boot['draws']} draws, seed {boot['seed']}): seeds, then steps" if same
            else "two-level bootstrap at each criterion's draws and seed: seeds, then steps")
    return _save_png(fig, out_dir, "claim-metric", note)


def read_vmstat(run_dir: Path) -> dict | None:
    """``monitors/vmstat.txt`` as :func:`kit.analysis.monitors.parse_vmstat` reads it; None when the run
    recorded none."""
    path = Path(run_dir) / "monitors" / "vmstat.txt"
    if not path.is_file():
        return None
    out = parse_vmstat(read_regular_text(path, limit=MAX_LOG_BYTES, what="a vmstat record"))
    return out if out["t"] else None


def vmstat_figure(series: dict, styles: dict, out_dir: Path, stem: str = "host-monitors") -> str | None:
    """Host CPU (user+system %) and free memory (MiB) over the run, one line per run (``series``: label ->
    read_vmstat's dict; ``styles``: label -> colour)."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    plt = _pyplot()
    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(10, 3.4))
    for label, s in series.items():
        cpu.plot(s["t"], s["cpu_pct"], "-", lw=1, color=styles.get(label), label=label)
        mem.plot(s["t"], s["free_mib"], "-", lw=1, color=styles.get(label), label=label)
    cpu.set_xlabel("time since the monitors started (s)", fontsize=8)
    cpu.set_ylabel("host CPU, user + system (%)", fontsize=8)
    cpu.set_ylim(0, 100)
    mem.set_xlabel("time since the monitors started (s)", fontsize=8)
    mem.set_ylabel("free memory (MiB)", fontsize=8)
    cpu.legend(fontsize=6, loc="best")
    fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.22, wspace=0.3)
    return _save_png(fig, out_dir, stem, "vmstat -n -t 1, as each run recorded it (monitors/vmstat.txt)")
