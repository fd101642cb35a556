"""`kit build`: build the pinned image of a stack for cuda, rocm or cpu."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from kit.adapters.docker import engine
from kit.build.images import build_image, plan_build, write_build_record
from kit.build.recheck import check_reproducible
from kit.build.sources import parse_source_overrides
from kit.evidence.provenance_signature import sign_provenance
from kit.evidence.signing import load_private_key
from kit.model.catalog import Catalog
from kit.model.documents import dumps_pretty, require_valid
from kit.model.errors import BadInput, CheckFailed


def default_workspace() -> Path:
    return Path(os.environ.get("KIT_WORKSPACE") or "./.workspace")


@click.command(name="build")
@click.argument("platform", type=click.Choice(["cuda", "rocm", "cpu", "cuda-debian"]))
@click.option("--arm", help="Build the stack this arm names (e.g. smoke, G10).")
@click.option("--stack", "stack_name", help="Build this stack (e.g. vime-g11).")
@click.option("--source", "sources", multiple=True, metavar="NAME=PATH",
              help="Take a source from a local checkout or bare repository; its HEAD must be the pin.")
@click.option("--sources", "sources_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Local source cache (git archive tarballs NAME-*.tar.gz or checkouts NAME/; default $KIT_SOURCES): "
                   "every source's commit and tree is checked there before anything is built.")
@click.option("--wheelhouse", "wheel_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="cuda-debian: a directory of locked wheels (default $KIT_WHEELHOUSE, ':'-separated); each file is "
                   "checked by sha256 and served to the build; missing ones are downloaded into the workspace.")
@click.option("--no-cache", is_flag=True, help="Ignore the engine's build cache.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (Dockerfile, build args, labels, context); no engine. Exit 1 if it lists problems.")
@click.option("--check-reproducible", "check_repro", is_flag=True,
              help="Build a second time in a scratch workspace (no cache, other umask and TZ) and compare the "
                   "images layer by layer; exit 1 naming the first differing layer and files.")
@click.option("--sign-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Private key (ECDSA P-256 or ed25519; kit keys new): sign the build provenance (a DSSE envelope next to it, .dsse.json).")
@click.option("--json", "as_json", is_flag=True, help="Machine output: the plan or the build record.")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Where sources, wheelhouses and build records go (default $KIT_WORKSPACE or ./.workspace).")
def command(platform, arm, stack_name, sources, sources_dir, wheel_dirs, no_cache, dry_run, check_repro, sign_key,
            as_json, workspace):
    """Build the image of a stack: sources at their pins, packages at exact versions, labels, probe.

    \b
    Examples:
      kit build cpu --arm smoke                          # the CPU smoke image (fixture sources)
      kit build cpu --arm smoke --source vime=../vime    # a local checkout at the pinned commit
      kit build cuda --arm G11 --dry-run --json          # the plan, without an engine
      kit build rocm --stack vime-g11 --dry-run          # exit 1 until a ROCm lock exists (its torch index: kit lock)
      kit build cpu --arm smoke --check-reproducible     # rebuild elsewhere, same image id or exit 1
      kit build cpu --arm smoke --sign-key build.key     # provenance signed (DSSE)
      kit build cuda --arm G11 --sources /work/shared/sources   # sources checked before any layer
      kit build cuda-debian --stack vime-base-debian --sources /work/shared/sources --wheelhouse /cache/wh
    """

    if bool(arm) == bool(stack_name):
        raise BadInput("give exactly one of --arm NAME or --stack NAME")
    catalog = Catalog.default()
    stack = catalog.arm_ref(arm).stack if arm else catalog.stack(stack_name)
    if stack.abstract:
        raise BadInput(f"stack {stack.name!r} is abstract (a shared layer); build a stack that extends it")
    workspace = (workspace or default_workspace()).resolve()
    overrides = parse_source_overrides(sources)
    t0 = time.monotonic()
    sources_dir = sources_dir or (Path(os.environ["KIT_SOURCES"]) if os.environ.get("KIT_SOURCES") else None)
    if sources_dir is not None and not sources_dir.is_dir():
        raise BadInput(f"--sources {sources_dir}: no such directory")
    private_key = load_private_key(sign_key) if sign_key else None   # a bad key is bad input before any build
    progress = None if as_json else _progress_printer()
    plan = plan_build(stack, platform, workspace=workspace, overrides=overrides, dry_run=dry_run,
                      sources_dir=sources_dir, wheel_dirs=list(wheel_dirs),
                      progress=(lambda text: progress(0, 0, time.monotonic() - t0, text)) if progress else None)
    if dry_run:
        if as_json:
            click.echo(dumps_pretty(require_valid(plan.to_json(), "build plan", "build-plan")), nl=False)
        else:
            _print_plan(plan)
        if plan.problems:
            raise CheckFailed(f"the plan for {plan.tag} lists {len(plan.problems)} problem(s); a build would fail: "
                              + "; ".join(plan.problems))
        return
    result = build_image(plan, workspace=workspace, nocache=no_cache, progress=progress, arm=arm,
                         sources_from=_sources_from(stack, overrides, workspace), plan_s=time.monotonic() - t0)
    if private_key is not None:
        _sign_provenance(result, private_key, progress)
    if check_repro:
        _check_reproducible(result, stack, platform, overrides, workspace, progress, sources_dir, list(wheel_dirs))
    if as_json:
        click.echo(dumps_pretty(result.record), nl=False)
    else:
        sys.stderr.write("\n")
        if result.reused:
            state = "cache hit: the tag holds an image of these inputs, nothing sent to the engine"
        else:
            state = "cache hit" if result.cached else "built"
        click.echo(f"{result.tag}  {result.image_id}  ({state}, {result.durations_s['total']:.1f} s)")
        click.echo(f"build record: {result.record_path}")
    check = result.record.get("reproducibility_check")
    if check and not check["same"]:
        raise CheckFailed(_difference_text(result.tag, check))


def _sign_provenance(result, private_key, progress) -> None:
    path = Path(result.record.get("provenance", {}).get("path") or "")
    if not path.is_file():
        raise CheckFailed(f"--sign-key: no provenance of {result.tag} in this workspace's builds/ (reused from "
                          "another workspace, or the build record says why none was written); build it here to sign it")
    envelope = sign_provenance(path, private_key)
    if progress:
        sys.stderr.write(f"provenance signed: {envelope}\n")


def _check_reproducible(result, stack, platform, overrides, workspace, progress, sources_dir=None,
                        wheel_dirs=None) -> None:
    """Second build in a scratch workspace; its verdict goes into the build record (rewritten as a new record)."""

    if progress:
        sys.stderr.write("check-reproducible: second build in a scratch workspace (no cache, umask 0027, "
                         "TZ Pacific/Chatham)\n")
    report = check_reproducible(lambda ws: plan_build(stack, platform, workspace=ws, overrides=overrides,
                                                      sources_dir=sources_dir, wheel_dirs=wheel_dirs),
                                result, workspace=workspace, client=_client(), progress=progress)
    result.record["reproducibility_check"] = report
    result.record_path = write_build_record(result.record, workspace)


def _client():

    return engine()


def _difference_text(tag: str, check: dict) -> str:
    diff = check.get("difference") or {}
    lines = [f"{tag} is not reproducible: the second build gave {check['second_image_id']}; "
             f"first differing layer {diff.get('layer')} ({diff.get('first')} against {diff.get('second')})"]
    if diff.get("note"):
        lines.append(f"  {diff['note']}")
    for item in diff.get("files", [])[:10]:
        a, b = item["first"] or {}, item["second"] or {}
        lines.append(f"  {item['path']}: size {a.get('size')} / {b.get('size')}, mode {a.get('mode')} / {b.get('mode')}, "
                     f"mtime {a.get('mtime')} / {b.get('mtime')}, sha256 {str(a.get('sha256'))[:16]} / "
                     f"{str(b.get('sha256'))[:16]}")
    return "\n".join(lines)


def _sources_from(stack, overrides, workspace) -> dict[str, str]:
    out = {}
    for src in stack.sources:
        name = src["name"]
        if name in overrides:
            out[name] = str(overrides[name].resolve())
        elif src["repository"].startswith("fixture:"):
            out[name] = src["repository"]
        else:
            out[name] = src["repository"]
    return out


def _progress_printer():
    last = {"step": 0}

    def show(step, total, elapsed, text):
        # One line per step on stderr: "[3/14  12.4 s] RUN /opt/rlk/bin/install-source ..."
        if step != last["step"] or step == 0:   # step 0: the kit's own work after the engine's steps
            last["step"] = step
            where = f"{step}/{total}" if step else "kit"
            sys.stderr.write(f"[{where} {elapsed:6.1f} s] {text[:100]}\n")
            sys.stderr.flush()

    return show


def _print_plan(plan) -> None:
    doc = plan.to_json()
    click.echo(f"platform    {doc['platform']}")
    click.echo(f"stack       {doc['stack']['name']}  sha256 {doc['stack']['sha256']}")
    click.echo(f"dockerfile  {doc['dockerfile']}")
    base = doc["base_image"]
    click.echo(f"base        {base['ref']}" + ("  (UNRESOLVED: tag, not digest)" if base["unresolved"] else ""))
    click.echo(f"tag         {doc['tag']}")
    click.echo(f"inputs      sha256 {doc['inputs_sha256']}")
    click.echo("build args:")
    for k, v in doc["build_args"].items():
        click.echo(f"  {k}={v}")
    click.echo("labels:")
    for k, v in doc["labels"].items():
        click.echo(f"  {k}={v}")
    click.echo(f"context ({len(doc['context'])} files):")
    for e in doc["context"]:
        click.echo(f"  {e['mode']} {e['digest'][:24]:24} {e['path']}")
    for n in doc["notes"]:
        click.echo(f"note: {n}")
    for p in doc["problems"]:
        click.echo(f"problem: {p}")
