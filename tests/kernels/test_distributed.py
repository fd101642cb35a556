"""Strict kernels over real ranks: gloo processes byte for byte against the virtual-rank oracle.

Every test here spawns real torch.distributed processes (gloo on CPU); the NCCL test runs when the
machine has at least two CUDA GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rlk_kernels.collectives import (
    VirtualGroup,
    all_reduce_fixed_tree,
    all_reduce_rank_order,
    group_for,
    use_groups,
)
from rlk_kernels.distributed import (
    RANK_ENV,
    RankFailed,
    launch,
    require_rank_env,
    rollout_rank_sets,
    train_rank_sets,
)
from rlk_kernels.distributed_check import (
    _groups_resolver,
    digest,
    plan_variants,
    run_distributed,
    verdict,
)

from kit.cli import cli
from kit.model.documents import schema_problems

SCHEMA = "rlk-kit/distributed-check/v1"


def raw(t) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


# --- rank targets (module level: they are pickled into the spawned processes) ---------------------------

def _values(rank: int):
    """A nested value whose shapes and contents differ per rank, with awkward bits (-0.0, NaN payload)."""
    gen = torch.Generator().manual_seed(rank)
    weird = torch.tensor([-0.0, 0.0, float("nan")]).view(torch.int32)
    weird[2] = 0x7FC00000 + rank                                  # a NaN whose payload names the rank
    return (torch.randn(rank + 1, 3, generator=gen),
            [torch.arange(rank * 2, dtype=torch.int64), torch.tensor([rank % 2 == 0, True]),
             torch.randn(2, 2, generator=gen).to(torch.bfloat16), weird.view(torch.float32)],
            torch.tensor(float(rank)))


def _gather_target(ctx, payload):
    (group,) = ctx.prepare_groups([list(range(ctx.world))])
    gathered = group.gather_all({group.rank: _values(ctx.rank)})
    parts = {r: torch.randn(5, 7, generator=torch.Generator().manual_seed(100 + r)) for r in range(ctx.world)}
    return {"env": {k: os.environ.get(k) for k in RANK_ENV},
            "gathered": [(raw(a), a.shape, [(raw(t), t.dtype, t.shape) for t in b], raw(c)) for a, b, c in gathered],
            "tree": raw(all_reduce_fixed_tree(group, {group.rank: parts[group.rank]})),
            "rank_order": raw(all_reduce_rank_order(group, {group.rank: parts[group.rank]}))}


def _failing_target(ctx, payload):
    if ctx.rank == payload:
        raise ValueError(f"rank {ctx.rank} refuses")
    return ctx.rank


# --- communicator and launcher -----------------------------------------------------------------------------

def test_gather_all_carries_unequal_shapes_and_dtypes_bit_exactly_in_rank_order():
    world = 3
    results, _ = launch(_gather_target, world, backend="gloo")
    expected = [_values(r) for r in range(world)]
    parts = [torch.randn(5, 7, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
    virtual = VirtualGroup(world)
    for res in results:
        assert res["env"] == RANK_ENV
        for got, (a, b, c) in zip(res["gathered"], expected):
            assert got[0] == raw(a) and got[1] == a.shape and got[3] == raw(c)
            assert [(x, d, s) for x, d, s in got[2]] == [(raw(t), t.dtype, t.shape) for t in b]
        # the fixed-order reductions over real ranks give the emulated ranks' bytes
        assert res["tree"] == raw(all_reduce_fixed_tree(virtual, dict(enumerate(parts))))
        assert res["rank_order"] == raw(all_reduce_rank_order(virtual, dict(enumerate(parts))))


def test_a_failing_rank_is_reported_with_its_error():
    with pytest.raises(RankFailed, match="rank 1 refuses"):
        launch(_failing_target, 2, backend="gloo", payload=1)


def test_rank_environment_must_keep_multicast_off():
    require_rank_env(dict(RANK_ENV))
    for key in RANK_ENV:
        with pytest.raises(RuntimeError, match=key):
            require_rank_env({**RANK_ENV, key: "1" if RANK_ENV[key] == "0" else "0"})
    with pytest.raises(RuntimeError, match="NCCL_NVLS_ENABLE=0"):
        require_rank_env({})


def test_launch_refuses_what_the_machine_cannot_run():
    with pytest.raises(ValueError, match="accepted: gloo, nccl"):
        launch(_failing_target, 2, backend="mpi")
    gpus = torch.cuda.device_count() if torch.distributed.is_nccl_available() else 0
    with pytest.raises(ValueError, match="(?i)nccl"):
        launch(_failing_target, gpus + 1, backend="nccl")


# --- placement, plan, hook ------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_rank_sits_in_exactly_one_group_per_axis(world):
    for _, kind, lay in plan_variants(world):
        axes = train_rank_sets(world, lay.tp, lay.cp) if kind == "train" else (rollout_rank_sets(world, lay.tp),)
        for sets in axes:
            assert sorted(r for s in sets for r in s) == list(range(world))
        if kind == "train":
            tp_sets, cp_sets = axes
            assert all(len(s) == lay.tp for s in tp_sets) and all(len(s) == lay.cp for s in cp_sets)
            # TP innermost: a TP group is consecutive ranks, a CP group strides by TP
            assert all(s == list(range(s[0], s[0] + lay.tp)) for s in tp_sets)


def test_plan_covers_the_issue_layouts():
    assert [label for label, _, _ in plan_variants(8)] == [
        "train TP1/CP8", "train TP2/CP4", "train TP4/CP2", "train TP8/CP1",
        "rollout TP1 prefill+decode", "rollout TP2 prefill+decode", "rollout TP4 prefill+decode", "rollout TP8 prefill+decode"]
    cpu = {label for w in (2, 4) for label, kind, _ in plan_variants(w) if kind == "train"}
    assert cpu == {"train TP2/CP1", "train TP1/CP2", "train TP2/CP2", "train TP4/CP1", "train TP1/CP4"}
    with pytest.raises(ValueError, match="accepted: 1, 2, 4, 8"):
        plan_variants(3)


def test_group_hook_is_virtual_unless_a_resolver_is_installed():
    assert group_for("tp", 4) == VirtualGroup(4)
    resolver = _groups_resolver({"tp": VirtualGroup(2), "cp": VirtualGroup(4)})
    with use_groups(resolver):
        assert group_for("tp", 2) == VirtualGroup(2) and group_for("cp", 4) == VirtualGroup(4)
        with pytest.raises(ValueError, match="tp group of 4 ranks; this rank's tp group has 2"):
            group_for("tp", 4)
    assert group_for("cp", 2) == VirtualGroup(2)
    with use_groups(_groups_resolver({"tp": VirtualGroup(2)})), pytest.raises(ValueError, match="cp group"):
        group_for("cp", 1)


def test_verdict_fails_when_one_rank_differs():
    world = 2
    keys = [(m, i, label) for m in ("attention", "ffn", "logp") for i in ("R", "P") for label, _, _ in plan_variants(world)]
    ranks = [{"hashes": {k: "a" * 64 for k in keys}, "seconds": {k: 0.1 for k in keys},
              "production": {(m, label): (0, 0.0, 10) for m, _, label in keys}} for _ in range(world)]
    virtual = {k: "a" * 64 for k in keys}
    refs = {(m, i): "a" * 64 for m, i, _ in keys}
    assert all(m["strict_invariant"] for m in verdict(world, ranks, virtual, refs))
    ranks[1]["hashes"][("ffn", "R", "train TP2/CP1")] = "b" * 64
    modules = {m["module"]: m for m in verdict(world, ranks, virtual, refs)}
    assert modules["attention"]["strict_invariant"] and not modules["ffn"]["strict_invariant"]
    row = next(r for r in modules["ffn"]["variants"] if r["variant"] == "train TP2/CP1")
    assert not row["strict_ranks_agree"] and not row["strict_equal_virtual"] and not row["strict_bytes_equal"]


# --- the strict modules over real ranks ------------------------------------------------------------------------

def _assert_strict_everywhere(report, world):
    assert not schema_problems(report, SCHEMA)
    assert report["passed"] and report["world"] == world and len(report["ranks"]) == world
    assert report["rank_env"] == {k: [v] for k, v in sorted(RANK_ENV.items())}
    assert [v["variant"] for v in report["variants"]] == [label for label, _, _ in plan_variants(world)]
    for module in report["modules"]:
        hashes = {row["strict_sha256"] for row in module["variants"]}
        assert len(hashes) == 1, module["module"]          # one R output for every layout
        for row in module["variants"]:
            assert row["strict_ranks_agree"] and row["strict_equal_virtual"] and row["strict_equal_reference"]
            # P runs its rank-order all-reduce over real ranks and lands on the emulated bytes
            assert row["production_ranks_agree"] and row["production_equal_virtual"]
    # P moves with the layout (attention: SDPA paths and ring merge differ from TP1/CP1)
    attention = next(m for m in report["modules"] if m["module"] == "attention")
    assert attention["production_mismatched_variants"] >= 1


def _oracle_reference_hashes():
    """Hashes of the strict TP1/CP1 outputs computed here, in this process, by the oracle's own code."""
    from rlk_kernels.conformance import _Inputs, _run_variant, check_shape
    from rlk_kernels.layouts import TrainLayout

    spec = check_shape("smoke")
    inp = _Inputs(spec, "cpu")
    with torch.no_grad():
        return {m: digest(_run_variant(m, "R", inp, spec, "train", TrainLayout(1, 1))[0]) for m in ("attention", "ffn", "logp")}


@pytest.fixture(scope="module")
def reference_hashes():
    return _oracle_reference_hashes()


def test_cli_gloo_two_processes_match_virtual_ranks_byte_for_byte(reference_hashes):
    kit = shutil.which("kit") or str(Path(sys.executable).parent / "kit")
    proc = subprocess.run([kit, "kernels", "distributed", "--backend", "gloo", "--world", "2", "--json"],
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    _assert_strict_everywhere(report, 2)
    assert {m["module"]: m["variants"][0]["strict_sha256"] for m in report["modules"]} == reference_hashes


def test_gloo_four_processes_match_virtual_ranks_byte_for_byte(reference_hashes):
    report = run_distributed(backend="gloo", world=4, shape="smoke")
    _assert_strict_everywhere(report, 4)
    assert {m["module"]: m["variants"][0]["strict_sha256"] for m in report["modules"]} == reference_hashes
    labels = [v["variant"] for v in report["variants"]]
    assert {"train TP2/CP2", "train TP1/CP4", "train TP4/CP1", "rollout TP1 prefill+decode"} <= set(labels)
    assert [v["replicas"] for v in report["variants"] if v["kind"] == "rollout"] == [4, 2, 1]


@pytest.mark.parametrize("args, message", [
    (["--world", "3"], "--world 3: accepted 1, 2, 4, 8"),
    (["--world", "6"], "--world 6: accepted 1, 2, 4, 8"),
])
def test_cli_bad_world_is_bad_input(args, message):
    result = CliRunner().invoke(cli, ["kernels", "distributed", *args])
    assert result.exit_code == 2 and message in result.output


def test_cli_nccl_without_gpus_for_every_rank_is_bad_input():
    gpus = torch.cuda.device_count() if torch.distributed.is_nccl_available() else 0
    if gpus >= 8:
        pytest.skip("8 CUDA GPUs present: nccl runs for real (test_nccl_ranks_match_virtual_ranks)")
    result = CliRunner().invoke(cli, ["kernels", "distributed", "--backend", "nccl", "--world", "8"])
    assert result.exit_code == 2 and "--backend nccl --world 8" in result.output


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.distributed.is_nccl_available() and torch.cuda.device_count() >= 2), reason="needs 2+ CUDA GPUs")
def test_nccl_ranks_match_virtual_ranks():
    world = max(w for w in (2, 4, 8) if w <= torch.cuda.device_count())
    report = run_distributed(backend="nccl", world=world, shape="smoke")
    _assert_strict_everywhere(report, world)
