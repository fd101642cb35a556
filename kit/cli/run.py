"""`kit run`: an arm locally, in its container or on a Ray cluster, with sealed evidence."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.cli.plan import arm_selection_options, select_arm
from kit.model.engine_traits import traits
from kit.model.errors import BadInput
from kit.run.request import RunRequest, check_workspace
from kit.run.plan import TopologyOverrides
from kit.run.attach import attach
from kit.run.execute import execute
from kit.model.documents import read_json_file
from kit.run.replicates import parse_seeds, run_replicates
from kit.evidence.claims import read_sealed_claim
from kit.run.claimed import run_claim


def default_workspace() -> Path:
    return Path(os.environ.get("KIT_WORKSPACE") or ".workspace")


def workspace_from(flag: Path | None) -> Path:
    """--workspace, else $KIT_WORKSPACE, else ./.workspace; a file there is bad input naming its source."""

    if flag is not None:
        check_workspace(flag, "--workspace")
        return flag
    path = default_workspace()
    check_workspace(path, "KIT_WORKSPACE" if os.environ.get("KIT_WORKSPACE") else "the default ./.workspace")
    return path


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@arm_selection_options
@click.option("--runtime", type=click.Choice(["local", "docker", "ray"]),
              help="local: the smoke workload in this process (default for smoke arms); docker: the arm's image with a "
                   "Ray head inside (default for VIME arms); ray: an existing cluster at --ray-address.")
@click.option("--image", metavar="REF", help="docker: the image (default: the one labelled with the arm's stack sha256).")
@click.option("--ray-address", metavar="URL", help="ray: the cluster's dashboard URL, e.g. http://head:8265.")
@click.option("--ray-head", is_flag=True,
              help="local: run the smoke arm as a Ray job (driver, rollout and trainer actors) on a Ray head the kit "
                   "starts on this host and stops after the run.")
@click.option("--model", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="VIME arms: the Hugging Face checkpoint directory (mounted read-only, hashed per file). "
                   "Default: the model the workspace's converted checkpoint for this stack came from.")
@click.option("--checkpoint", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="VIME arms: the torch_dist checkpoint, mounted read-only. Default: the one kit prepare "
                   "--convert-checkpoint wrote into the workspace for this arm's stack.")
@click.option("--prompt-data", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="VIME arms: the prompt JSONL (default: <workspace>/data/dapo-math-17k.jsonl from kit prepare).")
@click.option("--network", metavar="NAME",
              help="docker: a named Docker network for the container, its dashboard published on 127.0.0.1 "
                   "(default: the host network, Ray on free ports).")
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Workspace root; runs go to <workspace>/runs/<run-id> (default $KIT_WORKSPACE, else ./.workspace).")
@click.option("--run-id", help="Run id (default <arm>-n<rollouts>-s<seed>-<UTC time>); never reusable.")
@click.option("--rollouts", type=int, help="Number of rollouts (steps); default from the arm.")
@click.option("--seeds", metavar="S1,S2,...", help="Replicates: one sealed run per seed (workload and rollout seed), "
              "ids <group>-s<seed>, grouped in <workspace>/groups/<group>.json.")
@click.option("--wait/--detach", default=True, show_default=True,
              help="Follow the job to its end and seal (default), or submit and return (ray runtime only; "
                   "status detached until kit run --attach RUN_DIR).")
@click.option("--attach", "attach_dir", type=click.Path(path_type=Path), metavar="RUN_DIR",
              help="Finish a run started with --detach: follow its Ray job by submission id, stream the log into "
                   "run.log, then collect, validate and seal as a waited run does. Takes only --sign-key and --json.")
@click.option("--dry-run", is_flag=True, help="Print the plan and the manifest preview; create nothing.")
@click.option("--allow-dirty", is_flag=True, help="Run from a kit checkout with uncommitted changes (recorded; not for published evidence).")
@click.option("--sign-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Private key that signs the seal and the run's in-toto attestation (and, for ECDSA P-256, its model-signing model.sig): ECDSA P-256 or ed25519 PEM, or 32 raw ed25519 bytes (kit keys new makes one).")
@click.option("--claim", "claim_file", type=click.Path(path_type=Path, dir_okay=False), metavar="SEALED",
              help="Make the runs a sealed claim declares (kit claim seal), each under its declared id, arm, seed and "
                   "rollouts, with the claim's sha256 in its sealed manifest; runs already made are not made again.")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/run-status/v1 document (dry run: rlk-kit/run-dry-run/v1); no progress.")
def command(arm_ref, mode, tp_size, cp_size, rollout_tp_size, rollout_cp_size, runtime, image, ray_address, ray_head, model, checkpoint, prompt_data, network,
            workspace, run_id, rollouts, seeds, wait, attach_dir, dry_run, allow_dirty, sign_key, claim_file, as_json):
    """Run an arm and seal its evidence: plan → preflight → start → stream → collect → validate → seal.

    The run dir <workspace>/runs/<run-id>/ gets manifest.json, arm.json, run.log (the job's own
    output after one identity header line), kit.log, metrics.jsonl, validation.json, status.json
    and, last, seal.json. Exit 0 sealed with every gate passed, 1 a job or gate failed (no seal
    when the job failed), 2 bad input (a used run id, a VIME arm on --runtime local), 130 stopped
    by Ctrl-C or SIGTERM (partial evidence kept, no seal).

    \b
    Examples:
      kit run --arm smoke                                     # in-process, sealed
      kit run --arm smoke --mode native --rollouts 5          # all operators P/P
      kit run --arm smoke --seeds 1,2,3 --rollouts 5          # three sealed replicates, grouped
      kit run --arm smoke --ray-head                          # as a Ray job on a local head the kit starts and stops
      kit run --arm smoke --runtime docker                    # the CPU smoke image
      kit run --arm smoke --runtime ray --ray-address http://head:8265
      kit run --arm smoke --runtime ray --ray-address http://head:8265 --detach --run-id r7
      kit run --attach .workspace/runs/r7                     # follow r7's job, then validate and seal
      kit run --arm G10 --dry-run --json                      # the plan, nothing created
      kit run --claim smoke-mismatch.sealed.json              # the runs a sealed claim declares, bound to it
      kit verify .workspace/runs/<run-id>
    """

    log = (lambda s: None) if as_json else (lambda s: click.echo(f"kit: {s}", err=True))
    if attach_dir is not None:
        given = {"--arm": arm_ref, "--mode": mode, "--tp-size": tp_size, "--cp-size": cp_size,
                 "--rollout-tp-size": rollout_tp_size, "--rollout-cp-size": rollout_cp_size, "--runtime": runtime,
                 "--image": image, "--ray-address": ray_address, "--ray-head": ray_head, "--model": model,
                 "--checkpoint": checkpoint, "--prompt-data": prompt_data, "--network": network,
                 "--workspace": workspace, "--run-id": run_id, "--rollouts": rollouts, "--detach": not wait,
                 "--dry-run": dry_run, "--allow-dirty": allow_dirty, "--seeds": seeds}
        extra = [flag for flag, value in given.items() if value not in (None, False)]
        if extra:
            raise BadInput(f"--attach RUN_DIR takes only --sign-key and --json; drop {', '.join(extra)} "
                           "(the run dir's manifest says what runs)")
        _report(attach(attach_dir, sign_key=sign_key, progress=None if as_json else sys.stderr, log=log), as_json)
        return
    if claim_file is not None:
        _run_claim(claim_file, locals(), as_json, log)
        return
    arm = select_arm(arm_ref, mode)
    request = RunRequest(arm=arm, workspace=workspace_from(workspace),
                         overrides=TopologyOverrides(tp_size, cp_size, rollout_tp_size, rollout_cp_size),
                         runtime=runtime or ("local" if traits(arm.engine).runs_on_host else "docker"), image=image, ray_address=ray_address, network=network, run_id=run_id, ray_head=ray_head, model=model, checkpoint=checkpoint, prompt_data=prompt_data,
                         rollouts=rollouts, detach=not wait, dry_run=dry_run, allow_dirty=allow_dirty, sign_key=sign_key)
    if seeds is not None:

        group = run_replicates(request, parse_seeds(seeds), execute, progress=None if as_json else sys.stderr, log=log)
        emit_json(group) if as_json else click.echo("\n".join(
            [f"replicate group {group['group']} ({group['arm']}):"]
            + [f"  seed {r['seed']}: {r['status']}{', sealed' if r['sealed'] else ''}  {r['run_dir']}" for r in group["runs"]]))
        raise SystemExit(max(r["exit_code"] for r in group["runs"]))
    outcome = execute(request, progress=None if as_json else sys.stderr, log=log)
    if outcome.document is not None:
        if as_json:
            emit_json(outcome.document)
        else:
            _print_dry_run(outcome.document)
        return
    _report(outcome, as_json)


def _run_claim(claim_file: Path, given: dict, as_json: bool, log) -> None:
    """kit run --claim SEALED: every declared run not yet made (kit.run.claimed)."""
    fixed = {"--arm": "arm_ref", "--mode": "mode", "--run-id": "run_id", "--rollouts": "rollouts", "--seeds": "seeds",
             "--dry-run": "dry_run", "--detach": "wait", "--attach": "attach_dir"}
    extra = [flag for flag, name in fixed.items() if (given[name] is False if name == "wait" else given[name] not in (None, False))]
    if extra:
        raise BadInput(f"--claim fixes the arms, seeds, rollouts and run ids; drop {', '.join(extra)}")
    claim = read_sealed_claim(claim_file, "--claim")
    request = RunRequest(arm=None, workspace=workspace_from(given["workspace"]),
                         runtime=given["runtime"], image=given["image"], ray_address=given["ray_address"],
                         network=given["network"], ray_head=given["ray_head"], model=given["model"],
                         checkpoint=given["checkpoint"], prompt_data=given["prompt_data"],
                         allow_dirty=given["allow_dirty"], sign_key=given["sign_key"])
    runs = run_claim(claim, request, execute, select_arm, progress=None if as_json else sys.stderr, log=log)
    if as_json:
        emit_json({"schema": "rlk-kit/claim-runs/v1", "claim": claim.name, "claim_sha256": claim.sha256, "runs": runs})
    else:
        click.echo(f"claim {claim.name} ({claim.sha256[:16]}…):")
        for r in runs:
            click.echo(f"  {r['role']:<9} seed {r['seed']}: {r['status']}  {r['run_dir']}")
        click.echo(f"next: kit claim evaluate {claim_file}")
    raise SystemExit(max([r["exit_code"] for r in runs] or [0]))


def _report(outcome, as_json: bool) -> None:
    if outcome.run_dir is None:
        # Stopped before a run dir existed (a signal during preflight): there is no status to show.
        click.echo(f"kit: run {outcome.run_id}: {outcome.message or outcome.status}", err=True)
        raise click.exceptions.Exit(outcome.exit_code)
    status_doc = _status_document(outcome)
    if as_json:
        emit_json(status_doc)
    else:
        _print_summary(outcome)
    if outcome.exit_code:
        raise click.exceptions.Exit(outcome.exit_code)


def _status_document(outcome) -> dict:

    return read_json_file(outcome.run_dir / "status.json")


def _fmt(value, spec="") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _print_summary(outcome) -> None:
    if outcome.status == "detached":
        rows = [("run", outcome.run_id), ("status", f"detached (job {outcome.job_status})"),
                ("run dir", f"{outcome.run_dir} (not sealed until attached)"),
                ("finish with", f"kit run --attach {outcome.run_dir}")]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            click.echo(f"{key:<{width}}  {value}")
        return
    s = (outcome.validation or {}).get("summary", {})
    rows = [
        ("run", outcome.run_id),
        ("status", outcome.status + (f" ({outcome.message})" if outcome.message else "")),
        ("steps", f"{_fmt(s.get('steps_observed'))} of {_fmt(s.get('steps_expected'))}"),
        ("reward (last)", _fmt(s.get("last_reward"), ".4f")),
        ("mismatched tokens (all steps)", _fmt(s.get("mismatch_count_total"), "g")),
        ("mismatched tokens (last step)", _fmt(s.get("mismatch_count_last"), "g")),
        ("max |Δlogp|", _fmt(s.get("max_abs_dlogp"), "g")),
        ("step time", f"{_fmt(s.get('mean_step_time_s'), '.3f')} s" if s.get("mean_step_time_s") is not None else "-"),
        ("gates", "passed" if (outcome.validation or {}).get("passed") else
         "failed: " + ", ".join(g["id"] for g in (outcome.validation or {}).get("gates", []) if g["status"] == "failed")),
    ]
    if outcome.sealed:
        rows.append(("sealed", f"{outcome.run_dir} (root {outcome.seal['root_sha256'][:16]}…)"))
    else:
        rows.append(("not sealed", str(outcome.run_dir)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")


def _print_dry_run(doc: dict) -> None:
    plan = doc["plan"]
    click.echo(f"dry run: nothing created; the run dir would be {doc['run_dir']} ({doc['runtime']} runtime)")
    click.echo(f"arm {plan['arm']['name']} on stack {plan['stack']['name']} ({plan['stack']['sha256'][:12]}), "
               f"ray job {plan['ray_job']['submission_id']}")
    click.echo("command:")
    click.echo("  " + plan["command"]["shell"])
    failed = [c for c in doc["checks"] if c["status"] == "FAIL"]
    click.echo("needs:")
    for check in doc["checks"]:
        click.echo(f"  {check['status']} {check['name']}: {check['reason']}")
    click.echo("ready: yes, every input is there" if not failed else
               f"ready: no, kit run would refuse: {len(failed)} of {len(doc['checks'])} not ready (kit doctor --arm "
               f"{plan['arm']['name']} checks the host too)")
