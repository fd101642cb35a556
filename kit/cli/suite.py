"""`kit suite`: suites of arms run through `kit run`, summarised; `kit suite module` is the module matrix."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.model.documents import dumps_pretty, require_valid
from kit.run.replicates import parse_seeds, plan_seeded_suites, run_seeded_suites
from kit.cli.run import default_workspace
from kit.run.attribution import render_table
from kit.run.suite import SuiteRequest, plan_module_suite, run_module_suite


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True,
              help="Machine output for every suite command: print only its summary document "
                   "(rlk-kit/suite-summary/v1), no progress; the same as the command's own --json.")
@click.pass_context
def command(ctx, as_json):
    """Suites of arms, each run through `kit run` into its own sealed run dir, with one summary.

    \b
    Examples:
      kit suite module --suite-id m1 --rollouts 2 --stack smoke
      kit suite --json module --suite-id m2 --rollouts 2 --stack smoke | jq .arms
    """
    ctx.ensure_object(dict)["json"] = as_json


@command.command("module", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--suite-id", required=True, help="New suite id; its runs get the ids <suite-id>-<arm lower>. Never reusable.")
@click.option("--rollouts", required=True, type=int, help="Rollouts (steps) per arm, e.g. 8 as in reference §1.4.")
@click.option("--stack", metavar="S",
              help="The stack whose module-matrix base to run: smoke (smoke-M000..smoke-M111) or vime-current "
                   "(M000..M111). Required unless --runtime local, which runs only the smoke stack.")
@click.option("--runtime", type=click.Choice(["local", "docker", "ray"]),
              help="As in kit run; default local for the smoke stack, docker for VIME stacks.")
@click.option("--image", metavar="REF",
              help="docker: the image (default: the newest labelled with the stack sha256 and platform, as kit run).")
@click.option("--ray-address", metavar="URL", help="ray: the cluster's dashboard URL, e.g. http://head:8265.")
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Workspace root (default $KIT_WORKSPACE, else ./.workspace).")
@click.option("--allow-dirty", is_flag=True, help="Run from a kit checkout with uncommitted changes (recorded in each manifest).")
@click.option("--sign-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Private key (ECDSA P-256 or ed25519, kit keys new) that signs each run's seal and attestation.")
@click.option("--seeds", metavar="S1,S2,...",
              help="Replicates: the whole suite once per seed (suite ids <suite-id>-s<seed>, every arm's workload and "
                   "rollout seed set to it), each arm's runs grouped in <workspace>/groups/<suite-id>-<arm lower>.json.")
@click.option("--json", "as_json", is_flag=True,
              help="Print only the rlk-kit/suite-summary/v1 document, no progress (also `kit suite --json module`); "
                   "with --seeds a JSON array of them, one per seed.")
@click.pass_context
def module(ctx, suite_id, rollouts, stack, runtime, image, ray_address, workspace, allow_dirty, sign_key, seeds, as_json):
    """Run the module matrix M000, M100, M010, M001, M110, M101, M011, M111 and attribute mismatches.

    Each arm runs through kit run (same manifest, gates and seal) as run
    <workspace>/runs/<suite-id>-<arm lower>/, so `kit verify` checks it like
    any run. A failing arm is recorded and the next one runs. At the end
    <workspace>/suites/<suite-id>/summary.json (rlk-kit/suite-summary/v1)
    holds each arm's verdict, run dir, bitwise mismatch count (VIME's
    per-sample mean × global batch size, summed over steps), active tokens,
    max |Δlogp| and mean step time, and per module (attention, ffn, logp) the
    mismatch totals of its R/R and P/P arms, its marginal effect P/P → R/R in
    the four pairs holding the other modules fixed, which modules alone make
    the mismatch vanish and whether M111 is exactly zero.

    Exit 0 every arm passed its gates and sealed, 1 an arm failed, 2 bad input
    (an existing suite id, a run id already used, an unknown stack, no Docker
    engine, an absent --image, an unreachable --ray-address: nothing is
    written), 130 Ctrl-C or SIGTERM (the partial summary is written, marked
    interrupted). An image not built for the stack exits 1, also before
    anything is written. With --runtime docker every arm runs in the one
    image resolved at the start (by id).

    \b
    Examples:
      kit suite module --suite-id m1 --rollouts 2 --stack smoke            # CPU, in-process
      kit suite module --suite-id m4 --rollouts 2 --stack smoke --json     # only the summary document
      kit suite module --suite-id m2 --rollouts 8 --stack vime-current --runtime docker
      kit suite module --suite-id m3 --rollouts 8 --stack vime-current --runtime ray --ray-address http://head:8265
      kit suite module --suite-id m5 --rollouts 2 --stack smoke --seeds 1,2,3   # three suites, 8 groups
      kit verify .workspace/runs/m1-smoke-m111
    """
    as_json = as_json or bool((ctx.obj or {}).get("json"))

    request = SuiteRequest(suite_id=suite_id, rollouts=rollouts, workspace=workspace or default_workspace(), stack=stack,
                           runtime=runtime, image=image, ray_address=ray_address, allow_dirty=allow_dirty,
                           sign_key=sign_key)
    log = (lambda s: None) if as_json else (lambda s: click.echo(f"kit: {s}", err=True))
    if seeds is not None:
        _seeded(request, parse_seeds(seeds), as_json, log)
        return
    plan = plan_module_suite(request)
    summary, code = run_module_suite(plan, progress=None if as_json else sys.stderr, log=log)
    if as_json:
        emit_json(summary)
    else:
        click.echo(render_table(summary))
        click.echo(f"summary: {plan.suite_dir / 'summary.json'}")
    if code:
        raise click.exceptions.Exit(code)


def _seeded(request: SuiteRequest, seeds: list[int], as_json: bool, log) -> None:
    """kit suite module --seeds: every seed's suite planned (and refused) before the first runs."""
    plans = plan_seeded_suites(request, seeds, plan_module_suite)
    summaries, code = run_seeded_suites(request.suite_id, plans, seeds, run_module_suite,
                                        progress=None if as_json else sys.stderr, log=log)
    if as_json:
        for summary in summaries:
            require_valid(summary, "output document")
        click.echo(dumps_pretty(summaries), nl=False)
    else:
        for plan, summary in zip(plans, summaries):
            click.echo(render_table(summary))
            click.echo(f"summary: {plan.suite_dir / 'summary.json'}")
        groups = plans[0].workspace / "groups"
        click.echo(f"groups: {groups}/{request.suite_id}-<arm>.json (kit analyze replicates takes them)")
    if code:
        raise click.exceptions.Exit(code)
