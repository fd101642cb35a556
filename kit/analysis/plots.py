"""Figures of ``kit analyze``: PNG and PDF with matplotlib's Agg backend, imported when drawing.

Every figure carries the comparability headline in its subtitle, so a figure that leaves the report
still says whether the arms were a controlled comparison. Example::

    written = perf_figures(report, Path("out"))   # ['performance-decomposition.png', ...]
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from kit.analysis.perf import STAGES
from kit.model.documents import read_json_file
from kit.model.errors import KitError

# Drawing is most of analyze's time: fixed margins instead of tight_layout (which draws every figure
# once more to measure it), footers wrapped by character count instead of matplotlib's wrap=True
# (which measures each word), and a screen DPI; a figure holds only the artists its question needs.
DPI = 100
MOVING_AVERAGE = 10
MARGINS = {"left": 0.08, "right": 0.97, "top": 0.9, "bottom": 0.17, "hspace": 0.35, "wspace": 0.25}


class _Figures:
    """The two calls of pyplot the figures use, on bare Figure objects: pyplot's import and its figure
    manager cost more than drawing a small figure, and nothing here is shown on a screen."""

    @staticmethod
    def subplots(*shape, figsize=None, **kwargs):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        return fig, fig.subplots(*shape, **kwargs)

    @staticmethod
    def close(fig) -> None:
        """Nothing to release: no pyplot figure manager holds the figure."""


def _pyplot():
    return _Figures


def _save(fig, out_dir: Path, stem: str, subtitle: str, margins: dict | None = None) -> list[str]:
    if subtitle.startswith("NOT"):
        fig.text(0.005, 0.995, "descriptive, not causal: not a controlled comparison", ha="left", va="top",
                 fontsize=8, color="#b00020", weight="bold")
    width = int(fig.get_figwidth() * 14)        # characters of 7 pt text per inch, roughly
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(subtitle, width)[:3]), ha="center", va="bottom", fontsize=7,
             color="#b00020" if subtitle.startswith("NOT") else "#333333")
    fig.subplots_adjust(**{**MARGINS, **(margins or {})})
    names = []
    for ext in ("png", "pdf"):
        # a fixed creation date keeps the PDF bytes reproducible
        metadata = {"CreationDate": None} if ext == "pdf" else {"Software": None}
        extra = {} if ext == "pdf" else {"pil_kwargs": {"compress_level": 1}}   # zlib's fastest; a few % larger
        fig.savefig(out_dir / f"{stem}.{ext}", dpi=DPI, metadata=metadata, **extra)
        names.append(f"{stem}.{ext}")
    _Figures.close(fig)
    return names


# One colour per operator case in every figure: production (P/P) blue, strict (R/R) orange, mixed purple.
CASE_COLORS = {"P/P": "#1f6fb4", "R/R": "#d9730d"}
MIXED_COLOR = "#6a3d9a"


def case_style(name: str, case) -> tuple[str, str]:
    """``("smoke (R/R)", "#d9730d")``: an arm's label and colour from its name and operator case."""
    return (f"{name} ({case})" if case else name), CASE_COLORS.get(case, MIXED_COLOR if case else None)


def _group_cases(rounds) -> dict:
    cases: dict = {}
    for r in rounds:
        cases.setdefault(r["group"], set()).add(r.get("operator_case"))
    return {g: next(iter(c)) if len(c) == 1 else None for g, c in cases.items()}


def _symlog_ticks(ax, linthresh: float, most: int = 6) -> None:
    """At most ``most`` labelled decades on a symlog axis (every decade from 1e-9 up would overlap)."""
    import math

    from matplotlib.ticker import FixedLocator, NullLocator

    lo, hi = ax.get_ylim()
    top = max(abs(lo), abs(hi), linthresh)
    first, last = math.floor(math.log10(linthresh)), math.ceil(math.log10(top))
    step = max(1, math.ceil((last - first + 1) / (most - 1)))
    decades = [10.0 ** e for e in range(last, first - 1, -step)]
    ticks = sorted({0.0, *decades, *(-d for d in decades if -d >= lo)})
    shown = [t for t in ticks if lo <= t <= hi]
    if len(shown) < 2:        # the data span less than a decade: a few plain ticks inside it
        from matplotlib.ticker import MaxNLocator, ScalarFormatter

        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
        return
    ax.yaxis.set_major_locator(FixedLocator(shown))
    ax.yaxis.set_minor_locator(NullLocator())


def moving_average(values, window: int = MOVING_AVERAGE):
    """Trailing mean over up to ``window`` finite values; None before the first value."""
    out, buf = [], []
    for v in values:
        if v is not None:
            buf.append(v)
            buf = buf[-window:]
        out.append(sum(buf) / len(buf) if buf else None)
    return out


def _series(rows, arm, col):
    pts = [(r["step"], r[col]) for r in rows if r["arm"] == arm and r[col] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def operators_label(arm_doc: dict) -> str | None:
    """``"R/R"`` when every operator case is R/R, ``"P/P"`` when every one is P/P, else the three cases;
    None without operators (a bare log)."""
    ops = arm_doc.get("operators") if isinstance(arm_doc, dict) and isinstance(arm_doc.get("operators"), dict) else None
    if not ops:
        return None
    cases = [str(ops.get(k)) for k in ("attention", "ffn", "logp")]
    return cases[0] if len(set(cases)) == 1 else "attn " + " · ".join(cases)


def _case_of_run(run_dir) -> str | None:
    if not run_dir:
        return None
    try:
        manifest = read_json_file(Path(run_dir) / "manifest.json")
    except KitError:
        return None
    return operators_label(manifest.get("arm")) if isinstance(manifest, dict) else None


def perf_view(report) -> dict:
    """What the perf figures read, as plain data that a drawing process can receive."""
    cases = {a["name"]: _case_of_run(a.get("run_dir")) for a in report.summary.get("arms", [])}
    return {"subtitle": report.comparability.headline(), "rows": report.rows, "arms": report.arm_names,
            "summary": report.summary, "styles": {a: case_style(a, cases.get(a)) for a in report.arm_names}}


def _style(view, arm, i):
    """An arm's label and colour in the perf figures: by its operator case, else the i-th default colour."""
    label, color = view.get("styles", {}).get(arm, (arm, None))
    return label, color or f"C{i}"


PERF_DRAWINGS = ("performance-decomposition", "length-controlled-scaling", "stage-time-series",
                 "token-normalized-throughput")


def perf_figure_tasks(report, out_dir: Path, part: str = "all") -> list:
    """One ``(function, args)`` per perf figure, the costliest first so that two workers end together.

    ``part``: ``early`` the figures that read only rows and descriptive statistics (drawable from
    analyze_perf's ``on_descriptives`` report, during the bootstrap), ``late`` the ones that show CIs."""
    view = perf_view(report)
    chosen = {"early": EARLY_DRAWINGS, "late": LATE_DRAWINGS}.get(part, EARLY_DRAWINGS + LATE_DRAWINGS)
    return [(fn, (view, out_dir)) for fn in sorted(chosen, key=DRAWING_COST.index)]


def perf_figures(report, out_dir: Path, pool=None) -> list[str]:
    """The four perf figures (PNG + PDF each), drawn by ``pool`` (kit.analysis.figure_pool) or here."""
    drawn = [n for names in (pool.map if pool else _here)(perf_figure_tasks(report, out_dir)) for n in names]
    return sorted(drawn, key=lambda n: (PERF_DRAWINGS.index(n.rsplit(".", 1)[0]), n.endswith(".pdf")))


def _here(tasks) -> list:
    return [fn(*args) for fn, args in tasks]


def _unpack(view):
    return _pyplot(), view["subtitle"], view["rows"], view["arms"], view["summary"]["subsets"]["all"]["arms"]


def performance_decomposition(view, out_dir: Path) -> list[str]:
    """Mean seconds per stage, stacked, one bar per arm; the step-time % effect and CI in the title."""
    plt, subtitle, rows, arms, block = _unpack(view)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottoms = [0.0] * len(arms)
    for sid, label, col, _ in STAGES:
        means = [block[a]["metrics"][col]["mean"] for a in arms]
        if all(m is None for m in means):
            continue
        heights = [m or 0.0 for m in means]
        ax.bar(arms, heights, bottom=bottoms, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    undivided = [block[a]["metrics"]["train_time_s"]["mean"] if block[a]["metrics"]["actor_train_time_s"]["mean"] is None
                 else None for a in arms]
    if any(u is not None for u in undivided):
        heights = [u or 0.0 for u in undivided]
        ax.bar(arms, heights, bottom=bottoms, label="training (actor/residual not logged)", hatch="//")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, a in enumerate(arms):
        st = block[a]["metrics"]["step_time_s"]["mean"]
        if st is not None:
            ax.annotate(f"step {st:.2f} s", (i, bottoms[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("mean seconds per step")
    effects = []
    for comp in view["summary"]["subsets"]["all"]["comparisons"]:
        pct = ((comp["metrics"].get("step_time_s") or {}).get("bootstrap") or {}).get("percent")
        if pct:
            effects.append(f"{comp['other']} vs {comp['reference']}: {pct['estimate']:+.1f} % "
                           f"[{pct['ci95_low']:+.1f}, {pct['ci95_high']:+.1f}]")
    ax.set_title("Step time decomposition" + (f"\nstep time {'; '.join(effects)} (95 % CI)" if effects else ""), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out_dir, "performance-decomposition", subtitle, {"right": 0.7, "top": 0.88})


def _actor_known(rows) -> bool:
    return any(r["actor_train_time_s"] is not None and r["total_tokens_total"] is not None for r in rows)


def length_controlled_scaling(view, out_dir: Path) -> list[str]:
    """Time against tokens per step with the OLS lines (shared slope, or one line per arm) and the gap's CI."""
    plt, subtitle, rows, arms, _ = _unpack(view)
    summary = view["summary"]
    panels = [("rollout_time_s", "response_tokens_total", "response_ktokens", "rollout time (s)")]
    actor_known = _actor_known(rows)
    panels.append(("actor_train_time_s", "total_tokens_total", "total_ktokens", "actor train time (s)") if actor_known
                  else ("step_time_s", "response_tokens_total", "response_ktokens", "step time (s)"))
    per_arm = summary["length_control"]["leading"] == "per-arm"
    fits = {(f["response"], f["coefficients"][1]["name"]): f for f in summary["regressions"]}
    if per_arm:
        fits = {(f["response"], f["coefficients"][1]["name"][:-len("_centred")]): f
                for f in summary["length_control"]["per_arm"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (ycol, xcol, xname, ylabel) in zip(axes, panels):
        fit = fits.get((ycol, xname))
        for i, a in enumerate(arms):
            pts = [(r[xcol] / 1e3, r[ycol]) for r in rows if r["arm"] == a and r[xcol] is not None and r[ycol] is not None]
            if not pts:
                continue
            name, colour = _style(view, a, i)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", ms=2.5, alpha=0.5, label=name, color=colour)
            if fit:
                xs = [min(p[0] for p in pts), max(p[0] for p in pts)]
                if per_arm:
                    line, k0 = fit["lines"][a], fit["evaluated_at_ktokens"]
                    ys = [line["at_pooled_mean_s"] + line["slope_s_per_ktoken"] * (x - k0) for x in xs]
                else:
                    coef = {c["name"]: c["estimate"] for c in fit["coefficients"]}
                    ys = [coef["intercept"] + coef.get(f"arm[{a}]", 0.0) + coef[xname] * x for x in xs]
                ax.plot(xs, ys, lw=1.5, color=colour)
        ax.set_xlabel(f"{xname.replace('_ktokens', '')} tokens per step (thousands)")
        ax.set_ylabel(ylabel)
        if fit and len(arms) > 1:
            gaps = ", ".join(f"{c['name']}: {c['estimate']:+.2f} s [{c['ci95_low']:+.2f}, {c['ci95_high']:+.2f}]"
                             for c in fit["coefficients"] if c["name"].startswith("arm["))
            how = (f"OLS line per arm; gap at {fit['evaluated_at_ktokens']:.1f} k tokens" if per_arm
                   else "OLS, common slope; gap at equal tokens")
            ax.set_title(f"{how}\n{gaps}", fontsize=8)
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "length-controlled-scaling", subtitle, {"top": 0.86})


def stage_time_series(view, out_dir: Path) -> list[str]:
    """Raw stage times per step with a trailing moving average, one panel per stage."""
    plt, subtitle, rows, arms, _ = _unpack(view)
    actor_known = _actor_known(rows)
    cols = [("rollout_time_s", "rollout generation (s)"),
            ("actor_train_time_s" if actor_known else "train_time_s",
             "actor training (s)" if actor_known else "training (s)"),
            ("step_time_s", "step time (s)")]
    fig, axes = plt.subplots(len(cols), 1, figsize=(10, 8), sharex=True)
    for ax, (col, label) in zip(axes, cols):
        for i, a in enumerate(arms):
            xs, ys = _series(rows, a, col)
            if not xs:
                continue
            name, colour = _style(view, a, i)
            ax.plot(xs, ys, lw=0.6, alpha=0.35, color=colour)
            ax.plot(xs, moving_average(ys), lw=1.6, color=colour, label=f"{name} ({MOVING_AVERAGE}-step mean)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[-1].set_xlabel("step (one optimizer step per rollout)")
    axes[0].set_title("Stage times per step")
    return _save(fig, out_dir, "stage-time-series", subtitle)


def token_normalized_throughput(view, out_dir: Path) -> list[str]:
    """Mean rollout tokens/GPU/s and actor tokens/s per arm, with the ratios to the reference arm."""
    plt, subtitle, rows, arms, block = _unpack(view)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (col, label) in zip(axes, (("rollout_tok_per_gpu_s", "rollout tokens / GPU / s"),
                                       ("actor_train_tok_s", "actor train tokens / s"))):
        means = [block[a]["metrics"][col]["mean"] for a in arms]
        ax.bar([_style(view, a, i)[0] for i, a in enumerate(arms)], [m or 0.0 for m in means],
               color=[_style(view, a, i)[1] for i, a in enumerate(arms)])
        ref = means[0]
        for i, m in enumerate(means):
            if m is not None:
                text = f"{m:.1f}" + (f"\n{ref / m:.3f}× ({arms[0]}/{arms[i]})" if i and ref else "")
                ax.annotate(text, (i, m), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(label)
    return _save(fig, out_dir, "token-normalized-throughput", subtitle)


def _group_series(rounds, group, col):
    # mean over runs of a group at each step
    by_step: dict = {}
    for r in rounds:
        if r["group"] == group and r[col] is not None:
            by_step.setdefault(r["step"], []).append(r[col])
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


CONVERGENCE_GRIDS = (
    ("consistency", "Train/rollout log-prob consistency", (
        ("mean_abs_dlogp", "mean |train logp − rollout logp| (nats)", "symlog"),
        ("max_abs_dlogp", "max |train logp − rollout logp| (nats)", "symlog"),
        ("mismatch_rate", "mismatch rate (mismatch / active tokens)", "linear"),
        ("mismatch_count", "bitwise mismatches per step (tokens)", "symlog-count")), ()),
    ("learning", "Learning", (
        ("raw_reward", "raw reward", "linear"), ("reward", "normalized reward", "linear"),
        ("response_length", "mean response length (tokens)", "linear"),
        ("truncated_ratio", "truncated ratio", "linear")), ("raw_reward", "response_length")),
    ("optimization", "Optimization", (
        ("train_loss", "loss (policy-gradient objective)", "symlog"), ("grad_norm", "grad norm (L2)", "symlog"),
        ("ppo_kl", "PPO KL (nats)", "symlog"), ("pg_clipfrac", "clip fraction (share of tokens)", "linear")), ()),
    ("performance", "Performance", (
        ("step_time", "step time (s)", "linear"), ("rollout_time", "rollout time (s)", "linear"),
        ("train_time", "train time (s)", "linear"), ("actor_tokens_per_second", "actor tokens / s", "linear")),
     ("step_time", "rollout_time", "train_time", "actor_tokens_per_second")),
)


def convergence_figures(report, out_dir: Path, pool=None) -> list[str]:
    """The four 2×2 convergence figures (PNG + PDF each), drawn by ``pool`` or here."""
    view = {"subtitle": report.summary["comparison"]["headline"], "rounds": report.rounds}
    drawn = (pool.map if pool else _here)([(convergence_grid, (view, out_dir, *grid)) for grid in CONVERGENCE_GRIDS])
    return [name for names in drawn for name in names]


def convergence_grid(view, out_dir: Path, stem: str, title: str, panels, ma=()) -> list[str]:
    """One 2×2 figure: a panel per column of rounds.csv, a line per group (its runs averaged per step)."""
    from matplotlib.ticker import MaxNLocator

    plt, rounds = _pyplot(), view["rounds"]
    groups = list(dict.fromkeys(r["group"] for r in rounds))
    styles = {g: case_style(g, c) for g, c in _group_cases(rounds).items()}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.2), squeeze=False)
    for ax, (col, label, scale) in zip(axes.flat, panels):
        series = {g: (_ratio_series(rounds, g) if col == "mismatch_rate" else _group_series(rounds, g, col)) for g in groups}
        values = [y for _, ys in series.values() for y in ys]
        if not values or all(y == 0 for y in values):
            # nothing to see at full size: say it in words instead of drawing a flat line
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{label}:\n{'not logged' if not values else '0 at every step of every arm'}",
                    ha="center", va="center", fontsize=9, color="#555555", transform=ax.transAxes)
            continue
        for g, (xs, ys) in series.items():
            if not xs:
                continue
            name, color = styles[g]
            if col in ma:
                ax.plot(xs, ys, lw=0.6, alpha=0.35, color=color)
                ax.plot(xs, moving_average(ys), lw=1.5, color=color, label=f"{name} ({MOVING_AVERAGE}-step mean)")
            else:
                ax.plot(xs, ys, lw=1.0, color=color, label=name)
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=1e-9)
            _symlog_ticks(ax, 1e-9)
        elif scale == "symlog-count":
            ax.set_yscale("symlog", linthresh=1.0)
            _symlog_ticks(ax, 1.0)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step (one optimizer step per rollout)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, out_dir, stem, view["subtitle"])


def _ratio_series(rounds, group):
    by_step: dict = {}
    for r in rounds:
        if r["group"] == group and r["mismatch_count"] is not None and r["active_token_count"]:
            m, t = by_step.get(r["step"], (0.0, 0.0))
            by_step[r["step"]] = (m + r["mismatch_count"], t + r["active_token_count"])
    steps = sorted(by_step)
    return steps, [by_step[s][0] / by_step[s][1] for s in steps]


REPLICATE_UNITS = {"raw_reward": "raw reward", "reward": "normalized reward", "mismatch_count": "mismatched tokens / step",
                   "mean_abs_dlogp": "mean |Δlogp| (nats)", "max_abs_dlogp": "max |Δlogp| (nats)",
                   "response_length": "response length (tokens)", "step_time_s": "step time (s)",
                   "rollout_time_s": "rollout time (s)"}


def noise_floor_figure(doc, out_dir: Path) -> list[str]:
    """``noise-floor``: per metric, each arm's seed means (dots) and their range (the noise floor, a bar),
    side by side, so the gap between arms reads against the spread between seeds; the verdict in the title."""
    plt = _pyplot()
    metrics = [m for m in REPLICATE_UNITS if any(m in a["metrics"] for a in doc["arms"])]
    cols = 4
    rows = max(1, -(-len(metrics) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.3 * rows), squeeze=False)
    verdicts = {m: v for d in doc["differences"] for m, v in d["metrics"].items()}
    names = [a["arm"] for a in doc["arms"]]
    styles = [case_style(a["arm"], _case_of_run((a["runs"] or [{}])[0].get("source"))) for a in doc["arms"]]
    for ax, metric in zip(axes.flat, metrics):
        for i, arm in enumerate(doc["arms"]):
            m = arm["metrics"].get(metric)
            if m is None:
                continue
            means, color = m["seed_means"], styles[i][1] or f"C{i}"
            ax.plot([i] * len(means), means, "o", ms=4, color=color, alpha=0.8)
            ax.plot([i, i], [min(means), max(means)], lw=6, color=color, alpha=0.25, solid_capstyle="butt")
            ax.plot([i - 0.2, i + 0.2], [m["mean"]] * 2, lw=1.5, color=color)
        ax.set_xticks(range(len(names)), [f"{s[0]}\n({len(a['runs'])} seeds)" for s, a in zip(styles, doc["arms"])],
                      fontsize=7)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylabel(REPLICATE_UNITS[metric], fontsize=8)
        v = verdicts.get(metric)
        if v is None or v["exceeds_noise_floor"] is None:
            ax.set_title(f"{metric}\nno noise floor (one seed)" if v else metric, fontsize=8)
        else:
            words = "exceeds" if v["exceeds_noise_floor"] else "within"
            ax.set_title(f"{metric}: Δ {v['difference']:+.3g} [{v['ci95_low']:+.3g}, {v['ci95_high']:+.3g}]\n"
                         f"{words} the noise floor {v['noise_floor']:.3g}", fontsize=8,
                         color="#0b6e2e" if v["exceeds_noise_floor"] else "#333333")
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    fig.suptitle("Noise floor: seed means per arm (dots), their range (bar), the arm mean (line); "
                 f"difference vs {names[0]} with a two-level bootstrap 95 % CI", fontsize=9)
    subtitle = ("noise floor = range of one arm's seed means (runs that differ only in seed); a difference exceeds it "
                "when its CI excludes 0 and it is larger than both arms' ranges")
    return _save(fig, out_dir, "noise-floor", subtitle, {"top": 0.86, "bottom": 0.12, "hspace": 0.6, "wspace": 0.45})


# The costliest first; early figures need no comparison, late ones print bootstrap and OLS CIs.
DRAWING_COST = (stage_time_series, length_controlled_scaling, token_normalized_throughput, performance_decomposition)
EARLY_DRAWINGS = (stage_time_series, token_normalized_throughput)
LATE_DRAWINGS = (length_controlled_scaling, performance_decomposition)
