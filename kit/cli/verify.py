"""`kit verify`: locks (stacks, arms, matrices), sealed run directories, images."""

from __future__ import annotations

from pathlib import Path

import click

from kit.adapters.docker import engine
from kit.build.image_imports import NEEDS_GPU, import_targets, run_import_checks
from kit.build.images import check_image, image_platform, image_stack_name, verify_image_by_probe
from kit.build.provenance_check import image_provenance_problems
from kit.cli._output import emit_json
from kit.cli.build import default_workspace
from kit.evidence.attestation import add_attestation_verdict, model_signature_verdict
from kit.evidence.audit import verify_run_dir, write_in_toto
from kit.evidence.bundle import SEAL
from kit.evidence.signing import ECDSA_P256, algorithm_of, load_public_key
from kit.evidence.verdict import FileVerdict
from kit.evidence.verify import verify_document_file
from kit.model.catalog import Catalog
from kit.model.documents import read_json_file
from kit.model.errors import BadInput, KitError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--image", "image", metavar="REF", help="Run the probe in a container of REF and compare it with a stack "
              "(--arm/--stack, else the one its dev.rlk-kit.stack.name label names).")
@click.option("--arm", "arm_name", metavar="A", help="With --image: the arm whose stack the image must hold.")
@click.option("--stack", "stack_name", metavar="S", help="With --image: the stack the image must hold.")
@click.option("--key", "public_key", type=click.Path(path_type=Path, dir_okay=False), help="Public key (ed25519 or ECDSA "
              "P-256, PEM) a run dir's seal, a build provenance or a --model-signature must be signed with.")
@click.option("--model-signature", "model_sig", metavar="SIG", type=click.Path(path_type=Path, dir_okay=False),
              help="Check the one directory PATH against this OpenSSF model-signing signature (model_signing sign key "
                   "or a signed run's model.sig); needs --key, an ECDSA P-256 public key.")
@click.option("--require-signature", is_flag=True, help="A run dir whose seal is unsigned fails (exit 1); with --key, "
              "only that key's signature passes.")
@click.option("--in-toto", "in_toto", type=click.Path(path_type=Path, dir_okay=False), help="Also write a run dir's seal as an in-toto v1 Statement to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/verification/v2 document.")
def command(paths, image, arm_name, stack_name, public_key, require_signature, model_sig, in_toto, as_json):
    """Check lock files, sealed run directories or an image.

    Files get schema validation plus the semantic rules (full 40-hex commits, exact versions,
    digests, topology, batch and KL rules, capture sizes, declared comparisons). Directories are
    run dirs: every artifact is re-hashed against the seal, the seal is cross-checked with
    validation.json, the manifest and status.json, and the verdict states its trust level
    (unsigned: integrity only; signed: by the key the seal embeds; trusted: by the --key given).
    A signed run's sealed in-toto attestation (attestation.dsse.json) and model-signing signature
    (model.sig) are held to the seal. --model-signature checks a directory the way model_signing
    verify key does. Every path gets its verdict; a bad one never stops the others. Exit 0 all valid, 1 any
    invalid, 2 any unreadable input or usage.

    \b
    Examples:
      kit verify manifests/*.json
      kit verify --json manifests/G10.json
      kit verify .workspace/runs/<run-id>
      kit verify --key seal.pub --require-signature .workspace/runs/r1
      kit verify --key seal.pub .workspace/builds/rlk-kit_smoke_cpu-0123456789ab.provenance.json
      kit verify --image rlk-kit/smoke:cpu-0123456789ab --arm smoke
      kit verify --image rlk-kit/smoke:cpu-0123456789ab     # the stack its label names
    """

    if not paths and not image:
        raise BadInput("give one or more PATHs (lock files or run dirs) or --image REF; see kit verify --help")
    key = load_public_key(public_key) if public_key is not None else None  # a bad --key is bad input before any verdict
    if model_sig is not None:
        return _verify_model_signature(paths, model_sig, public_key, key, as_json)
    verdicts: list[FileVerdict] = []
    for path in paths:
        try:
            if path.is_dir():
                verdicts.append(add_attestation_verdict(verify_run_dir(
                    path, public_key=public_key, require_signature=require_signature or public_key is not None), key))
            else:
                verdicts.append(verify_document_file(path, public_key=public_key, require_signature=require_signature))
        except (KitError, OSError, ValueError, RecursionError) as exc:   # one bad path never hides the others' verdicts
            verdicts.append(FileVerdict(str(path), status="unreadable", problems=[("", _one_line(exc))]))
    if in_toto is not None:
        _write_in_toto(verdicts, in_toto)
    if image:
        verdicts.append(_verify_image(image, arm_name, stack_name))
    passed = all(v.status == "ok" for v in verdicts)
    if as_json:
        emit_json({"schema": "rlk-kit/verification/v2", "passed": passed, "results": [v.to_json() for v in verdicts]})
    _report(verdicts, passed, as_json)


def _report(verdicts: list[FileVerdict], passed: bool, as_json: bool) -> None:
    if not as_json:
        for v in verdicts:
            label = {"ok": "OK  ", "fail": "FAIL", "unreadable": "FAIL"}[v.status]
            kind = f"{v.kind}, {v.trust}" if v.trust else v.kind
            click.echo(f"{label} {v.path}" + (f" ({kind})" if v.kind != "unknown" else ""))
            for pointer, message in v.problems:
                click.echo(f"     {pointer or '/'}: {message}")
            for note in v.notes:
                click.echo(f"     note: {note}")
    if any(v.status == "unreadable" for v in verdicts):
        raise click.exceptions.Exit(2)
    if not passed:
        raise click.exceptions.Exit(1)


def _write_in_toto(verdicts, out: Path) -> None:
    """The statement of the one run dir that verified (errors writing it are the flag's, exit 2)."""

    runs = [v for v in verdicts if v.kind == "run"]
    if len(runs) != 1:
        raise BadInput(f"--in-toto {out}: give exactly one run dir ({len(runs)} given)")
    if runs[0].status != "ok":
        runs[0].notes.append("no in-toto statement written: the run dir does not verify")
        return
    run_dir = Path(runs[0].path)   # seal v4: the statement is the run's sealed, signed attestation (verified above)
    write_in_toto(read_json_file(run_dir / SEAL), out, run_dir)
    runs[0].notes.append(f"in-toto statement written to {out}")


def _verify_model_signature(paths, signature: Path, public_key: Path | None, key, as_json: bool) -> None:
    """One directory against a model-signing bundle signed by --key; a run dir's seal is verified too, as
    without --key (its own signer's trust level stated): a model signature may be a second party's."""
    dirs = [p for p in paths if p.is_dir()]
    if len(paths) != 1 or len(dirs) != 1:
        raise BadInput(f"--model-signature {signature}: give exactly one directory PATH, the one it signs "
                       f"({len(paths)} path(s) given, {len(dirs)} a directory)")
    if key is None:
        raise BadInput(f"--model-signature {signature}: needs --key PUB, the ECDSA P-256 public key it was signed with "
                       "(a model-signing bundle in key mode names its key only by a hint)")
    if algorithm_of(key) != ECDSA_P256:
        raise BadInput(f"--key {public_key}: an ed25519 key; a model-signing signature in key mode is checked with "
                       "the ECDSA P-256 public key it was signed with")
    verdicts = [model_signature_verdict(dirs[0], signature, key)]
    if (dirs[0] / SEAL).exists():
        verdicts.insert(0, add_attestation_verdict(verify_run_dir(dirs[0])))
    passed = all(v.status == "ok" for v in verdicts)
    if as_json:
        emit_json({"schema": "rlk-kit/verification/v2", "passed": passed, "results": [v.to_json() for v in verdicts]})
    _report(verdicts, passed, as_json)


def _one_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if isinstance(exc, KitError) else f"{type(exc).__name__}: {text}"


def _verify_image(image: str, arm_name: str | None, stack_name: str | None):

    if arm_name and stack_name:
        raise BadInput("--image takes at most one of --arm A or --stack S (the stack the image must hold)")

    catalog = Catalog.default()
    from_label = None
    if not arm_name and not stack_name:
        # The image's own claim picks the stack; the catalog's current document of that name is
        # what it is held to, so a stack edited since the build shows up as differences.
        from_label = image_stack_name(image)
        if from_label not in catalog.stack_docs:
            raise BadInput(f"image {image!r}: its dev.rlk-kit.stack.name label names stack {from_label!r}, which "
                           f"{catalog.directory} does not hold (it has: {', '.join(sorted(catalog.stack_docs)) or 'none'}); "
                           "name the stack it must hold with --arm A or --stack S")
        stack_name = from_label
    stack = catalog.arm(arm_name).stack if arm_name else catalog.stack(stack_name)
    verdict = FileVerdict(f"image {image}", kind="image")
    if from_label:
        verdict.notes.append(f"no --arm/--stack given: checked against stack {from_label!r} from the image's "
                             f"dev.rlk-kit.stack.name label ({catalog.stack_docs[from_label][1]})")
    labels = check_image(image, stack)           # what the image claims
    probe = verify_image_by_probe(image, stack)  # what a container of it observes
    verdict.problems = [(f"label {name}", f"expected {want!r}, found {got!r}") for name, want, got in labels.differences]
    verdict.problems += [(f"probe {name}", f"expected {want!r}, observed {got!r}") for name, want, got in probe.differences]

    platform = image_platform(engine(), image)
    imports = run_import_checks(engine(), image, import_targets(stack.document, platform))
    verdict.problems += [(f"import {r['module']}", r["error"]) for r in imports if not r["ok"]]
    verdict.notes.append("imported in the image: " + ", ".join(f"{r['module']} ({r['seconds']:.1f} s)"
                                                                for r in imports if r["ok"]))
    if platform.startswith("cuda"):
        verdict.notes.append("not checked without a GPU: " + "; ".join(NEEDS_GPU))
    problems, notes = image_provenance_problems(engine(), image, default_workspace().resolve())
    verdict.problems += problems
    verdict.notes += notes
    verdict.status = "fail" if verdict.problems else "ok"
    verdict.notes.append(f"image id {labels.image_id}; stack {stack.name} ({stack.sha256[:12]})")
    return verdict
