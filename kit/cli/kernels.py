"""`kit kernels check`: the conformance oracle of the strict (R) and production (P) operators."""

from __future__ import annotations

import json

import click

from kit.errors import BadInput, CheckFailed


@click.group(name="kernels")
def command():
    """Conformance oracle of the strict and production operators.

    \b
    Example:
      kit kernels check                       # CPU, smoke shapes, table + fingerprint
      kit kernels check --shape qwen3-8b --json
    """


@command.command(name="check")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the operators run; cuda needs a visible CUDA GPU.")
@click.option("--shape", type=click.Choice(["smoke", "qwen3-8b"]), default="smoke", show_default=True,
              help="Model shapes; qwen3-8b on CPU runs with reduced sequence length and batch (listed in the output).")
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

    report = run_check(device=device, shape=shape)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(format_table(report))
    if not report["passed"]:
        bad = [m["module"] for m in report["modules"] if not m["strict_invariant"]]
        raise CheckFailed(f"strict operators are not invariant: {', '.join(bad)}")
