"""`kit doctor`: preflight the host for an arm; prints PASS/FAIL/SKIP per check, exit 1 on any FAIL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kit.model.errors import CheckFailed
from kit.cli.run import workspace_from
from kit.run.doctor import Context, load_arm, run_doctor
from kit.model.documents import require_valid


@click.command(name="doctor")
@click.option("--arm", "arm_name", metavar="A", help="Arm from manifests/ to check the host against.")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace with the prepared inputs (default $KIT_WORKSPACE, else ./.workspace, as kit run).")
@click.option("--ray-address", envvar="RAY_ADDRESS", metavar="URL",
              help="Ray dashboard/Jobs API address of an existing cluster (default: env RAY_ADDRESS).")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/doctor/v1 document.")
def command(arm_name, workspace, ray_address, as_json):
    """Check the Docker engine, GPU runtime and GPUs, /dev/shm, disk, Ray, the arm's image and inputs.

    \b
    Inputs (vime arms, in the workspace): the prompt data against their
    provenance and the published hash; the Hugging Face model the workspace's
    provenance names (the one the arm's checkpoint was converted from),
    re-hashed file by file (cached by path, size and mtime in
    cache/hashes.json) and compared; the torch_dist checkpoint converted with
    the arm's stack (full stack sha256; the host's platform, then the newest).

    The engine's images of the arm's stack built from other inputs (earlier
    revisions of the stack or the kit) are listed with the bytes only they
    hold and the command that removes them (`image.others`, never a FAIL).

    Each check prints `PASS|FAIL|SKIP <name>: <reason>`. Exit 1 if any check FAILs, else 0.
    Re-hashing a model or checkpoint reports files and bytes hashed on stderr (not with --json).

    \b
    Examples:
      kit doctor --arm smoke
      kit doctor --arm G10 --workspace /data/ws --ray-address http://127.0.0.1:8265
      kit doctor --arm G10 --json | jq '.checks[] | select(.status=="FAIL")'
    """

    arm = load_arm(arm_name) if arm_name else None
    # the workspace kit run and kit suite would read the inputs from, so a PASS here holds for them
    workspace = workspace_from(workspace).resolve()
    report = run_doctor(Context(arm=arm, workspace=workspace, ray_address=ray_address or None,
                                progress=None if as_json else sys.stderr))
    if as_json:
        doc = require_valid(report.to_json(), "doctor report", "rlk-kit/doctor/v1")
        click.echo(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        for check in report.checks:
            click.echo(check.line())
        click.echo(f"doctor: {'PASS' if report.passed else 'FAIL'}")
    if not report.passed:
        failed = [c.name for c in report.checks if c.status == "FAIL"]
        raise CheckFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
