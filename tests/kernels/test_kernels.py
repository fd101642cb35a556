"""Strict (R) operators are byte-invariant; production (P) ones are not; the oracle and its CLI."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit.cli import cli
from kit.model.documents import schema_problems
from rlk_kernels import conformance, ops, primitives as pr
from rlk_kernels.collectives import VirtualGroup, all_reduce_fixed_tree, all_reduce_rank_order
from rlk_kernels.conformance import conformance_fingerprint, run_check
from rlk_kernels.layouts import TrainLayout, training_layouts, zigzag_positions
from rlk_kernels.model import ModelConfig, init_weights, layer_weights, rope_table


def same_bytes(a, b) -> bool:
    a, b = a.detach().contiguous(), b.detach().contiguous()
    return a.shape == b.shape and bytes(a.view(torch.uint8).reshape(-1).numpy()) == bytes(b.view(torch.uint8).reshape(-1).numpy())


def tiny_config(heads_per_shard: int, groups_per_shard: int, head_dim: int, ffn_per_shard: int, vocab: int) -> ModelConfig:
    c = 8
    padded = -(-vocab // c) * c
    return ModelConfig(name="prop", layers=1, hidden=32, ffn_hidden=ffn_per_shard * c, heads=heads_per_shard * groups_per_shard * c,
                       query_groups=groups_per_shard * c, head_dim=head_dim, vocab=vocab, padded_vocab=padded, canonical_tp=c).validated()


configs = st.builds(tiny_config, st.sampled_from([1, 2]), st.just(1), st.sampled_from([2, 4, 8]),
                    st.sampled_from([1, 3, 4]), st.integers(9, 70))
layouts = st.sampled_from(training_layouts())
sizes = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, layout=layouts, rollout_tp=sizes, rows=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_strict_ffn_and_logp_rows_are_invariant_over_layouts_and_row_counts(cfg, layout, rollout_tp, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    weights = init_weights(cfg, seed, layers=1)
    w = layer_weights(weights, 0)
    x = torch.randn(41, cfg.hidden, generator=gen)
    targets = torch.randint(0, cfg.vocab, (41,), generator=gen)
    pick = torch.randperm(41, generator=gen)[:rows]
    ref_ffn = ops.ffn_module("R", w, cfg, x, 1)
    ref_logp = ops.logp_module("R", weights, cfg, x, targets, 1)
    assert same_bytes(ops.ffn_module("R", w, cfg, x[pick], layout.tp), ref_ffn[pick])
    assert same_bytes(ops.ffn_module("R", w, cfg, x[pick], rollout_tp), ref_ffn[pick])
    assert same_bytes(ops.logp_module("R", weights, cfg, x[pick], targets[pick], rollout_tp), ref_logp[pick])
    assert torch.isfinite(ref_logp).all() and (ref_logp <= 0).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, layout=layouts, rollout_tp=sizes, batch=st.integers(1, 5), chunks=st.integers(1, 3),
       prompt=st.integers(1, 15), seed=st.integers(0, 2**31 - 1))
def test_strict_attention_same_in_every_layout_and_in_decode(cfg, layout, rollout_tp, batch, chunks, prompt, seed):
    length = 16 * chunks
    prompt = min(prompt, length - 1)
    gen = torch.Generator().manual_seed(seed)
    w = layer_weights(init_weights(cfg, seed, layers=1), 0)
    rope = rope_table(cfg, length)
    x = torch.randn(batch, length, cfg.hidden, generator=gen)
    ref = ops.attention_module_train("R", w, cfg, rope, [x], [list(range(length))], 1)[0]
    positions = zigzag_positions(length, layout.cp)
    outs = ops.attention_module_train("R", w, cfg, rope, [x[:, p] for p in positions], positions, layout.tp)
    for out, pos in zip(outs, positions):
        assert same_bytes(out, ref[:, pos])
    cache = ops.KVCache(batch, cfg, length)
    pos = torch.arange(prompt).expand(batch, -1)
    got = [ops.attention_module_cached("R", w, cfg, rope, x[:, :prompt], pos, rollout_tp, cache, phase="prefill")]
    for p in range(prompt, length):
        got.append(ops.attention_module_cached("R", w, cfg, rope, x[:, p:p + 1], torch.full((batch, 1), p), rollout_tp,
                                               cache, phase="decode"))
    assert same_bytes(torch.cat(got, dim=1), ref)
    # one sequence alone gives the bits it had in the batch
    alone = ops.attention_module_train("R", w, cfg, rope, [x[-1:]], [list(range(length))], layout.tp)[0]
    assert same_bytes(alone, ref[-1:])


def test_production_differs_between_layouts():
    cfg = ModelConfig.smoke()
    weights = init_weights(cfg, 3, layers=1)
    w = layer_weights(weights, 0)
    x = torch.randn(64, cfg.hidden, generator=torch.Generator().manual_seed(1))
    p_tp1, p_tp8 = ops.ffn_module("P", w, cfg, x, 1), ops.ffn_module("P", w, cfg, x, 8)
    assert int(torch.ne(p_tp1, p_tp8).sum()) > 0
    assert float((p_tp1 - p_tp8).abs().max()) < 1e-4
    assert same_bytes(ops.ffn_module("R", w, cfg, x, 1), ops.ffn_module("R", w, cfg, x, 8))


def test_fixed_tree_and_rank_order_reductions_group_differently():
    g = VirtualGroup(4)
    vals = {0: torch.tensor([1e8]), 1: torch.tensor([1.0]), 2: torch.tensor([-1e8]), 3: torch.tensor([1.0])}
    assert float(all_reduce_rank_order(g, vals)) == 1.0        # ((1e8+1)-1e8)+1
    assert float(all_reduce_fixed_tree(g, vals)) == 0.0        # (1e8+1)+(-1e8+1)
    with pytest.raises(ValueError):
        all_reduce_fixed_tree(g, {0: torch.tensor([1.0])})


def test_zigzag_placement():
    assert zigzag_positions(8, 2) == [[0, 1, 6, 7], [2, 3, 4, 5]]
    with pytest.raises(ValueError):
        zigzag_positions(6, 2)
    assert len(training_layouts()) == 10 and TrainLayout(2, 4) in training_layouts()


def test_tree_sum_and_tiled_matmul_are_row_invariant():
    x = torch.randn(70, 33)
    w = torch.randn(33, 5)
    assert same_bytes(pr.tiled_matmul(x, w)[3:4], pr.tiled_matmul(x[3:4], w))
    assert same_bytes(pr.tree_sum(x, -1)[:7], pr.tree_sum(x[:7], -1))
    assert torch.allclose(pr.tiled_matmul(x, w), x @ w, atol=1e-5)


def test_oracle_passes_reports_production_and_validates():
    report = run_check(shape="smoke")
    assert report["passed"] and not schema_problems(report, "rlk-kit/conformance/v1")
    assert all(m["strict_invariant"] for m in report["modules"])
    assert all(m["production_mismatched_variants"] > 0 for m in report["modules"])
    assert len(report["modules"][0]["variants"]) == 10 + 4 + 64                # decode batches 1..64
    assert conformance_fingerprint() == report["fingerprint"]                   # references only, same hash


def test_oracle_catches_a_non_invariant_strict_operator(monkeypatch):
    # a "strict" FFN whose result depends on the row count must fail the oracle
    real = ops.ffn_module

    def leaky(impl, w, cfg, x, tp):
        out = real(impl, w, cfg, x, tp)
        return out * (1.0 + 1e-6 * (x.shape[0] % 3)) if impl == "R" else out

    monkeypatch.setattr(ops, "ffn_module", leaky)
    report = run_check(shape="smoke")
    assert not report["passed"]
    assert [m["module"] for m in report["modules"] if not m["strict_invariant"]] == ["ffn"]


def test_oracle_long_context_pass_is_checked_and_fingerprinted(monkeypatch):
    # the GPU shape adds a long pass (KV caches of 7k keys); the same machinery on the smoke model
    import dataclasses

    from rlk_kernels import conformance

    base = conformance.check_shape("smoke")
    long = dataclasses.replace(base, name="smoke-long", seq_len=64, prompt_len=48, batch_sizes=(1, 2),
                               train_layouts=(TrainLayout(2, 4), TrainLayout(8, 1)), rollout_tps=(1, 8))
    monkeypatch.setattr(conformance, "check_shape", lambda shape, device="cpu": dataclasses.replace(base, long_context=long))
    report = run_check(shape="smoke")
    assert report["passed"] and not schema_problems(report, "rlk-kit/conformance/v1")
    for module in report["modules"]:
        names = [v["variant"] for v in module["variants"]]
        assert len(names) == 78 + 6 and sum(n.startswith("7k: ") for n in names) == 6
    monkeypatch.undo()
    assert run_check(shape="smoke")["fingerprint"] != report["fingerprint"]      # the long pass is hashed
    spec = conformance.check_shape("qwen3-8b", "cuda")
    assert spec.long_context.prompt_len == 7168 and spec.long_context.seq_len - spec.long_context.prompt_len == 64


def test_cli_check_json_and_table():
    runner = CliRunner()
    result = runner.invoke(cli, ["kernels", "check", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "rlk-kit/conformance/v1" and len(doc["fingerprint"]) == 64
    assert result.stderr == ""                                    # --json: no progress lines
    table = runner.invoke(cli, ["kernels", "check"])
    assert table.exit_code == 0 and doc["fingerprint"] in table.stdout and "PASS" in table.stdout
    # progress: one stderr line per module pass, in order
    assert [line.split("]")[0] for line in table.stderr.splitlines()] == ["kernels: [1/3", "kernels: [2/3", "kernels: [3/3"]
    bad = runner.invoke(cli, ["kernels", "check", "--shape", "qwen3-9b"])
    assert bad.exit_code == 2


def test_cli_cuda_without_gpu_is_bad_input():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    result = CliRunner().invoke(cli, ["kernels", "check", "--device", "cuda"])
    assert result.exit_code == 2 and "--device cuda" in result.output


def test_check_jobs_give_the_serial_checks_fingerprint_and_verdicts(monkeypatch):
    # the GPU check runs its variants as jobs on a process pool; here the same jobs on threads
    import concurrent.futures
    import dataclasses

    from rlk_kernels import check_pool, conformance

    small = dataclasses.replace(conformance.check_shape("smoke"), batch_sizes=(1, 3), rollout_tps=(1, 2), grid=True,
                                train_layouts=(TrainLayout(1, 1), TrainLayout(1, 2), TrainLayout(2, 1)))
    monkeypatch.setattr(check_pool, "check_shape", lambda shape, device="cpu": small)
    fingerprint, rows = conformance._reference_pass(small, "cpu", variants=True)
    names = [r["variant"] for r in rows["attention"]]
    assert "batch 3 TP1: prefill 8, decode 8" in names and "decode batch 3 (rollout TP2)" in names
    jobs = check_pool.plan(small, workers=4)
    assert sorted(i for m, p, idx in jobs if m == "ffn" for i in idx) == list(range(len(names)))
    timings = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got, got_rows = check_pool.run(small, "cpu", conformance._draw_inputs(small, "cpu"), pool, 4, timings=timings)
    assert got == fingerprint and timings["jobs"]["count"] == len(jobs)
    for module in conformance.MODULES:
        assert [(r["variant"], r["strict_bytes_equal"], r["elements"]) for r in got_rows[module]] == \
               [(r["variant"], r["strict_bytes_equal"], r["elements"]) for r in rows[module]]


def test_check_jobs_at_once_fit_the_gpus_free_memory(monkeypatch):
    import torch

    from rlk_kernels import check_pool
    assert check_pool.jobs_at_once(15, "cpu") == check_pool.JOBS and check_pool.jobs_at_once(3, "cpu") == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for free_gib, want in ((141, check_pool.JOBS), (50, 5), (4, 1)):     # an H200, an H100 beside the inputs, a full card
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, f=free_gib: (f << 30, 80 << 30))
        assert check_pool.jobs_at_once(15, "cuda") == want


def test_the_width_one_shape_is_the_tp1_contract_and_holds(monkeypatch):
    for device in ("cpu", "cuda"):
        spec = conformance.check_shape("qwen3-8b-w1", device)
        assert spec.config.canonical_tp == 1 and spec.rollout_tps == (1,)
        assert spec.train_layouts == conformance.WIDTH_ONE_TRAIN and all(lay.tp == 1 for lay in spec.train_layouts)
    assert spec.long_context.config.canonical_tp == 1 and spec.long_context.train_layouts == (TrainLayout(1, 8),)
    assert spec.name == "qwen3-8b-w1" and spec.long_context.name == "qwen3-8b-w1-7k"
    # the smoke model at width 1 through the same oracle: R invariant over TP1 under every CP and decode batch
    smoke = conformance._width_one(conformance.check_shape("smoke"))
    monkeypatch.setattr(conformance, "check_shape", lambda shape, device="cpu": smoke)
    report = run_check(shape="smoke")
    assert report["passed"] and report["model"]["canonical_tp"] == 1
    assert not schema_problems(report, "rlk-kit/conformance/v1")
