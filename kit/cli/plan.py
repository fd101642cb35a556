"""`kit plan`: what an arm will run, without running it."""

from __future__ import annotations

import click

from kit.cli._output import emit_json
from kit.model.errors import BadInput
from kit.model.arm import Arm, mode_operators, with_overrides
from kit.model.catalog import Catalog
from kit.run.plan import TopologyOverrides, resolve_plan


def arm_selection_options(f):
    """--arm / --mode and the topology flags, shared by plan and run."""
    for opt in reversed([
        click.option("--arm", "arm_ref", metavar="A", help="Arm name (kit verify manifests/*.json lists them) or arm file."),
        click.option("--mode", type=click.Choice(["native", "consistency"]),
                     help="Without --arm: the arm of that name. With --arm: all operators P/P (native) or R/R (consistency)."),
        click.option("--tp-size", type=int, help="Training tensor-parallel size."),
        click.option("--cp-size", type=int, help="Training context-parallel size (default: GPUs / TP when --tp-size is given)."),
        click.option("--rollout-tp-size", type=int, help="Rollout engine tensor-parallel size."),
        click.option("--rollout-cp-size", type=int, help="Rollout engine context-parallel size (only 1 is accepted)."),
    ]):
        f = opt(f)
    return f


def select_arm(arm_ref, mode):
    """Resolve --arm/--mode into an Arm; --mode with --arm derives a renamed arm with all cases set,
    declared as a comparison with the base arm whose only factor is ``operators``."""

    if not arm_ref and not mode:
        raise BadInput("give --arm A or --mode native|consistency")
    catalog = Catalog.default()
    if not arm_ref:
        return catalog.arm(mode)
    arm = catalog.arm_ref(arm_ref)
    if mode:
        ops = mode_operators(mode)
        if ops != arm.operators:
            doc = with_overrides(arm.document, operators=ops, name=f"{arm.name}-{mode}")
            doc["description"] = f"{arm.name} with every operator {ops['attention']} (--mode {mode})"
            # the derived arm differs from its base only in the operator cases: declare exactly that, so
            # `kit compare` of a run of each is controlled, and any other difference stays uncontrolled
            doc["comparison"] = {"with": arm.name, "factors": ["operators"]}
            return Arm(doc["name"], doc, arm.stack, arm.source_file)
    return arm


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@arm_selection_options
@click.option("--rollouts", type=int, help="Number of rollouts (steps); default from the arm.")
@click.option("--run-id", help="Run id to plan for (default: <arm>-n<rollouts>-s<seed>-<UTC time>).")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/plan/v1 document.")
def command(arm_ref, mode, tp_size, cp_size, rollout_tp_size, rollout_cp_size, rollouts, run_id, as_json):
    """Resolve an arm: topology (engines, GPUs per engine, offload rule), vLLM memory utilization,
    capture sizes, evidence level, the complete train command, the Ray job and the image it needs.

    \b
    Examples:
      kit plan --arm consistency --tp-size 2 --cp-size 4 --json
      kit plan --arm consistency --tp-size 1          # CP derived: 8 / 1 = 8
      kit plan --arm G10
      kit plan --mode native --rollout-tp-size 2
    """

    arm = select_arm(arm_ref, mode)
    plan = resolve_plan(arm, TopologyOverrides(tp_size, cp_size, rollout_tp_size, rollout_cp_size),
                        run_id=run_id, rollouts=rollouts)
    if as_json:
        emit_json(plan)
        return
    t = plan["topology"]
    click.echo(f"arm {arm.name} on stack {arm.stack.name} ({arm.stack.sha256[:12]}), evidence level {plan['evidence_level']}")
    click.echo(f"training  TP{t['tp']}/CP{t['cp']} on {t['actor_gpus']} GPUs, offload train: {t['offload_train']}")
    click.echo(f"rollout   {t['rollout_engines']} engine(s) × {t['rollout_gpus_per_engine']} GPUs (TP{t['rollout_tp']}/CP{t['rollout_cp']}), "
               f"vLLM memory utilization {t['vllm_gpu_memory_utilization']}")
    click.echo(f"graphs    {arm.document['graph']['mode']} capture sizes {plan['capture_sizes']}")
    click.echo(f"image     {plan['image']['repository']} ({plan['image']['platform']}) — {plan['image']['build']}")
    click.echo(f"ray job   {plan['ray_job']['submission_id']}")
    if "launcher" in plan["command"]:
        click.echo(f"launcher  {plan['command']['launcher']['revision']}: {plan['command']['launcher']['source']}")
    click.echo("command:")
    click.echo("  " + plan["command"]["shell"])
