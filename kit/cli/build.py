"""`kit build`: build the pinned image of a stack for cuda, rocm or cpu."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from kit.model.errors import BadInput, CheckFailed


def default_workspace() -> Path:
    return Path(os.environ.get("KIT_WORKSPACE") or "./.workspace")


@click.command(name="build")
@click.argument("platform", type=click.Choice(["cuda", "rocm", "cpu"]))
@click.option("--arm", help="Build the stack this arm names (e.g. smoke, G10).")
@click.option("--stack", "stack_name", help="Build this stack (e.g. vime-g11).")
@click.option("--source", "sources", multiple=True, metavar="NAME=PATH",
              help="Take a source from a local checkout or bare repository; its HEAD must be the pin.")
@click.option("--no-cache", is_flag=True, help="Ignore the engine's build cache.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (Dockerfile, build args, labels, context); no engine. Exit 1 if it lists problems.")
@click.option("--json", "as_json", is_flag=True, help="Machine output: the plan or the build record.")
@click.option("--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Where sources, wheelhouses and build records go (default $KIT_WORKSPACE or ./.workspace).")
def command(platform, arm, stack_name, sources, no_cache, dry_run, as_json, workspace):
    """Build the image of a stack: sources at their pins, packages at exact versions, labels, probe.

    \b
    Examples:
      kit build cpu --arm smoke                          # the CPU smoke image (fixture sources)
      kit build cpu --arm smoke --source vime=../vime    # a local checkout at the pinned commit
      kit build cuda --arm G10 --dry-run --json          # the plan, without an engine
      kit build rocm --stack vime-g11 --dry-run
    """
    from kit.build.sources import parse_source_overrides
    from kit.model.catalog import Catalog
    from kit.model.documents import dumps_pretty, require_valid
    from kit.build.images import build_image, plan_build

    if bool(arm) == bool(stack_name):
        raise BadInput("give exactly one of --arm NAME or --stack NAME")
    catalog = Catalog.default()
    stack = catalog.arm_ref(arm).stack if arm else catalog.stack(stack_name)
    if stack.abstract:
        raise BadInput(f"stack {stack.name!r} is abstract (a shared layer); build a stack that extends it")
    workspace = (workspace or default_workspace()).resolve()
    overrides = parse_source_overrides(sources)
    t0 = time.monotonic()
    plan = plan_build(stack, platform, workspace=workspace, overrides=overrides, dry_run=dry_run)
    if dry_run:
        if as_json:
            click.echo(dumps_pretty(require_valid(plan.to_json(), "build plan", "build-plan")), nl=False)
        else:
            _print_plan(plan)
        if plan.problems:
            raise CheckFailed(f"the plan for {plan.tag} lists {len(plan.problems)} problem(s); a build would fail: "
                              + "; ".join(plan.problems))
        return
    progress = None if as_json else _progress_printer()
    result = build_image(plan, workspace=workspace, nocache=no_cache, progress=progress, arm=arm,
                         sources_from=_sources_from(stack, overrides, workspace), plan_s=time.monotonic() - t0)
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
        if step != last["step"]:
            last["step"] = step
            sys.stderr.write(f"[{step}/{total} {elapsed:6.1f} s] {text[:100]}\n")
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
