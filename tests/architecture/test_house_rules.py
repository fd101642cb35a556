"""The house rules of kit/, read from its source: where engines, log keys, Docker, Ray and GPUs may be
named, how large a module may grow, where kit modules are imported, and how fast `kit --help` starts.

Each rule states what docs/architecture.md promises a newcomer; a change that breaks one fails here with
the file and line to move.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from kit.engines import ENGINES
from kit.engines.vime.keys import LOG_KEYS

KIT = Path(__file__).resolve().parents[2] / "kit"
MAX_MODULE_LINES = 450
MAX_LOCAL_KIT_IMPORTS = 10
# third-party SDK -> the one module allowed to import it
ONE_DOOR = {"docker": "adapters/docker.py", "ray": "adapters/ray.py", "pynvml": "adapters/gpus.py"}


def modules():
    for path in sorted(KIT.rglob("*.py")):
        yield path.relative_to(KIT).as_posix(), ast.parse(path.read_text(), str(path)), path


def outside_engines():
    return [(rel, tree) for rel, tree, _ in modules() if not rel.startswith("engines/")]


def test_no_module_is_longer_than_the_limit():
    long = {rel: len(path.read_text().splitlines()) for rel, _, path in modules()}
    assert {rel: n for rel, n in long.items() if n > MAX_MODULE_LINES} == {}


def test_kit_modules_are_imported_at_module_top():
    local = []
    for rel, tree, path in modules():
        lines = path.read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and sub.level == 0 and (sub.module or "").split(".")[0] == "kit":
                        local.append((rel, sub.lineno, "#" in lines[sub.lineno - 1]))
    assert len(local) <= MAX_LOCAL_KIT_IMPORTS, local
    assert [hit for hit in local if not hit[2]] == [], "a function-local kit import needs a comment saying why"


def test_no_engine_name_is_compared_outside_kit_engines():
    names = set(ENGINES)
    found = []
    for rel, tree in outside_engines():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                     for op in node.ops):
                sides = [node.left, *node.comparators]
                constants = {s.value for s in sides if isinstance(s, ast.Constant)}
                constants |= {e.value for s in sides if isinstance(s, (ast.Tuple, ast.Set, ast.List))
                              for e in s.elts if isinstance(e, ast.Constant)}
                if constants & names and "engine" in ast.unparse(node):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_vime_log_keys_are_named_only_in_kit_engines():
    keys = set(LOG_KEYS)
    found = [f"{rel}:{node.lineno}: {node.value}" for rel, tree in outside_engines() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in keys]
    assert found == []


def test_docker_ray_and_gpu_sdks_each_have_one_door():
    found = []
    for rel, tree, _ in modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                if top in ONE_DOOR and rel != ONE_DOOR[top]:
                    found.append(f"{rel}:{node.lineno}: import {name}")
    assert found == []


def test_gpu_listing_has_one_door():
    # nvidia-smi's --query-gpu (the listing; dmon sampling is a monitor) and rocm-smi's product query
    hits = [rel for rel, tree, _ in modules() for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value.startswith("--query-gpu") or node.value == "--showproductname")]
    assert set(hits) <= {"adapters/gpus.py"}, hits


def test_kit_help_starts_fast():
    """`kit --help` imports no command module: over a bare interpreter it costs < 0.1 s of CPU.

    CPU time (user + system, from wait4) and not wall time: on a loaded machine the wall clock
    measures the neighbours; benchmarks/cli_startup.py reports the wall time too.
    """
    def best_cpu(argv, n=5):
        times = []
        for _ in range(n):
            child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            assert child.returncode == 0, argv
            times.append(usage.ru_utime + usage.ru_stime)
        return min(times)

    bare = best_cpu([sys.executable, "-c", "pass"])
    kit_help = best_cpu([sys.executable, "-m", "kit", "--help"])
    assert kit_help - bare < 0.1, (kit_help, bare)
