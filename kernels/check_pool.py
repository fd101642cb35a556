"""The GPU conformance check spread over processes: one job per (module, pass, share of its variants).

Each job loads the fixed inputs the parent drew (one file, so every process reads the same bits),
recomputes its module's training TP1/CP1 references -- strict and production, the same kernels on
the same inputs, so the same bits as the parent's serial pass -- and compares its share of the
variants with them. The first job of each (module, pass) also writes the strict reference's bytes,
which the parent hashes in the serial order: the fingerprint and the rows are those of the serial
check, only computed side by side (the check is dominated by Python-driven decode steps, which one
process runs one after another).

Example::

    >>> jobs = plan(check_shape("smoke"), workers=4)      # doctest: +SKIP
    >>> sorted({j[0] for j in jobs})                        # doctest: +SKIP
    ['attention', 'ffn', 'logp']
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib
import tempfile
import time

from rlk_kernels.conformance import (INPUT_SEED, MODULES, SCHEMA, CheckShape, TrainLayout, _bytes, _decode_steps,
                                     _Inputs, _module_rows, _passes, _run_variant, _variants, check_shape)

# relative cost of one decode step per module, from the H200's serial check (attention about 10x)
MODULE_WEIGHT = {"attention": 10, "ffn": 1, "logp": 1}
JOBS = 8            # jobs at once: each holds the inputs and its activations on the one GPU (16 OOMed)
JOB_BYTES = 9 << 30  # a qwen3-8b job's peak (6.3-7.8 GB on an H100) with a margin: fewer jobs at once
                     # where the card's free memory holds fewer (an 80 GB card next to the parent's inputs)


def jobs_at_once(workers: int, device: str) -> int:
    """Jobs run side by side: at most :data:`JOBS`, the pool's workers, and what the GPU's free memory holds."""
    import torch

    at_once = min(workers, JOBS)
    if str(device).startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        at_once = min(at_once, max(1, free // JOB_BYTES))
    return at_once


def plan(spec: CheckShape, workers: int) -> list[tuple[str, int, list[int]]]:
    """(module, pass index, variant indices) per job: each (module, pass) cut into a number of jobs
    in proportion to its cost (its decode steps), its variants dealt heaviest first to the lightest job."""
    costs = {}
    for module in MODULES:
        for index, (pass_spec, _) in enumerate(_passes(spec)):
            costs[module, index] = [MODULE_WEIGHT[module] * (1 + _decode_steps(pass_spec, kind, arg))
                                    for _, kind, arg in _variants(pass_spec)]
    total = sum(sum(c) for c in costs.values())
    jobs = []
    for (module, index), cost in costs.items():
        n = max(1, min(len(cost), round(workers * sum(cost) / total)))
        bins = [[0, []] for _ in range(n)]
        for i in sorted(range(len(cost)), key=lambda i: -cost[i]):
            lightest = min(bins, key=lambda b: b[0])
            lightest[0] += cost[i]
            lightest[1].append(i)
        jobs += [(b[0], module, index, sorted(b[1])) for b in bins if b[1]]
    jobs.sort(key=lambda j: -j[0])
    return [(module, index, indices) for _, module, index, indices in jobs]


def run_job(shape: str, device: str, module: str, index: int, indices: list[int], state_path: str,
            ref_path: str | None) -> tuple[list, float]:
    """Worker: one job's rows as (variant index, row) pairs, and its seconds."""
    import torch

    started = time.perf_counter()
    pass_spec, prefix = _passes(check_shape(shape, device))[index]
    state = torch.load(state_path, mmap=True, weights_only=True)[index]
    inp = _Inputs.from_state(state, device)
    with torch.no_grad(), torch.device(device):
        refs = {impl: _run_variant(module, impl, inp, pass_spec, "train", TrainLayout(1, 1))[0] for impl in ("R", "P")}
        if ref_path is not None:
            pathlib.Path(ref_path).write_bytes(_bytes(refs["R"]))
        rows = _module_rows(module, inp, pass_spec, refs, prefix, indices)
    del inp, refs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()            # the next job in this process starts from the same memory
    return list(zip(indices, rows)), round(time.perf_counter() - started, 1)


def run(spec: CheckShape, device: str, states: list[dict], pool, workers: int, progress=None,
        timings: dict | None = None) -> tuple[str, dict[str, list[dict]]]:
    """The check's (fingerprint, rows per module) from jobs on ``pool`` (a process pool)."""
    import torch

    timings = {} if timings is None else timings
    started = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="rlk-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        state_path = os.path.join(folder, "inputs.pt")
        torch.save(states, state_path)
        at_once = jobs_at_once(workers, device)
        jobs = plan(spec, at_once)
        refs_at = {}
        waiting = []
        for module, index, indices in jobs:
            ref_path = None
            if (module, index) not in refs_at:
                ref_path = refs_at[module, index] = os.path.join(folder, f"{module}-{index}.ref")
            waiting.append(((module, index), (run_job, spec.name, device, module, index, indices, state_path, ref_path)))
        if progress is not None:
            progress(f"{len(jobs)} check jobs, {at_once} at a time")
        found: dict = {}
        seconds = []
        running: dict = {}
        while waiting or running:
            while waiting and len(running) < at_once:      # heaviest first
                key, call = waiting.pop(0)
                running[pool.submit(*call)] = key
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                pairs, took = future.result()
                found.setdefault(running.pop(future), []).extend(pairs)
                seconds.append(took)
        fingerprint = hashlib.sha256(f"{SCHEMA}|{spec.name}|{spec.config.config_sha256}|{INPUT_SEED}|".encode())
        rows_by_module = {}
        for module in MODULES:
            rows = []
            for index, (_, prefix) in enumerate(_passes(spec)):
                fingerprint.update(module.encode() + prefix.encode() + b"|"
                                   + pathlib.Path(refs_at[module, index]).read_bytes())
                rows += [row for _, row in sorted(found[module, index], key=lambda pair: pair[0])]
            rows_by_module[module] = rows
    finally:
        for path in pathlib.Path(folder).iterdir():
            path.unlink()
        os.rmdir(folder)
    timings["jobs"] = {"count": len(jobs), "slowest_s": max(seconds), "sum_s": round(sum(seconds), 1),
                       "wall_s": round(time.perf_counter() - started, 1)}
    return fingerprint.hexdigest(), rows_by_module
