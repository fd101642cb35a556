"""``kit reproduce RUN_DIR``: re-run a sealed run from its manifest and compare its records bitwise."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.cli.run import workspace_from
from kit.run.execute import RunRequest, execute
from kit.run.reproduce import reproduce


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Workspace of the reproduction (default $KIT_WORKSPACE, else ./.workspace).")
@click.option("--allow-dirty", is_flag=True, help="Run from a kit checkout with uncommitted changes (recorded).")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/reproduction/v1 report.")
def command(run_dir, workspace, allow_dirty, as_json):
    """Re-run a sealed run (same arm, seeds, stack, runtime, image) as a new sealed run that names the
    original in its kit.log, then compare every per-step record value (log-prob statistics included,
    wall-clock perf/* excluded) bit for bit. Exit 0 bitwise reproduced, 1 diverged (the first step and
    field are named), 2 bad input. The report goes to <workspace>/reproductions/<run id>.json.

    \b
    Example:
      kit reproduce .workspace/runs/smoke-consistency-n10-s1234-20261204T050000Z
    """

    log = (lambda s: None) if as_json else (lambda s: click.echo(f"kit: {s}", err=True))
    report = reproduce(run_dir, workspace_from(workspace), execute, RunRequest,
                       progress=None if as_json else sys.stderr, log=log, allow_dirty=allow_dirty)
    if as_json:
        emit_json(report)
    else:
        click.echo(f"{report['verdict']} ({report['compared_values']} values compared; "
                   f"reproduction {report['reproduction']['run_dir']})")
    raise SystemExit(0 if report["reproduced"] else 1)
