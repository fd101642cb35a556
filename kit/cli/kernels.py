"""`kit kernels check`: the conformance oracle of the strict (R) and production (P) operators."""

from __future__ import annotations

import json

import click

from kit.model.errors import BadInput, CheckFailed

# rlk_kernels.conformance.SHAPES (not imported here: the CLI loads without torch); qwen3-8b-w1 is the
# contract at canonical width 1, the TP1-only arms' (gpu-native-w1, gpu-consistency-w1)
CHECK_SHAPES = ("smoke", "qwen3-8b", "qwen3-8b-w1")


@click.group(name="kernels")
def command():
    """Conformance oracle of the strict and production operators.

    \b
    Example:
      kit kernels check                       # CPU, smoke shapes, table + fingerprint
      kit kernels check --shape qwen3-8b --json
      kit kernels distributed --backend gloo --world 4
    """


@command.command(name="check")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the operators run; cuda needs a visible CUDA GPU.")
@click.option("--shape", type=click.Choice(CHECK_SHAPES), default="smoke", show_default=True,
              help="Model shapes; qwen3-8b on CPU runs with reduced sequence length and batch (listed in the output); "
                   "qwen3-8b-w1 is the contract at canonical width 1 (arms whose only layout is TP1).")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/conformance/v1 document instead of the table.")
def check(device: str, shape: str, as_json: bool):
    """Check that R is byte-identical across layouts, prefill/decode and batch sizes; report P's mismatches.

    Exit 0 when every strict module is invariant, 1 when one is not, 2 on bad input.

    \b
    Example:
      kit kernels check --device cpu --shape smoke
      kit kernels check --json > conformance.json
    """
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is visible to torch "
                       f"{torch.__version__}; accepted here: --device cpu")
    from rlk_kernels.conformance import format_table, run_check

    # progress on stderr, one line per module pass; --json keeps stderr quiet like every other command
    report = run_check(device=device, shape=shape,
                       progress=None if as_json else (lambda text: click.echo(f"kernels: {text}", err=True)))
    _print_and_judge(report, format_table, as_json, "strict operators are not invariant")


@command.command(name="distributed")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="gloo: CPU processes; nccl: one CUDA GPU per rank.")
@click.option("--world", type=int, default=2, show_default=True,
              help="Ranks (processes): 1, 2, 4 or 8. Runs every training TP x CP = world and every rollout TP dividing it.")
@click.option("--shape", type=click.Choice(["smoke", "qwen3-8b"]), default="smoke", show_default=True,
              help="Model shapes; qwen3-8b with gloo runs the oracle's reduced CPU sizes (listed in the output).")
@click.option("--json", "as_json", is_flag=True, help="Print the rlk-kit/distributed-check/v1 document instead of the table.")
def distributed(backend: str, world: int, shape: str, as_json: bool):
    """Run the strict modules with one process per rank and compare them byte for byte with virtual ranks.

    R must hash the same on every rank, as the single-process virtual-rank run of the same layout and
    as the TP1/CP1 reference; P's mismatches across layouts are reported. Multicast stays off in every
    rank (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
    Exit 0 when R is byte-identical everywhere, 1 when not (or a rank failed), 2 on bad input.

    \b
    Example:
      kit kernels distributed --backend gloo --world 4
      kit kernels distributed --backend nccl --world 8 --shape qwen3-8b --json > ranks.json
    """
    from rlk_kernels.distributed import RankFailed, check_backend
    from rlk_kernels.distributed_check import WORLDS, format_table, run_distributed

    if world not in WORLDS:
        raise BadInput(f"--world {world}: accepted {', '.join(map(str, WORLDS))}")
    try:
        check_backend(backend, world)
    except ValueError as exc:
        raise BadInput(f"--backend {backend} --world {world}: {exc}") from None
    try:
        report = run_distributed(backend=backend, world=world, shape=shape)
    except RankFailed as exc:
        raise CheckFailed(str(exc)) from None
    _print_and_judge(report, format_table, as_json, f"strict operators differ over {world} real ranks")


def _print_and_judge(report: dict, format_table, as_json: bool, failure: str) -> None:
    """Print the document (or its table); exit 1 naming the modules whose strict operator varied."""
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(format_table(report))
    if not report["passed"]:
        bad = [m["module"] for m in report["modules"] if not m["strict_invariant"]]
        raise CheckFailed(f"{failure}: {', '.join(bad)}")
