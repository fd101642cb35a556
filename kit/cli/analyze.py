"""``kit analyze perf`` and ``kit analyze convergence``: tables, statistics and figures of runs.

Parsing and printing only; the analysis lives in kit.analysis.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from kit.cli._output import no_empty_paths
from kit.analysis.table import load_arms
from kit.analysis.stats import single_threaded_blas
from kit.analysis.output import publish, refuse_existing, write_csv, write_json
from kit.analysis.perf import COLUMNS, SCHEMA, SUMMARY_CSV_COLUMNS, analyze_perf
from kit.analysis.plots import convergence_figures, noise_floor_figure, perf_figure_tasks
from kit.analysis.figure_pool import FigurePool
from kit.analysis.convergence import ROUNDS_COLUMNS, RUNS_COLUMNS, SUMMARY_FIELDS, analyze_convergence
from kit.analysis.monitors import FIGURE as MONITORS_FIGURE, has_monitors, monitor_figure, read_monitors
from kit.run.replicates import group_runs
from kit.analysis.replicates import SCHEMA as REPLICATES_SCHEMA, analyze_replicates


PERF_FILES = ("step-metrics.csv", "summary.csv", "summary.json")
PERF_FIGURES = ("performance-decomposition", "length-controlled-scaling", "stage-time-series",
                "token-normalized-throughput")
CONVERGENCE_FILES = ("runs.csv", "rounds.csv", "summary.csv", "summary.json")
CONVERGENCE_FIGURES = ("consistency", "learning", "optimization", "performance")


def _figure_files(stems, figures: bool) -> tuple[str, ...]:
    return tuple(f"{s}.{ext}" for s in stems for ext in ("png", "pdf")) if figures else ()


NOTES_FILE = "notes.txt"


def _load(paths, names, global_batch_size):
    """Load the runs; every skipped (unparseable) record line is warned about on stderr."""

    arms = load_arms(list(paths), names, global_batch_size)
    for arm in arms:
        messages = arm.unparseable_messages()
        for message in messages[:20]:
            click.echo(f"kit: warning: {message}", err=True)
        if len(messages) > 20:
            click.echo(f"kit: warning: {arm.log_path}: {len(messages) - 20} more unparseable record line(s)", err=True)
    return arms


def _notes(arms, headline: str) -> list[str]:
    """The lines of notes.txt: what the reader skipped or could not use, per arm."""
    lines = []
    for arm in arms:
        lines += [f"{arm.name}: {note}" for note in arm.notes]
        lines += [f"{arm.name}: {message}" for message in arm.unparseable_messages()]
    return [headline, ""] + lines if lines else []


def _write_notes(tmp: Path, lines: list[str]) -> list[str]:
    if not lines:
        return []
    (tmp / NOTES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [NOTES_FILE]


@click.group("analyze")
def command():
    """Performance decomposition, statistics, convergence tables and figures.

    \b
    Inputs are run directories (run.log + manifest.json) or bare VIME logs
    (arm name = file stem; --name overrides, once per input in order).
    A record line whose dict does not parse is skipped with a warning on
    stderr and listed (file:line) in notes.txt and summary.json arms[].notes
    (perf); a log whose every record line is unparseable is refused (exit 2).

    \b
    Examples:
      kit analyze perf runs/g10-s1234 runs/g11-s1234 --out report/perf
      kit analyze perf G10.log G11.log --out report/perf --steady-from 1 --json
      kit analyze convergence runs/g10-s1234 runs/g11-s1234 --out report/convergence
    """
    single_threaded_blas()      # before numpy is imported (kit.analysis.stats)


_common = [
    click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
                 help="Output directory; created if missing. Existing files are never overwritten."),
    click.option("--name", "names", multiple=True, metavar="NAME",
                 help="Arm name for each input, in order (default: manifest arm name, else run dir name / file stem)."),
    click.option("--global-batch-size", type=click.IntRange(min=1), default=None,
                 help="Samples per step when neither the manifest nor the log records it."),
    click.option("--figures/--no-figures", default=True, show_default=True, help="Render PNG and PDF figures."),
    click.option("--json", "as_json", is_flag=True, help="Print summary.json to stdout."),
]


def _options(fn):
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


@command.command("perf")
@click.argument("runs", nargs=-1, required=True, metavar="RUN_OR_LOG...", callback=no_empty_paths)
@_options
@click.option("--paired/--unpaired", "paired", default=None,
              help="Bootstrap pairing. Default: each subset is paired when both arms hold its steps at "
                   "the same step indices, else unpaired; --paired also requires the runs to share step "
                   "indices; --unpaired never pairs.")
@click.option("--steady-from", type=click.IntRange(min=0), default=1, show_default=True,
              help="First step of the steady-state subset (steps >= K).")
@click.option("--draws", type=click.IntRange(min=100), default=20_000, show_default=True, help="Bootstrap draws.")
@click.option("--seed", type=click.IntRange(min=0), default=1234, show_default=True, help="Bootstrap seed.")
@click.option("--bootstrap", "scheme", type=click.Choice(["kit", "published"]), default="kit", show_default=True,
              help="Index draws: kit (one matrix per sample size and stream), or published (default_rng(SEED)."
                   "integers(0, n, (DRAWS, n)) once, reused for paired differences: checks a published table bit for bit).")
@click.option("--length-lines", type=click.Choice(["shared", "per-arm"]), default="shared", show_default=True,
              help="Which length control leads the text and figure; both are in summary.json. shared: one slope, "
                   "one gap at every length; per-arm: a line per arm, gap at the pooled mean length.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs per run for per-GPU throughput (default: the manifest's topology.gpus; bare logs: none).")
@click.option("--strict", is_flag=True,
              help="Exit 1 (after writing the report) unless the arms hold the same steps with every record parsed "
                   "and every logged metric present at each step.")
@click.option("--accept-gate-sets", is_flag=True, help="Runs judged by different gate-set versions may still be a "
              "controlled comparison (by default they are not).")
def perf(runs, out_dir, names, global_batch_size, figures, as_json, paired, steady_from, draws, seed, scheme,
         length_lines, gpus, strict, accept_gate_sets):
    """Per-step stage decomposition, throughput, OLS and bootstrap CIs of arm differences.

    \b
    The first input is the reference arm; others are compared with it.
    Unless both run dirs pass kit verify (seal, artifacts, gates, manifest
    schema) and kit compare finds their manifests a controlled comparison,
    every difference is labelled "descriptive, not causal"; the column
    `comparison` of step-metrics.csv and summary.csv carries that label
    per arm ("reference" for the first arm, "single arm" alone).
    \b
    Example:
      kit analyze perf runs/g10 runs/g11 --out report/perf --unpaired
      kit analyze perf G10.log G11.log --out r --bootstrap published --strict
    """
    monitored = figures and any(has_monitors(Path(r)) for r in runs)
    files = PERF_FILES + (NOTES_FILE,) + _figure_files(PERF_FIGURES + ((MONITORS_FIGURE,) if monitored else ()), figures)
    refuse_existing(out_dir, files)
    # drawing processes (one per figure, on idle cores) warm up during the statistics
    with FigurePool(most=len(PERF_FIGURES)) if figures else contextlib.nullcontext() as pool:
        report, warnings, paths = _perf_outputs(runs, names, global_batch_size, paired, steady_from, draws, seed,
                                                scheme, length_lines, gpus, accept_gate_sets, out_dir, figures,
                                                monitored, pool)
    for w in warnings:
        click.echo(f"kit: warning: uneven data: {w}", err=True)
    if as_json:
        click.echo(json.dumps(report.summary, indent=2, sort_keys=True))
    else:
        click.echo(_perf_text(report))
        click.echo(f"wrote {len(paths)} files to {out_dir}")
    if strict and warnings:
        click.echo(f"kit: --strict: the arms are not aligned ({len(warnings)} problem(s), listed above and in "
                   f"{out_dir / 'summary.json'} alignment.warnings)", err=True)
        raise SystemExit(1)


def _perf_outputs(runs, names, global_batch_size, paired, steady_from, draws, seed, scheme, length_lines, gpus,
                  accept_gate_sets, out_dir, figures, monitored, pool):
    """Read, analyse and publish; returns (report, alignment warnings, the paths written).

    The figures that need no comparison are handed to the drawing processes before the bootstrap
    runs (analyze_perf's ``on_descriptives``), the others as soon as it is done."""
    arms = _load(runs, names, global_batch_size)
    pairing = "auto" if paired is None else ("paired" if paired else "unpaired")
    done: dict = {}

    def produce(tmp: Path) -> list[str]:
        drawing = []

        def draw(report, part):
            drawing.append(pool.start(perf_figure_tasks(report, tmp, part)) if figures else list)

        try:
            report = analyze_perf(arms, steady_from=steady_from, pairing=pairing, draws=draws, seed=seed,
                                  scheme=scheme, length_lines=length_lines, gpus=gpus,
                                  accept_gate_sets=accept_gate_sets, on_descriptives=lambda r: draw(r, "early"))
            draw(report, "late")                      # drawn while the tables are written
        except BaseException:
            for collect in drawing:                   # no drawing process may still write into tmp
                try:
                    collect()
                except Exception:                     # the first error is the one reported
                    pass
            raise
        warnings = done["warnings"] = report.summary["alignment"]["warnings"]
        done["report"] = report
        written = [write_csv(tmp / "step-metrics.csv", COLUMNS, report.rows),
                   write_csv(tmp / "summary.csv", SUMMARY_CSV_COLUMNS, report.summary_rows),
                   write_json(tmp / "summary.json", report.summary, SCHEMA)]
        notes = _notes(arms, report.summary["comparison"]["headline"])
        notes += [f"uneven data: {w}" for w in warnings] if notes else (
            [report.summary["comparison"]["headline"], ""] + [f"uneven data: {w}" for w in warnings] if warnings else [])
        written += _write_notes(tmp, notes)
        written += [name for collect in drawing for names in collect() for name in names]
        if monitored:   # GPU and host monitors of the run dirs, beside their step times
            written += _monitor_figure(runs, arms, report, tmp)
        return written

    paths = publish(out_dir, produce)
    return done["report"], done["warnings"], paths


def _monitor_figure(runs, arms, report, tmp: Path) -> list[str]:

    by_arm = {}
    for path, arm in zip(runs, arms):
        series = read_monitors(Path(path))
        if series is not None:
            rows = sorted((r for r in report.rows if r["arm"] == arm.name), key=lambda r: r["step"])
            by_arm[arm.name] = (series, [r["step_time_s"] for r in rows if r["step_time_s"] is not None])
    return monitor_figure(by_arm, tmp, report.summary["comparison"]["headline"])


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def _perf_text(report) -> str:
    s = report.summary
    lines = [s["comparison"]["headline"], ""]
    block = s["subsets"]["all"]
    lines.append(f"{'arm':<16}{'steps':>6}{'step s':>10}{'rollout s':>11}{'update s':>10}{'wait res s':>11}"
                 f"{'train s':>9}{'rollout tok/GPU/s':>19}{'actor tok/s':>13}")
    for arm in s["arms"]:
        m = block["arms"][arm["name"]]["metrics"]
        lines.append(f"{arm['name']:<16}{arm['steps']:>6}{_fmt(m['step_time_s']['mean']):>10}"
                     f"{_fmt(m['rollout_time_s']['mean']):>11}{_fmt(m['update_weights_time_s']['mean']):>10}"
                     f"{_fmt(m['wait_residual_time_s']['mean']):>11}{_fmt(m['train_time_s']['mean']):>9}"
                     f"{_fmt(m['rollout_tok_per_gpu_s']['mean'], '.1f'):>19}{_fmt(m['actor_train_tok_s']['mean'], '.1f'):>13}")
    for comp in block["comparisons"]:
        lines.append("")
        lines.append(f"{comp['other']} − {comp['reference']} ({comp['label']}; {comp['bootstrap_method']} bootstrap, "
                     f"{s['settings']['bootstrap']['draws']} draws):")
        for metric in ("step_time_s", "rollout_time_s", "actor_train_time_s", "train_time_s"):
            m = comp["metrics"].get(metric)
            if m and m["bootstrap"]:
                b, pct = m["bootstrap"], m["bootstrap"]["percent"]
                effect = f"  {pct['estimate']:+.2f} % [{pct['ci95_low']:+.2f}, {pct['ci95_high']:+.2f}]" if pct else ""
                lines.append(f"  {metric:<22}{m['difference']:+10.3f}  95% CI [{b['ci95_low']:+.3f}, {b['ci95_high']:+.3f}]"
                             f"{effect}")
    lines += _length_text(s)
    for sp in s["speedups"]:
        lines.append(f"  end-to-end {sp['other']}/{sp['reference']} step time ratio "
                     f"{_fmt(sp['end_to_end_other_over_reference'], '.4f')} ({sp['label']})")
    for arm in s["arms"]:
        if arm["missing_log_keys"]:
            lines.append(f"note: {arm['name']} logs no {', '.join(arm['missing_log_keys'])}; those columns are empty")
        lines += [f"note: {arm['name']}: {note}" for note in arm["notes"]]
    return "\n".join(lines)


def _length_text(s) -> list[str]:
    """The step-time gap at equal response tokens, by the leading length control (the other in brackets)."""
    lc = s["length_control"]
    shared = [d for d in s["regressions"] if d["response"] == "step_time_s" and d["coefficients"][1]["name"] == "response_ktokens"]
    per_arm = [d for d in lc["per_arm"] if d["response"] == "step_time_s" and "response_ktokens" in d["model"]]
    out = []
    for doc, how in ((shared, "shared slope"), (per_arm, "per-arm lines at the pooled mean"))[::1 if lc["leading"] == "shared" else -1]:
        for c in (doc[0]["coefficients"] if doc else []):
            if c["name"].startswith("arm["):
                out.append(f"  step time gap at equal response tokens, {how}: {c['name'][4:-1]} {c['estimate']:+.3f} s "
                           f"[{c['ci95_low']:+.3f}, {c['ci95_high']:+.3f}]")
    return out + [f"  note: {n}" for n in lc["notes"][:2]]


@command.command("convergence")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...", callback=no_empty_paths)
@_options
@click.option("--phase", default=None, help="Phase label for every run (default: name of the run's parent directory).")
@click.option("--accept-gate-sets", is_flag=True, help="Runs judged by different gate-set versions may still be a "
              "controlled comparison (by default they are not).")
def convergence(runs, out_dir, names, global_batch_size, figures, as_json, phase, accept_gate_sets):
    """runs.csv, rounds.csv (29 columns), per-arm summaries and convergence figures.

    \b
    Several runs of one arm (same name) are summarised together; they must
    differ in nothing but workload.seed and workload.rollout_seed (exit 2
    names the runs and the fields otherwise).
    Mismatch and active-token counts are VIME's per-sample means × the global batch size.
    \b
    Example:
      kit analyze convergence runs/g10 runs/g11 --out report/convergence
    """

    files = CONVERGENCE_FILES + (NOTES_FILE,) + _figure_files(CONVERGENCE_FIGURES, figures)
    refuse_existing(out_dir, files)
    arms = _load(runs, names, global_batch_size)
    report = analyze_convergence(arms, phase, accept_gate_sets=accept_gate_sets)
    comparison = report.summary["comparison"]

    def produce(tmp: Path) -> list[str]:
        rows = [{**row, "comparison": comparison["label"] if comparison["applicable"] else "single arm"}
                for row in report.summary["summaries"]]
        written = [write_csv(tmp / "runs.csv", RUNS_COLUMNS, report.runs),
                   write_csv(tmp / "rounds.csv", ROUNDS_COLUMNS, report.rounds),
                   write_csv(tmp / "summary.csv", SUMMARY_FIELDS + ("comparison",), rows),
                   write_json(tmp / "summary.json", report.summary, "rlk-kit/analysis-convergence/v1")]
        written += _write_notes(tmp, _notes(arms, comparison["headline"]))
        if figures:
            with FigurePool() as pool:
                written += convergence_figures(report, tmp, pool)
        return written

    paths = publish(out_dir, produce)
    if as_json:
        click.echo(json.dumps(report.summary, indent=2, sort_keys=True))
        return
    lines = [comparison["headline"], "",
             f"{'group':<16}{'runs':>5}{'rounds':>7}{'tokens':>12}{'mismatches':>12}{'rate':>9}"
             f"{'max|dlogp|':>12}{'raw reward':>11}{'step s':>9}"]
    for sm in report.summary["summaries"]:
        lines.append(f"{sm['group']:<16}{sm['run_count']:>5}{sm['round_count']:>7}{_fmt(sm['active_token_exposure'], '.0f'):>12}"
                     f"{_fmt(sm['bitwise_mismatch_count'], '.0f'):>12}{_fmt(sm['bitwise_mismatch_rate'], '.4f'):>9}"
                     f"{_fmt(sm['max_abs_dlogp'], '.4g'):>12}{_fmt(sm['raw_reward_mean'], '.4f'):>11}"
                     f"{_fmt(sm['step_time_mean'], '.2f'):>9}")
    lines += [f"note: {arm.name}: {note}" for arm in arms for note in arm.notes]
    click.echo("\n".join(lines))
    click.echo(f"wrote {len(paths)} files to {out_dir}")




@command.command("replicates")
@click.argument("runs", nargs=-1, required=True, metavar="RUN_OR_GROUP...", callback=no_empty_paths)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory; created if missing. Existing files are never overwritten.")
@click.option("--draws", type=click.IntRange(min=100), default=2000, show_default=True, help="Bootstrap draws.")
@click.option("--seed", type=click.IntRange(min=0), default=1234, show_default=True, help="Bootstrap seed.")
@click.option("--figures/--no-figures", default=True, show_default=True,
              help="Draw noise-floor.png and .pdf: each arm's seed means and their range beside the other arms'.")
@click.option("--json", "as_json", is_flag=True, help="Print replicates.json to stdout.")
def replicates(runs, out_dir, draws, seed, figures, as_json):
    """Noise floor of replicate runs (seeds) and whether arm differences exceed it.

    \b
    Inputs: run dirs, or group documents of kit run --seeds (<workspace>/groups/<group>.json).
    Runs with one arm name are replicates of it; the first arm is the reference.
    Per metric: each seed's mean, the noise floor (range of seed means), and per other arm the
    difference with a two-level bootstrap CI (seeds, then steps) and a verdict in words.
    noise-floor.png/.pdf show each arm's seed means and their range per metric.
    \b
    Example:
      kit analyze replicates .workspace/groups/smoke-native-g*.json .workspace/groups/smoke-g*.json --out report/noise
    """
    paths = []
    for r in runs:
        if str(r).endswith(".json"):
            sealed, skipped = group_runs(Path(r))
            paths += sealed
            for note in skipped:
                click.echo(f"kit: warning: {note}", err=True)
        else:
            paths.append(Path(r))
    refuse_existing(out_dir, ("replicates.json",) + _figure_files(("noise-floor",), figures))
    doc = analyze_replicates(load_arms(paths), draws=draws, seed=seed)
    publish(out_dir, lambda tmp: [write_json(tmp / "replicates.json", doc, REPLICATES_SCHEMA)]
            + (noise_floor_figure(doc, tmp) if figures else []))
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    for arm in doc["arms"]:
        click.echo(f"{arm['arm']}: {len(arm['runs'])} run(s), seeds {', '.join(str(r['seed']) for r in arm['runs'])}")
    for d in doc["differences"]:
        for m in d["metrics"].values():
            click.echo(f"  {m['verdict']}")
    click.echo(f"wrote replicates.json{' and noise-floor.png/.pdf' if figures else ''} to {out_dir}")
