"""The conformance oracle: on fixed seeded inputs, R must be byte-identical everywhere; P is measured.

For each module (attention, ffn, logp) the strict implementation is run once as the reference
(training TP1/CP1, one call over every row) and then under every training layout TP x CP
(zigzag CP placement), every rollout TP with a prompt prefill followed by token-by-token decode
against a KV cache, and decode batches of several sizes. Each variant's output is compared with
the reference *as raw bytes* (so +0/-0 differ). The production implementation is run through the
same variants and its differences from its own reference are counted and reported, not judged.

The fingerprint is the sha256 of the strict reference outputs (with the shape's config hash):
an image whose oracle prints the same fingerprint computes the same strict bits.

Example::

    >>> report = run_check(shape="smoke")          # doctest: +SKIP
    >>> report["passed"], len(report["fingerprint"])
    (True, 64)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace

from rlk_kernels import ops
from rlk_kernels.layouts import RolloutLayout, TrainLayout, rollout_layouts, training_layouts, zigzag_positions
from rlk_kernels.model import ModelConfig, init_weights, layer_weights, rope_table, weight_shapes

SCHEMA = "rlk-kit/conformance/v1"
INPUT_SEED = 20260917
MODULES = ("attention", "ffn", "logp")


@dataclass(frozen=True)
class CheckShape:
    name: str
    config: ModelConfig
    seq_len: int
    prompt_len: int
    batch_sizes: tuple
    reductions: dict = field(default_factory=dict)
    train_layouts: tuple = ()          # empty: every training layout
    rollout_tps: tuple = ()            # empty: every rollout TP
    long_context: "CheckShape | None" = None   # a second, long-sequence pass (GPU): KV caches of 7k
    grid: bool = False                 # also every decode batch under every rollout TP (GPU)


def check_shape(shape: str, device: str = "cpu") -> CheckShape:
    if shape == "smoke":
        return CheckShape("smoke", ModelConfig.smoke(), seq_len=16, prompt_len=8, batch_sizes=tuple(range(1, 65)))
    if shape == "qwen3-8b":
        if device == "cpu":
            # every call streams the full-size weights (2.5 GB of LM head); keep the CPU run to minutes
            return CheckShape("qwen3-8b", ModelConfig.qwen3_8b(), seq_len=16, prompt_len=14, batch_sizes=(1, 3),
                              train_layouts=(TrainLayout(1, 8), TrainLayout(2, 4), TrainLayout(4, 2), TrainLayout(8, 1)),
                              rollout_tps=(1, 4),
                              reductions={
                                  "seq_len": "16 tokens per sequence (14 prefilled, 2 decoded) instead of prompt plus 7168 response tokens",
                                  "batch_sizes": "decode batches 1 and 3 (4 sequences in all) instead of 1..64",
                                  "layouts": "training TP1/CP8, TP2/CP4, TP4/CP2, TP8/CP1 against TP1/CP1; rollout TP1 and TP4",
                                  "layers": "one layer's attention and FFN weights, and the full LM head",
                              })
        # the long pass: 2 sequences of 7232 tokens -- decode steps over KV caches of 7168..7231
        # keys against the full-sequence training recompute, under a CP and a TP training layout
        long = CheckShape("qwen3-8b-7k", ModelConfig.qwen3_8b(), seq_len=7232, prompt_len=7168, batch_sizes=(1, 2),
                          train_layouts=(TrainLayout(2, 4), TrainLayout(8, 1)), rollout_tps=(1, 8), grid=True)
        return CheckShape("qwen3-8b", ModelConfig.qwen3_8b(), seq_len=256, prompt_len=192, batch_sizes=(1, 2, 3, 8, 17, 64),
                          long_context=long, grid=True,
                          reductions={"seq_len": "256 tokens per sequence (192 prefilled, 64 decoded), and a long "
                                                 "pass of 2 sequences of 7232 tokens (7168 prefilled, 64 decoded; "
                                                 "training TP2/CP4 and TP8/CP1, rollout TP1 and TP8)",
                                      "batch_sizes": "decode batches 1, 2, 3, 8, 17 and 64 (both ends, the "
                                                     "small ones, and odd sizes that fill tiles unevenly) "
                                                     "instead of every size 1..64; each under every rollout "
                                                     "TP (prefill, then the last 8 positions decoded)",
                                      "layers": "one layer's attention and FFN weights, and the full LM head"})
    if shape == "qwen3-8b-w1":
        return _width_one(check_shape("qwen3-8b", device))
    raise ValueError(f"unknown shape {shape!r}; accepted: {', '.join(SHAPES)}")


SHAPES = ("smoke", "qwen3-8b", "qwen3-8b-w1")
WIDTH_ONE_TRAIN = (TrainLayout(1, 2), TrainLayout(1, 4), TrainLayout(1, 8))


def _width_one(spec: CheckShape) -> CheckShape:
    """Qwen3-8B at canonical width 1: the contract of an arm whose only TP layout is TP1 (training and
    rollout), so every row-parallel product is one fixed-order product with no shard tree. The same
    inputs, decode batches and passes; the layouts such an arm can take: TP1 under CP 1, 2, 4, 8
    (training) and rollout TP1."""
    config = type(spec.config)(**{**spec.config.to_json(), "canonical_tp": 1})
    long = _width_one(spec.long_context) if spec.long_context is not None else None
    reductions = dict(spec.reductions)
    if reductions:
        reductions["layouts"] = "canonical width 1: training TP1/CP2, TP1/CP4, TP1/CP8 against TP1/CP1; rollout TP1"
    train = (TrainLayout(1, 8),) if spec.name.endswith("-7k") else WIDTH_ONE_TRAIN   # the long pass: one CP layout
    return replace(spec, name=spec.name.replace("qwen3-8b", "qwen3-8b-w1"), config=config, train_layouts=train,
                   rollout_tps=(1,), long_context=long, reductions=reductions)


def _bytes(t) -> bytes:
    import torch
    return t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()


def _compare(a, b):
    """(bytes equal, value mismatches, max abs diff), computed where the tensors are (on a GPU a
    256-token variant is 67 M elements: a CPU pass over it cost about a second per comparison)."""
    import torch
    a, b = a.detach(), b.detach().to(a.device)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, a.numel(), float("inf")
    ne = int(torch.ne(a, b).sum())
    diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    raw = lambda t: t.contiguous().view(-1).view(torch.uint8)          # noqa: E731
    return bool(torch.equal(raw(a), raw(b))), ne, diff


class _Inputs:
    """The fixed inputs; ``dry``: placeholders of the same shapes, dtypes and devices, nothing drawn
    (what a dry run that only records the kernels' specialisations needs)."""

    def __init__(self, shape: CheckShape, device: str, weights=None, dry: bool = False, dtype=None):
        import torch
        cfg = shape.config
        gen = torch.Generator().manual_seed(INPUT_SEED)
        # on CUDA the operators run as the model does: bf16 tensors, fp32 accumulation inside the kernels
        dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
        self.batch = max(shape.batch_sizes)
        if dry:
            self.hidden = torch.empty(self.batch, shape.seq_len, cfg.hidden, dtype=dtype, device=device)
            self.targets = torch.zeros(self.batch, shape.seq_len, dtype=torch.long, device=device)
            self.subsets = {n: torch.arange(n, device=device) for n in shape.batch_sizes}
            if weights is None:                 # (the embedding is not read by the check)
                weights = {k: torch.empty(v, dtype=dtype, device=device)
                           for k, v in weight_shapes(cfg, layers=1).items() if k != "embed"}
        else:
            self.hidden = torch.randn(self.batch, shape.seq_len, cfg.hidden, generator=gen).to(device, dtype)
            self.targets = torch.randint(0, cfg.vocab, (self.batch, shape.seq_len), generator=gen).to(device)
            self.subsets = {n: torch.randperm(self.batch, generator=gen)[:n].sort().values.to(device)
                            for n in shape.batch_sizes}
        if weights is None:
            weights = {k: v.to(device, dtype) for k, v in init_weights(cfg, INPUT_SEED, layers=1).items()}
        self.weights = weights
        self.layer = layer_weights(self.weights, 0)
        self.rope = tuple(t.to(device, dtype) for t in rope_table(cfg, shape.seq_len))

    def state(self) -> dict:
        """The tensors a check process needs (the embedding is not one of them)."""
        return {"hidden": self.hidden, "targets": self.targets, "subsets": self.subsets, "rope": self.rope,
                "weights": {k: v for k, v in self.weights.items() if k != "embed"}}

    @classmethod
    def from_state(cls, state: dict, device: str) -> "_Inputs":
        """The same values on ``device`` (bf16 drawn on the CPU and moved: the bits of a direct draw)."""
        inp = cls.__new__(cls)
        inp.hidden, inp.targets = state["hidden"].to(device), state["targets"].to(device)
        inp.subsets = {n: t.to(device) for n, t in state["subsets"].items()}
        inp.batch = inp.hidden.shape[0]
        inp.rope = tuple(t.to(device) for t in state["rope"])
        inp.weights = {k: v.to(device) for k, v in state["weights"].items()}
        inp.layer = layer_weights(inp.weights, 0)
        return inp


# --- one module under one variant ---------------------------------------------------------------------

def _rowwise(module, impl, inp, cfg, rows, targets, tp, side="train"):
    if module == "ffn":
        return ops.ffn_module(impl, inp.layer, cfg, rows, tp)
    return ops.logp_module(impl, inp.weights, cfg, rows, targets, tp, side=side)


def _train_variant(module, impl, inp, cfg, x, targets, layout: TrainLayout):
    import torch
    batch, length, _ = x.shape
    positions = zigzag_positions(length, layout.cp)
    if module == "attention":
        outs = ops.attention_module_train(impl, inp.layer, cfg, inp.rope, [x[:, p] for p in positions], positions, layout.tp)
    else:
        outs = [_rowwise(module, impl, inp, cfg, x[:, p].reshape(-1, cfg.hidden), targets[:, p].reshape(-1), layout.tp)
                .view(batch, len(p), *(() if module == "logp" else (cfg.hidden,))) for p in positions]
    order = torch.tensor([q for p in positions for q in p], device=x.device)
    full = torch.cat(outs, dim=1)
    result = torch.empty_like(full)
    result[:, order] = full
    return result


def _rollout_variant(module, impl, inp, cfg, x, targets, tp, prompt_len, steps=None):
    """Prefill the first prompt_len positions, then decode one position at a time (``steps``: only
    the first few, for a dry run: every decode step launches the same specialisations)."""
    import torch
    batch, length, _ = x.shape
    if steps is not None:
        length = min(length, prompt_len + steps)
    outs = []
    if module == "attention":
        cache = ops.KVCache(batch, cfg, length, dtype=x.dtype)
        pos = torch.arange(prompt_len, device=x.device).unsqueeze(0).expand(batch, -1)
        outs.append(ops.attention_module_cached(impl, inp.layer, cfg, inp.rope, x[:, :prompt_len], pos, tp, cache, phase="prefill"))
        for p in range(prompt_len, length):
            step = torch.full((batch, 1), p, device=x.device)
            outs.append(ops.attention_module_cached(impl, inp.layer, cfg, inp.rope, x[:, p:p + 1], step, tp, cache, phase="decode"))
        return torch.cat(outs, dim=1)
    tail = () if module == "logp" else (cfg.hidden,)
    outs.append(_rowwise(module, impl, inp, cfg, x[:, :prompt_len].reshape(-1, cfg.hidden),
                         targets[:, :prompt_len].reshape(-1), tp, "rollout").view(batch, prompt_len, *tail))
    for p in range(prompt_len, length):
        outs.append(_rowwise(module, impl, inp, cfg, x[:, p], targets[:, p], tp, "rollout").view(batch, 1, *tail))
    return torch.cat(outs, dim=1)


GRID_DECODE_STEPS = 8       # batch x TP grid: prefill all but the last 8 positions, then decode them


def _variants(shape: CheckShape):
    """(label, kind, arg): training layouts, rollout TPs (prompt prefill, then decode to the end),
    decode batches (each at one rollout TP, full decode), and the grid of every decode batch under
    every rollout TP (prefill of all but the last ``GRID_DECODE_STEPS`` positions at that batch and
    TP, then their decode steps) -- prefill and decode at each batch size and TP layout."""
    train = shape.train_layouts or tuple(training_layouts())
    tps = list(shape.rollout_tps or [lay.tp for lay in rollout_layouts()])
    out = [("train " + lay.label, "train", lay) for lay in train]
    out += [(f"rollout TP{tp} prefill+decode", "rollout", RolloutLayout(tp)) for tp in tps]
    paired = [(n, tps[i % len(tps)]) for i, n in enumerate(shape.batch_sizes)]
    out += [(f"decode batch {n} (rollout TP{tp})", "batch", (n, tp, shape.prompt_len)) for n, tp in paired]
    tail = shape.seq_len - GRID_DECODE_STEPS
    out += [(f"batch {n} TP{tp}: prefill {tail}, decode {GRID_DECODE_STEPS}", "batch", (n, tp, tail))
            for tp in tps for n in shape.batch_sizes if shape.grid and (n, tp) not in paired and tail >= 1]
    return out


def _run_variant(module, impl, inp, shape, kind, arg, steps=None):
    cfg = shape.config
    if kind == "train":
        return _train_variant(module, impl, inp, cfg, inp.hidden, inp.targets, arg), None
    if kind == "rollout":
        return _rollout_variant(module, impl, inp, cfg, inp.hidden, inp.targets, arg.tp, shape.prompt_len, steps), None
    n, tp, prompt = arg
    rows = inp.subsets[n]
    return _rollout_variant(module, impl, inp, cfg, inp.hidden[rows], inp.targets[rows], tp, prompt, steps), rows


def _decode_steps(shape: CheckShape, kind, arg) -> int:
    if kind == "train":
        return 0
    return shape.seq_len - (shape.prompt_len if kind == "rollout" else arg[2])


def _module_rows(module, inp, spec, refs, prefix, indices=None):
    """Every variant of one module (or those at ``indices``) against the training TP1/CP1
    reference, R and P."""
    rows = []
    variants = _variants(spec)
    for label, kind, arg in (variants if indices is None else [variants[i] for i in indices]):
        result = {"variant": prefix + label}
        for impl in ("R", "P"):
            out, subset = _run_variant(module, impl, inp, spec, kind, arg)
            ref = refs[impl] if subset is None else refs[impl][subset]
            equal, ne, diff = _compare(out, ref)
            if impl == "R":
                result["strict_bytes_equal"] = equal
            else:
                result["production_mismatches"] = ne
                result["production_max_abs_diff"] = diff
                result["elements"] = out.numel()
        rows.append(result)
    return rows


def run_check(*, device: str = "cpu", shape: str = "smoke", progress=None, timings: dict | None = None) -> dict:
    """Run the oracle; returns the ``rlk-kit/conformance/v1`` document (``passed`` False when R varies).
    ``progress(text)``, when given, hears each step as it starts; ``timings``, when given, receives
    the seconds of each step (the dry run, the ahead-of-time compile, each module pass)."""
    import torch

    started = time.perf_counter()
    spec = check_shape(shape, device)
    fingerprint, rows_by_module = _reference_pass(spec, device, variants=True, progress=progress, timings=timings)
    modules = []
    for module in MODULES:
        rows = rows_by_module[module]
        modules.append({
            "module": module,
            "strict_backend": ops.strict_backend_id(module, device),
            "production_backend": ops.BACKEND_IDS[(module, "P")],
            "strict_invariant": all(r["strict_bytes_equal"] for r in rows),
            "production_mismatched_variants": sum(1 for r in rows if r["production_mismatches"]),
            "production_max_abs_diff": max((r["production_max_abs_diff"] for r in rows), default=0.0),
            "variants": rows,
        })
    return {
        "schema": SCHEMA,
        "shape": spec.name,
        "device": device,
        "model": spec.config.to_json(),
        "config_sha256": spec.config.config_sha256,
        "inputs": {"seed": INPUT_SEED, "seq_len": spec.seq_len, "prompt_len": spec.prompt_len,
                   "batch_sizes": list(spec.batch_sizes), "reference": "strict and production each against their own training TP1/CP1 output"},
        "reductions": spec.reductions,
        "torch": torch.__version__,
        "modules": modules,
        "passed": all(m["strict_invariant"] for m in modules),
        "fingerprint": fingerprint,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


def conformance_fingerprint(device: str = "cpu", shape: str = "smoke") -> str:
    """sha256 of the strict outputs on the oracle's fixed inputs (what build records and manifests carry).

    Computes the strict references only, none of the checks: equal to ``run_check``'s fingerprint."""
    return _reference_pass(check_shape(shape, device), device, variants=False)[0]


def _passes(spec: CheckShape) -> list:
    return [(spec, "")] + ([(spec.long_context, "7k: ")] if spec.long_context is not None else [])


def _precompiler(device: str, progress):
    """A pool compiling the strict kernels ahead (CUDA, unless RLK_PRECOMPILE=0), or None."""
    import os

    from rlk_kernels import gpu
    if not str(device).startswith("cuda") or os.environ.get("RLK_PRECOMPILE") == "0" or not gpu.available():
        return None
    try:
        from rlk_kernels.gpu.precompile import Precompiler
        return Precompiler()
    except Exception as exc:                # compiled inline as the run reaches each kernel
        if progress is not None:
            progress(f"no ahead-of-time compile ({exc!r:.120}); kernels compile as they are reached")
        return None


def _dry_run(spec, device: str, variants: bool, pre) -> None:
    """Every strict launch of the pass on placeholder inputs, recorded by ``pre`` and not run."""
    import torch

    with torch.no_grad(), torch.device(device), pre.recording():
        weights = None
        for pass_spec, _ in _passes(spec):
            inp = _Inputs(pass_spec, device, weights=weights, dry=True)
            weights = inp.weights
            todo = [("train", TrainLayout(1, 1))] + ([(k, a) for _, k, a in _variants(pass_spec)] if variants else [])
            for module in MODULES:
                for kind, arg in todo:
                    _run_variant(module, "R", inp, pass_spec, kind, arg, steps=1)


def _draw_inputs(spec, device: str) -> list[dict]:
    """Every pass's inputs on the CPU in ``device``'s dtype (moved there, the bits of a direct draw)."""
    import torch

    dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    states, weights = [], None
    for pass_spec, _ in _passes(spec):
        inp = _Inputs(pass_spec, "cpu", weights=weights, dtype=dtype)
        weights = inp.weights
        states.append(inp.state())
    return states


def _reference_pass(spec, device: str, *, variants: bool, progress=None, timings=None) -> tuple[str, dict[str, list[dict]]]:
    """(fingerprint, rows per module): every module's training TP1/CP1 reference on the fixed inputs
    (the short pass, then the long-context one when the shape has it), hashed into the fingerprint;
    with ``variants`` each reference is also compared with every layout and batch variant.

    On CUDA: the inputs are drawn in a thread while a dry run on placeholders finds the strict
    kernels' specialisations and a pool of processes compiles them (:mod:`rlk_kernels.gpu.precompile`);
    the variants then run as jobs on the same pool (:mod:`rlk_kernels.check_pool`).
    ``timings``, when given, receives the time of each step."""
    import concurrent.futures
    import concurrent.futures.process

    import torch

    timings = {} if timings is None else timings
    started = time.perf_counter()
    pre = _precompiler(device, progress)
    states = None
    if pre is not None:
        drawing = concurrent.futures.ThreadPoolExecutor(1)
        drawn = drawing.submit(_draw_inputs, spec, device)
        try:
            _dry_run(spec, device, variants, pre)
        except Exception as exc:            # what was recorded still compiles; the rest inline
            timings["dry_run_error"] = repr(exc)[:300]
        timings["dry_run_s"] = round(time.perf_counter() - started, 1)
        torch.cuda.empty_cache()            # the placeholders' memory, for the check's processes
        if progress is not None:
            progress(f"dry run: {len(pre.seen)} kernel specialisations to compile on {pre.workers} processes "
                     f"({timings['dry_run_s']} s)")
        states = drawn.result()
        drawing.shutdown()
        timings["inputs_s"] = round(time.perf_counter() - started, 1)
        timings["precompile"] = pre.wait()
        if progress is not None:
            p = timings["precompile"]
            progress(f"compiled {p['specialisations']} specialisations in {p['wall_s']} s "
                     f"({p['compile_s_total']} s of compile on {p['workers']} processes)")
        result = None
        try:
            if variants and pre.workers > 1 and not timings["precompile"]["failed"]:
                from rlk_kernels import check_pool      # (builds on this module)
                result = check_pool.run(spec, device, states, pre.pool, pre.workers, progress, timings)
        except concurrent.futures.process.BrokenProcessPool as exc:   # a worker died: run serially
            timings["jobs_error"] = repr(exc)[:300]
        finally:
            pre.close()
        if result is not None:
            timings["total_s"] = round(time.perf_counter() - started, 1)
            return result
    if states is not None:
        passes = [(ps, prefix, _Inputs.from_state(st, device)) for (ps, prefix), st in zip(_passes(spec), states)]
    else:
        inp = _Inputs(spec, device)
        passes = [(ps, prefix, inp if ps is spec else _Inputs(ps, device, weights=inp.weights))
                  for ps, prefix in _passes(spec)]   # inputs drawn on the CPU, as the first pass's
        timings["inputs_s"] = round(time.perf_counter() - started, 1)
    fingerprint = hashlib.sha256(f"{SCHEMA}|{spec.name}|{spec.config.config_sha256}|{INPUT_SEED}|".encode())
    impls = ("R", "P") if variants else ("R",)   # the fingerprint hashes the strict reference only
    rows_by_module: dict[str, list[dict]] = {}
    done, total = 0, len(MODULES) * len(passes)
    with torch.no_grad(), torch.device(device):
        for module in MODULES:
            rows = []
            for pass_spec, prefix, pass_inp in passes:
                done += 1
                step = time.perf_counter()
                if progress is not None:
                    progress(f"[{done}/{total}] {module}, {prefix.rstrip(': ') or 'short'} pass: "
                             f"{len(_variants(pass_spec)) if variants else 0} variants "
                             f"({time.perf_counter() - started:.0f} s so far)")
                refs = {impl: _run_variant(module, impl, pass_inp, pass_spec, "train", TrainLayout(1, 1))[0]
                        for impl in impls}
                fingerprint.update(module.encode() + prefix.encode() + b"|" + _bytes(refs["R"]))
                if variants:
                    rows += _module_rows(module, pass_inp, pass_spec, refs, prefix)
                del refs
                timings[f"{module} {prefix.rstrip(': ') or 'short'}_s"] = round(time.perf_counter() - step, 1)
            rows_by_module[module] = rows
    timings["total_s"] = round(time.perf_counter() - started, 1)
    return fingerprint.hexdigest(), rows_by_module


def format_table(report: dict) -> str:
    lines = [f"kernel conformance: shape={report['shape']} device={report['device']} torch={report['torch']}"]
    if report["reductions"]:
        lines += [f"  reduced: {k}: {v}" for k, v in report["reductions"].items()]
    header = f"{'module':<10} {'variant':<34} {'R bytes':<8} {'P mismatches':>16} {'P max|diff|':>12}"
    lines += [header, "-" * len(header)]
    for m in report["modules"]:
        for r in m["variants"]:
            lines.append(f"{m['module']:<10} {r['variant']:<34} {'equal' if r['strict_bytes_equal'] else 'DIFFER':<8} "
                         f"{str(r['production_mismatches']) + '/' + str(r['elements']):>16} {r['production_max_abs_diff']:>12.3g}")
    lines.append("-" * len(header))
    for m in report["modules"]:
        lines.append(f"{m['module']:<10} R {'invariant' if m['strict_invariant'] else 'NOT INVARIANT'} ({m['strict_backend']}); "
                     f"P differs in {m['production_mismatched_variants']}/{len(m['variants'])} variants ({m['production_backend']})")
    lines.append(f"fingerprint {report['fingerprint']}")
    lines.append(f"{'PASS' if report['passed'] else 'FAIL'} in {report['elapsed_s']} s")
    return "\n".join(lines)
