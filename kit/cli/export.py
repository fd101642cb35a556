"""``kit export mlflow``: sealed runs into an MLflow tracking store, through MLflow's own client."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kit.cli._output import no_empty_paths
from kit.analysis.table import load_arms
from kit.export.mlflow_runs import SCHEMA, export_runs
from kit.model.documents import schema_problems


@click.group("export")
def command():
    """Export runs to other tools' stores.

    \b
    Example:
      kit export mlflow runs/g10-s1234 runs/g11-s1234
    """


@command.command("mlflow")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...", callback=no_empty_paths)
@click.option("--tracking-uri", default=None, metavar="URI",
              help="Any MLflow tracking URI (default: sqlite:///mlflow.db in the current directory).")
@click.option("--artifacts", "artifact_root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Artifact folder of a new experiment (default: ./mlartifacts beside a default store; "
                   "MLflow's default otherwise).")
@click.option("--experiment", default="rlk-kit", show_default=True, help="MLflow experiment name.")
@click.option("--figures", "figures_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A kit analyze --out folder whose PNG/PDF figures are logged as artifacts of every run.")
@click.option("--name", "names", multiple=True, metavar="NAME", help="Arm name for each input, in order.")
@click.option("--json", "as_json", is_flag=True, help="Print the export-mlflow/v2 document.")
def mlflow_command(runs, tracking_uri, artifact_root, experiment, figures_dir, names, as_json):
    """One MLflow run per kit run: params (arm, stack hash, image digest, topology, seeds), every
    per-step metric, tags (trust level, controlled-comparison verdict against the first run) and the
    manifest, seal, validation, log and figures as artifacts. The run directories are only read.
    A kit run already in the experiment (the same kit.run_id and kit.seal_sha256 tags) is skipped,
    so exporting twice makes no duplicate; the same run id with another seal is refused (exit 1).
    A file store (file://… or a path) is allowed for this process although MLflow 3 deprecates it.

    \b
    Examples:
      kit export mlflow runs/g10 runs/g11 --figures report/perf
      kit export mlflow runs/g10 --tracking-uri http://mlflow:5000 --experiment vime --json
    """

    if tracking_uri is None:
        tracking_uri = f"sqlite:///{Path('mlflow.db').resolve()}"
        artifact_root = artifact_root or Path("mlartifacts")
    arms = load_arms([Path(r) for r in runs], names or None, None)
    progress = None if as_json else (lambda line: click.echo(f"kit: {line}", err=True))
    result = export_runs(arms, tracking_uri, experiment, figures_dir, artifact_root, progress)
    problems = schema_problems(result, "export-mlflow")
    if problems:
        raise click.ClickException(f"export document fails {SCHEMA}: {problems[0]}")
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    for run in result["runs"]:
        if run["action"] == "skipped":
            click.echo(f"{run['arm']}: already exported as MLflow run {run['mlflow_run_id']} "
                       f"(same kit run id and seal); skipped")
            continue
        click.echo(f"{run['arm']}: MLflow run {run['mlflow_run_id']} ({len(run['params'])} params, "
                   f"{run['metric_values']} metric values over {run['steps']} steps, {len(run['artifacts'])} artifacts; "
                   f"{run['tags']['kit.trust']}, {run['tags']['kit.comparison']})")
    click.echo(f"store: {tracking_uri}, experiment {experiment} ({result['experiment_id']})")
