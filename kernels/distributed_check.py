"""The strict modules over real ranks: byte-for-byte against the single-process virtual-rank oracle.

For a world of N processes (gloo on CPU, nccl with one GPU per rank) every layout that fills it is
run with one rank per process: training TP x CP with TP*CP = N (zigzag CP placement; each rank
computes only its own tokens, the CP ranks gather the outputs) and rollout TP t for every t dividing
N (N/t replicas; prompt prefill, then token-by-token decode against a KV cache). The modules are
the conformance oracle's (attention, ffn, logp) on its seeded inputs, called unchanged: the only
difference from the oracle is that :func:`rlk_kernels.collectives.group_for` hands them real
process groups (:class:`~rlk_kernels.distributed.TorchDistGroup`) instead of virtual ones.

Per module and variant, every rank hashes the full output (sha256 of dtype, shape and raw bytes).
The strict (R) output must hash the same on every rank, the same as the virtual-rank run of the
same layout in the parent process (the oracle's own variant code), and the same as the oracle's
training TP1/CP1 reference: byte-identical across real and emulated ranks and across layouts. The
production (P) output, whose rank-order all-reduce is carried out over the real ranks, is compared
with its own TP1/CP1 reference and its mismatches are reported, not judged.

Example::

    >>> report = run_distributed(backend="gloo", world=2)       # doctest: +SKIP
    >>> report["passed"], [v["variant"] for v in report["variants"]]
    (True, ['train TP1/CP2', 'train TP2/CP1', 'rollout TP1 prefill+decode', 'rollout TP2 prefill+decode'])
"""

from __future__ import annotations

import hashlib
import os
import time

from rlk_kernels.layouts import PHYSICAL_SIZES, RolloutLayout, TrainLayout

SCHEMA = "rlk-kit/distributed-check/v1"
WORLDS = (1, 2, 4, 8)
IMPLS = ("R", "P")


def plan_variants(world: int) -> list[tuple[str, str, object]]:
    """(label, kind, layout) of every training TP x CP = world and rollout TP dividing world.

    >>> [label for label, _, _ in plan_variants(4)]
    ['train TP1/CP4', 'train TP2/CP2', 'train TP4/CP1', 'rollout TP1 prefill+decode', 'rollout TP2 prefill+decode', 'rollout TP4 prefill+decode']
    """
    if world not in WORLDS:
        raise ValueError(f"world {world}; accepted: {', '.join(map(str, WORLDS))}")
    train = [TrainLayout(tp, world // tp) for tp in PHYSICAL_SIZES if world % tp == 0 and world // tp in PHYSICAL_SIZES]
    rollout = [RolloutLayout(tp) for tp in PHYSICAL_SIZES if world % tp == 0]
    return ([("train " + lay.label, "train", lay) for lay in train]
            + [(f"rollout TP{lay.tp} prefill+decode", "rollout", lay) for lay in rollout])


def digest(t) -> str:
    """sha256 of a tensor's dtype, shape and raw bytes (so +0/-0 and NaN payloads count)."""
    from rlk_kernels.conformance import _bytes
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(_bytes(t))
    return h.hexdigest()


# --- one rank ------------------------------------------------------------------------------------------

def _groups_resolver(groups: dict):
    """``group_for`` resolver of this rank: the communicator of each axis, checked against the size asked."""
    def resolve(axis, size):
        group = groups.get(axis)
        have = None if group is None else group.size
        if have != size:
            raise ValueError(f"operator asked for a {axis} group of {size} ranks; this rank's {axis} group has {have}")
        return group
    return resolve


def _train_spmd(ctx, module, impl, inp, cfg, layout: TrainLayout, groups):
    """This rank's part of a training variant, gathered over CP into the full [B, L(, H)] output."""
    import torch
    from rlk_kernels import ops
    from rlk_kernels.collectives import use_groups
    from rlk_kernels.layouts import zigzag_positions

    tp_group, cp_group = groups["tp"], groups["cp"]
    cp_rank = ctx.rank // layout.tp
    x, targets = inp.hidden, inp.targets
    batch, length, _ = x.shape
    positions = zigzag_positions(length, layout.cp)
    mine = positions[cp_rank]
    with use_groups(_groups_resolver({"tp": tp_group, "cp": cp_group})):
        if module == "attention":
            (out,) = ops.attention_module_train(impl, inp.layer, cfg, inp.rope, [x[:, p] for p in positions], positions, layout.tp)
        elif module == "ffn":
            out = ops.ffn_module(impl, inp.layer, cfg, x[:, mine].reshape(-1, cfg.hidden), layout.tp).view(batch, len(mine), cfg.hidden)
        else:
            out = ops.logp_module(impl, inp.weights, cfg, x[:, mine].reshape(-1, cfg.hidden), targets[:, mine].reshape(-1),
                                  layout.tp).view(batch, len(mine))
    parts = cp_group.gather_all({cp_group.local_ranks()[0]: out})
    order = torch.tensor([q for p in positions for q in p], device=x.device)
    full = torch.cat(parts, dim=1)
    result = torch.empty_like(full)
    result[:, order] = full
    return result


def _rollout_spmd(module, impl, inp, spec, layout: RolloutLayout, tp_group):
    from rlk_kernels.collectives import use_groups
    from rlk_kernels.conformance import _rollout_variant

    # the oracle's own prefill+decode driver: it has no CP loop, so it runs per rank unchanged
    with use_groups(_groups_resolver({"tp": tp_group})):
        return _rollout_variant(module, impl, inp, spec.config, inp.hidden, inp.targets, layout.tp, spec.prompt_len)


def _rank_target(ctx, payload):
    """Runs in every rank: all modules x impls x variants; returns hashes, P mismatches (rank 0), timings."""
    import torch
    from rlk_kernels.conformance import (
        MODULES,
        _compare,
        _Inputs,
        _run_variant,
        check_shape,
    )
    from rlk_kernels.distributed import (
        require_rank_env,
        rollout_rank_sets,
        train_rank_sets,
    )

    require_rank_env()
    started = time.perf_counter()
    spec = check_shape(payload["shape"], "cuda" if ctx.backend == "nccl" else "cpu")
    variants = plan_variants(ctx.world)
    # every rank creates every group in the same order (creation is collective)
    my_groups = {}
    for label, kind, lay in variants:
        if kind == "train":
            tp_sets, cp_sets = train_rank_sets(ctx.world, lay.tp, lay.cp)
            tps, cps = ctx.prepare_groups(tp_sets), ctx.prepare_groups(cp_sets)
            my_groups[label] = {"tp": next(g for g in tps if g), "cp": next(g for g in cps if g)}
        else:
            my_groups[label] = {"tp": next(g for g in ctx.prepare_groups(rollout_rank_sets(ctx.world, lay.tp)) if g)}
    inp = _Inputs(spec, ctx.device)
    setup_s = time.perf_counter() - started
    hashes, production, seconds = {}, {}, {}
    with torch.no_grad(), torch.device(ctx.device):
        for module in MODULES:
            # rank 0 measures P against its own single-process TP1/CP1 output, as the oracle does
            p_ref = _run_variant(module, "P", inp, spec, "train", TrainLayout(1, 1))[0] if ctx.rank == 0 else None
            for impl in IMPLS:
                for label, kind, lay in variants:
                    t0 = time.perf_counter()
                    if kind == "train":
                        out = _train_spmd(ctx, module, impl, inp, spec.config, lay, my_groups[label])
                    else:
                        out = _rollout_spmd(module, impl, inp, spec, lay, my_groups[label]["tp"])
                    if ctx.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    seconds[(module, impl, label)] = time.perf_counter() - t0
                    hashes[(module, impl, label)] = digest(out)
                    if impl == "P" and p_ref is not None:
                        _, ne, diff = _compare(out, p_ref)
                        production[(module, label)] = (ne, diff, out.numel())
    ctx.barrier()
    return {"rank": ctx.rank, "device": ctx.device, "env": {k: os.environ.get(k) for k in payload["env_keys"]},
            "threads": torch.get_num_threads(), "hashes": hashes, "production": production, "seconds": seconds,
            "setup_s": setup_s, "elapsed_s": time.perf_counter() - started}


# --- the parent: virtual-rank results and the verdict ----------------------------------------------------

def virtual_hashes(shape: str, device: str, world: int, threads: int | None = None) -> tuple[dict, dict, str, float]:
    """Hashes of the oracle's single-process outputs (VirtualGroup ranks) for every variant of ``world``.

    Returns (hashes by (module, impl, label), reference hashes by (module, impl), conformance
    fingerprint, seconds). The fingerprint is the oracle's own (``conformance_fingerprint``), so the two
    commands print the same value for the same shape and device kind.
    """
    import torch
    from rlk_kernels.conformance import MODULES, _Inputs, _run_variant, check_shape, conformance_fingerprint

    started = time.perf_counter()
    spec = check_shape(shape, "cuda" if device.startswith("cuda") else "cpu")
    inp = _Inputs(spec, device)
    # the ranks' CPU thread count, so P (whose kernels may split work by thread) is compared like for like
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or saved_threads)
    hashes, refs = {}, {}
    with torch.no_grad(), torch.device(device):
        for module in MODULES:
            for impl in IMPLS:
                ref = _run_variant(module, impl, inp, spec, "train", TrainLayout(1, 1))[0]
                refs[(module, impl)] = digest(ref)
                for label, kind, lay in plan_variants(world):
                    hashes[(module, impl, label)] = digest(_run_variant(module, impl, inp, spec, kind, lay)[0])
    torch.set_num_threads(saved_threads)
    fingerprint = conformance_fingerprint(device=device, shape=shape)
    return hashes, refs, fingerprint, time.perf_counter() - started


def verdict(world: int, ranks: list, virtual: dict, refs: dict) -> list[dict]:
    """Per-module rows from the ranks' hashes and the virtual hashes (pure; no torch).

    A strict row passes when all ranks agree, equal the virtual run of the same layout and equal
    the TP1/CP1 reference.
    """
    from rlk_kernels.conformance import MODULES

    modules = []
    for module in MODULES:
        rows = []
        for label, kind, lay in plan_variants(world):
            row = {"variant": label}
            for impl, key in (("R", "strict"), ("P", "production")):
                seen = [r["hashes"][(module, impl, label)] for r in ranks]
                row[f"{key}_sha256"] = seen[0]
                row[f"{key}_ranks_agree"] = len(set(seen)) == 1
                row[f"{key}_equal_virtual"] = all(h == virtual[(module, impl, label)] for h in seen)
                row[f"{key}_equal_reference"] = all(h == refs[(module, impl)] for h in seen)
            ne, diff, elements = ranks[0]["production"][(module, label)]
            row.update(production_mismatches=ne, production_max_abs_diff=diff, elements=elements,
                       seconds_max_rank=round(max(r["seconds"][(module, impl, label)] for r in ranks for impl in IMPLS), 4))
            row["strict_bytes_equal"] = row["strict_ranks_agree"] and row["strict_equal_virtual"] and row["strict_equal_reference"]
            rows.append(row)
        modules.append({
            "module": module,
            "strict_invariant": all(r["strict_bytes_equal"] for r in rows),
            "production_mismatched_variants": sum(1 for r in rows if r["production_mismatches"]),
            "production_max_abs_diff": max(r["production_max_abs_diff"] for r in rows),
            "variants": rows,
        })
    return modules


def run_distributed(*, backend: str = "gloo", world: int = 2, shape: str = "smoke", threads: int | None = None) -> dict:
    """Run every layout of ``world`` as real ranks; returns the ``rlk-kit/distributed-check/v1`` document."""
    import torch
    from rlk_kernels.conformance import check_shape
    from rlk_kernels.distributed import RANK_ENV, launch

    started = time.perf_counter()
    variants = plan_variants(world)
    spec = check_shape(shape, "cuda" if backend == "nccl" else "cpu")
    ranks, ranks_s = launch(_rank_target, world, backend=backend, threads=threads,
                            payload={"shape": shape, "env_keys": sorted(RANK_ENV)})
    device = "cuda:0" if backend == "nccl" else "cpu"
    virtual, refs, fingerprint, virtual_s = virtual_hashes(shape, device, world, ranks[0]["threads"])
    modules = verdict(world, ranks, virtual, refs)
    return {
        "schema": SCHEMA,
        "backend": backend,
        "world": world,
        "shape": spec.name,
        "device": "cuda" if backend == "nccl" else "cpu",
        "torch": torch.__version__,
        "config_sha256": spec.config.config_sha256,
        "inputs": {"seq_len": spec.seq_len, "prompt_len": spec.prompt_len, "batch": max(spec.batch_sizes)},
        # the oracle's own layout and batch-size lists do not apply: this check runs its plan on the full batch
        "reductions": {k: v for k, v in spec.reductions.items() if k not in ("layouts", "batch_sizes")},
        "rank_env": {k: sorted({r["env"][k] for r in ranks}) for k in sorted(RANK_ENV)},
        "variants": [{"variant": label, "kind": kind, "tp": lay.tp, "cp": getattr(lay, "cp", 1),
                      "replicas": world // (lay.tp * getattr(lay, "cp", 1))} for label, kind, lay in variants],
        "ranks": [{"rank": r["rank"], "device": r["device"], "threads": r["threads"],
                   "setup_s": round(r["setup_s"], 3), "elapsed_s": round(r["elapsed_s"], 3)} for r in ranks],
        "modules": modules,
        "passed": all(m["strict_invariant"] for m in modules),
        "conformance_fingerprint": fingerprint,
        "timings": {"ranks_s": round(ranks_s, 3), "virtual_s": round(virtual_s, 3),
                    "total_s": round(time.perf_counter() - started, 3)},
    }


def format_table(report: dict) -> str:
    title = (f"strict kernels over real ranks: backend={report['backend']} world={report['world']} "
             f"shape={report['shape']} device={report['device']} torch={report['torch']}")
    lines = [title]
    lines += [f"  reduced: {k}: {v}" for k, v in report["reductions"].items()]
    lines.append("  rank env: " + ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in report["rank_env"].items()))
    header = (f"{'module':<10} {'variant':<28} {'R ranks':<8} {'R=virt':<7} {'R=TP1/CP1':<10} "
              f"{'P=virt':<7} {'P mismatches':>16} {'P max|diff|':>12}")
    lines += [header, "-" * len(header)]
    yes = {True: "yes", False: "NO"}
    for m in report["modules"]:
        for r in m["variants"]:
            lines.append(f"{m['module']:<10} {r['variant']:<28} {'agree' if r['strict_ranks_agree'] else 'DIFFER':<8} "
                         f"{yes[r['strict_equal_virtual']]:<7} {yes[r['strict_equal_reference']]:<10} "
                         f"{yes[r['production_equal_virtual']]:<7} "
                         f"{str(r['production_mismatches']) + '/' + str(r['elements']):>16} {r['production_max_abs_diff']:>12.3g}")
    lines.append("-" * len(header))
    for m in report["modules"]:
        lines.append(f"{m['module']:<10} R {'byte-identical' if m['strict_invariant'] else 'NOT IDENTICAL'} on real ranks, "
                     f"virtual ranks and across layouts; P differs in {m['production_mismatched_variants']}/{len(m['variants'])} variants")
    t = report["timings"]
    lines.append(f"conformance fingerprint {report['conformance_fingerprint']}")
    lines.append(f"{'PASS' if report['passed'] else 'FAIL'}: {report['world']} ranks in {t['ranks_s']} s "
                 f"(spawn included), virtual ranks in {t['virtual_s']} s, total {t['total_s']} s")
    return "\n".join(lines)
