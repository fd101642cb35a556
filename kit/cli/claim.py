"""`kit claim seal|evaluate`: a test declared and sealed before its runs, then evaluated exactly as declared."""

from __future__ import annotations

import os
from pathlib import Path

import click

from kit.analysis.claims import evaluate_claim

from kit.cli._output import emit_json
from kit.cli.plan import select_arm
from kit.evidence.claims import (SUPPORTED, claim_criteria, paths_relative_to, read_sealed_claim, rule_text, seal_claim,
                                 seal_verdict)
from kit.evidence.signing import load_private_key
from kit.model.documents import read_json_file, write_new_document
from kit.model.errors import BadInput, KitError
from kit.run.claimed import resolved_arm
from kit.run.request import check_workspace

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Declare a test before its runs (seal), bind runs to it (kit run --claim), evaluate it.

    \b
    Examples:
      kit claim seal manifests/claims/smoke-mismatch.json --out smoke-mismatch.sealed.json
      kit claim evaluate --help
    """


def _default_out(path: Path, suffix: str) -> Path:
    stem = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    stem = stem[:-len(".sealed")] if stem.endswith(".sealed") else stem
    return path.with_name(f"{stem}{suffix}")


@command.command("seal", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("claim_file", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Where the sealed claim goes (default FILE's name with .sealed.json); never overwritten.")
@click.option("--sign-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Private key that signs the sealed claim (ECDSA P-256 or ed25519 PEM; kit keys new makes one).")
@click.option("--json", "as_json", is_flag=True, help="Print the sealed claim document (the version FILE has).")
def seal(claim_file: Path, out: Path | None, sign_key: Path | None, as_json: bool):
    """Seal a claim (rlk-kit/claim/v2 with its criteria, or v1 with one metric and rule; the sealed file keeps
    FILE's version) before any of its runs: each arm resolved to its name and seed-free sha256, the declared
    runs (arm x seed) named, the sha256 of it all recorded (and signed with --sign-key).
    Runs made with kit run --claim SEALED carry that sha256 in their sealed manifest.
    Exit 0 sealed, 1 a given arm sha256 no longer matches the catalog, 2 bad input.

    \b
    Examples:
      kit claim seal manifests/claims/smoke-mismatch.json --out smoke-mismatch.sealed.json
      kit run --claim smoke-mismatch.sealed.json
    """
    try:
        doc = read_json_file(claim_file)
    except KitError as exc:
        raise BadInput(f"FILE {exc}") from None
    key = load_private_key(sign_key) if sign_key else None
    try:
        sealed = seal_claim(doc, lambda entry, rollouts: resolved_arm(select_arm(entry["arm"], entry.get("mode")), rollouts),
                            key)
    except KitError as exc:       # the rules name "claim"; the user named a file
        raise type(exc)(f"FILE {claim_file}: {str(exc).removeprefix('claim: ')}") from None
    out = out or _default_out(claim_file, ".sealed.json")
    if out.exists():
        raise BadInput(f"--out {out}: exists; a sealed claim is never overwritten, give another --out")
    write_new_document(out, sealed, expected=sealed["schema"])
    if as_json:
        emit_json(sealed)
        return
    click.echo(f"sealed claim {sealed['name']}  {out}")
    click.echo(f"claim sha256 {sealed['sealed']['claim_sha256']}")
    for role in ("reference", "treatment"):
        arm = sealed["arms"][role]
        click.echo(f"{role:<12} {arm['name']} ({arm['sha256'][:16]}…)")
    click.echo(f"runs         {', '.join(r['run_id'] for r in sealed['runs'])}")
    for criterion in claim_criteria(sealed):
        click.echo(f"criterion    {criterion['name']}: {rule_text(criterion['rule'], criterion['metric'])}")
    click.echo(f"next         kit run --claim {out}")


@command.command("evaluate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("sealed_file", metavar="SEALED", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Where the sealed verdict goes (default SEALED's name with .verdict.json); never overwritten.")
@click.option("--workspace", type=click.Path(path_type=Path, file_okay=False),
              help="Where bound runs are looked for (default $KIT_WORKSPACE, else ./.workspace).")
@click.option("--sign-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Private key that signs the verdict.")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/claim-verdict/v2 document.")
def evaluate(sealed_file: Path, runs: tuple[Path, ...], out: Path | None, workspace: Path | None,
             sign_key: Path | None, as_json: bool):
    """Evaluate a sealed claim exactly as it declared: every criterion's metric, window, length control,
    bootstrap and rule (none can be changed here), over its declared runs, each re-verified; supported only
    when every criterion is, not supported when any is not. RUNS are run dirs (default:
    every run in the workspace bound to the claim); a run not bound to the claim, or of another arm, seed
    or rollout count, is named and refused; a declared run missing, failed or refused makes the verdict
    incomplete. Writes a sealed verdict (supported, not supported, inconclusive or incomplete) that
    kit verify checks. Exit 0 supported, 1 any other verdict, 2 bad input.

    \b
    Examples:
      kit claim evaluate smoke-mismatch.sealed.json --out smoke-mismatch.verdict.json
      kit verify smoke-mismatch.verdict.json
      kit report smoke-mismatch.verdict.json --out report
    """

    claim = read_sealed_claim(sealed_file, "SEALED")
    out = out or _default_out(sealed_file, ".verdict.json")
    if out.exists():
        raise BadInput(f"--out {out}: exists; a verdict is never overwritten, give another --out")
    for run in runs:
        if not run.is_dir():
            raise BadInput(f"RUNS {run}: not a run directory; give <workspace>/runs/<run-id>")
    key = load_private_key(sign_key) if sign_key else None
    if workspace is None:
        workspace = Path(os.environ.get("KIT_WORKSPACE") or ".workspace")
    check_workspace(workspace)
    doc = seal_verdict(paths_relative_to(evaluate_claim(claim, list(runs), workspace), out.parent), key)
    write_new_document(out, doc, expected=doc["schema"])
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"claim {claim.name}: {doc['verdict'].upper()}")
        click.echo(f"  hypothesis  {claim.hypothesis}")
        for c in doc["criteria"]:
            click.echo(f"  criterion   {c['name']}: {c['verdict'].upper()}")
            click.echo(f"    rule      {c['rule_text']}")
        for reason in doc["reasons"]:
            click.echo(f"  because     {reason}")
        counted = sum(r["status"] == "counted" for r in doc["runs"])
        click.echo(f"  runs        {counted} of {len(doc['runs'])} declared counted, {len(doc['refused'])} refused")
        if doc["identity"]["scope"]:
            click.echo(f"  identity    {doc['identity']['scope']}")
        click.echo(f"  verdict     {out} (kit verify {out})")
    raise SystemExit(0 if doc["verdict"] == SUPPORTED else 1)
