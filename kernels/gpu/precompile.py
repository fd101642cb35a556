"""Compile the strict kernels' Triton specialisations in parallel processes, ahead of the run.

A cold GPU run of the conformance oracle spent most of its time compiling: Triton compiles a
kernel once per distinct specialisation (its constexprs, the alignment and unit values of its
integer and pointer arguments) when a launch first reaches it, one after another on one core.
:class:`Precompiler` collects the specialisations a dry run would compile -- every Triton launch
inside :meth:`Precompiler.recording` is skipped and its specialisation sent to a pool of worker
processes as soon as it is seen -- and the workers compile them (and build their launchers) into
the shared Triton cache. The real run then only loads them. Nothing here changes what a kernel
computes: the real run compiles exactly what it would have compiled, from the same cache key; a
specialisation the dry run missed is compiled inline as before.

Example::

    >>> pre = Precompiler(workers=15)                  # doctest: +SKIP
    >>> with pre.recording():                          # doctest: +SKIP
    ...     run_the_strict_path_on_placeholders()
    >>> pre.wait()["specialisations"]                  # doctest: +SKIP
    57
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time


def _compile_one(module: str, name: str, data: str) -> tuple[str, float]:
    """Worker: compile one recorded specialisation and its launcher into the Triton cache."""
    import triton

    started = time.perf_counter()
    fn = getattr(importlib.import_module(module), name)
    kernel = fn.preload(data)
    if kernel is not None:
        triton.runtime.driver.active.launcher_cls(kernel.src, kernel.metadata)
    return f"{module.rsplit('.', 1)[-1]}.{name}", round(time.perf_counter() - started, 2)


def _warm() -> float:
    """Worker: import Triton and the kernels and read the GPU target before the first compile."""
    import triton

    started = time.perf_counter()
    for module in ("triton_attention", "triton_gemm", "triton_logp", "triton_pointwise"):
        importlib.import_module(f"rlk_kernels.gpu.{module}")
    triton.runtime.driver.active.get_current_target()
    return time.perf_counter() - started


def _importable_by_children() -> None:
    """Spawned workers import ``rlk_kernels`` through the parent's ``sys.path``; a source checkout
    registered under that name by path (the benchmark does) gets a link on it."""
    import importlib.machinery
    import pathlib
    import sys
    import tempfile

    if importlib.machinery.PathFinder.find_spec("rlk_kernels", sys.path) is not None:
        return
    package = pathlib.Path(importlib.import_module("rlk_kernels").__path__[0])
    folder = pathlib.Path(tempfile.mkdtemp(prefix="rlk-kernels-path-"))
    (folder / "rlk_kernels").symlink_to(package, target_is_directory=True)
    sys.path.append(str(folder))


def default_workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))


class Precompiler:
    """A pool of compile processes fed by recorded launches (see the module docstring); the pool
    (:attr:`pool`) also takes other work once the compiles are done."""

    def __init__(self, workers: int | None = None):
        import concurrent.futures
        import multiprocessing

        _importable_by_children()
        self.workers = workers or default_workers()
        self.started = time.perf_counter()
        self.seen: dict[str, tuple[str, str]] = {}
        self.futures = []
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        self.warming = [self.pool.submit(_warm) for _ in range(self.workers)]

    def _hook(self, **kwargs):
        data = kwargs["compile"]["specialization_data"]
        info = kwargs["fn"]
        if data not in self.seen:
            self.seen[data] = (info.module, info.name)
            self.futures.append(self.pool.submit(_compile_one, info.module, info.name, data))
        return True                                  # skip this process's compile, and so the launch

    @contextlib.contextmanager
    def recording(self):
        """Within: Triton launches are not run; each new specialisation goes to the pool."""
        from triton import knobs

        previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook
        try:
            yield self
        finally:
            knobs.runtime.jit_cache_hook = previous

    def wait(self) -> dict:
        """Wait for every compile; returns counts and times (the slowest specialisations first).
        A failed compile is not an error here: the real run compiles it inline and reports it."""
        compiled, failed = [], []
        for future in self.futures:
            try:
                compiled.append(future.result())
            except Exception as exc:              # compiled again (and reported) by the real run
                failed.append(repr(exc)[:200])
        compiled.sort(key=lambda item: -item[1])
        return {"specialisations": len(self.seen), "workers": self.workers, "failed": failed,
                "wall_s": round(time.perf_counter() - self.started, 1),
                "compile_s_total": round(sum(s for _, s in compiled), 1), "slowest": compiled[:8]}

    def close(self) -> None:
        """Stop the worker processes (after any jobs run on :attr:`pool` are done)."""
        self.pool.shutdown()
