"""The tamper matrix: every way an attacker or an accident can change a sealed run dir, and the rule
that each is detected. Used by tests/evidence/test_tamper.py and benchmarks/evidence_report.py.

A case copies a sealed run dir, changes it, then runs verification under a policy:
``integrity`` (no key: what anyone can check), ``key`` (--key of the sealer). Expectation:
``fail`` (the verdict fails) or ``unsigned`` (integrity holds, and the verdict says the seal is
unsigned, so nobody vouches for it). Example::

    for case in cases(artifacts):
        outcome = run_case(case, unsigned_src, signed_src, pub, work)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.evidence.signing import sign_seal
from kit.model.documents import dumps_pretty, sha256_of_file


@dataclass(frozen=True)
class Case:
    id: str
    change: Callable[[Path], None]
    source: str = "unsigned"        # which sealed copy it starts from: unsigned | signed
    policy: str = "integrity"       # integrity (no key) | key (--key of the sealer)
    expect: str = "fail"            # fail | unsigned


def writable(path: Path) -> None:
    for p in [path, *path.parents][:2]:
        if p.exists() and not p.is_symlink():
            p.chmod(stat.S_IMODE(p.lstat().st_mode) | stat.S_IWUSR)


def edit(rel: str, fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        path = run_dir / rel
        writable(path)
        path.write_bytes(fn(path.read_bytes()))
    return change


def flip(at: float) -> Callable[[bytes], bytes]:
    def fn(data: bytes) -> bytes:
        i = min(len(data) - 1, int(len(data) * at))
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
    return fn


def replace_with(rel: str, make: Callable[[Path, Path], None]) -> Callable[[Path], None]:
    """Remove the file and put something else (made by ``make(path, run_dir)``) in its place."""
    def change(run_dir: Path) -> None:
        path = run_dir / rel
        writable(path)
        saved = run_dir.parent / f"saved-{path.name}"
        shutil.copy2(path, saved)
        path.unlink()
        make(path, saved)
    return change


def _symlink_inside(path: Path, saved: Path) -> None:
    inside = path.parent / f".{path.name}.real"
    shutil.copy2(saved, inside)
    os.symlink(inside.name, path)


def _symlink_outside(path: Path, saved: Path) -> None:
    os.symlink(saved, path)


def _fifo(path: Path, saved: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path, saved: Path) -> None:
    os.symlink("/dev/zero", path)


def _hard_link_outside(path: Path, saved: Path) -> None:
    os.link(saved, path)


def chmod(rel: str, bits: int) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        path = run_dir / rel
        path.chmod(stat.S_IMODE(path.stat().st_mode) | bits)
    return change


def remove(rel: str) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        writable(run_dir / rel)
        (run_dir / rel).unlink()
    return change


def rename(rel: str, to: str) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        writable(run_dir / rel)
        (run_dir / rel).rename(run_dir / to)
    return change


def add_file(rel: str, data: bytes = b"{}\n") -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        path = run_dir / rel
        writable(path.parent)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return change


def add_special(rel: str, kind: str) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        path = run_dir / rel
        writable(path.parent)
        {"fifo": lambda: os.mkfifo(path), "dir": lambda: path.mkdir(),
         "link-out": lambda: os.symlink("/etc/hostname", path), "link-zero": lambda: os.symlink("/dev/zero", path),
         "link-dir-out": lambda: os.symlink("/etc", path), "link-loop": lambda: os.symlink(path.name, path)}[kind]()
    return change


# --- the seal ------------------------------------------------------------------------------------

def _seal(run_dir: Path) -> dict:
    return json.loads((run_dir / E.SEAL).read_text())


def _write_seal(run_dir: Path, seal: dict) -> None:
    path = run_dir / E.SEAL
    writable(path)
    path.write_text(dumps_pretty(seal))


def seal_field(mutate: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit the seal's JSON without recomputing anything."""
    def change(run_dir: Path) -> None:
        seal = _seal(run_dir)
        mutate(seal)
        _write_seal(run_dir, seal)
    return change


def recompute(run_dir: Path, seal: dict, *, key=None) -> None:
    """Recompute every hash of the seal from the directory as it is now (what a forger does)."""
    for art in seal["artifacts"]:
        path = run_dir / art["path"]
        art["sha256"], art["size"] = sha256_of_file(path), path.stat().st_size
    seal["root_sha256"] = E.root_sha256(seal["artifacts"])
    listed = {a["path"]: a for a in seal["artifacts"]}
    seal["manifest_sha256"] = listed[E.MANIFEST]["sha256"]
    seal["validation_sha256"] = listed[E.VALIDATION]["sha256"]
    seal.pop("signature", None)
    seal["seal_sha256"] = E.seal_sha256(seal)
    if key is not None:
        seal["signature"] = sign_seal(seal, key)
    _write_seal(run_dir, seal)


def forge(doc_edits: dict[str, Callable[[dict], None]], seal_edit: Callable[[dict], None] | None = None, *,
          key=None) -> Callable[[Path], None]:
    """Edit sealed JSON documents (and the seal), then recompute the whole seal (unsigned, or signed with ``key``)."""
    def change(run_dir: Path) -> None:
        for rel, mutate in doc_edits.items():
            path = run_dir / rel
            doc = json.loads(path.read_text())
            mutate(doc)
            writable(path)
            path.write_text(dumps_pretty(doc))
        seal = _seal(run_dir)
        if seal_edit:
            seal_edit(seal)
        recompute(run_dir, seal, key=key)
    return change


def _set(*path_value):
    *keys, value = path_value

    def mutate(doc):
        for k in keys[:-1]:
            doc = doc[k]
        doc[keys[-1]] = value
    return mutate


def _flip_b64(text: str) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def cases(artifacts: list[str], other_key) -> list[Case]:
    """The whole matrix for a sealed run holding ``artifacts``; ``other_key`` is a foreign private key."""
    out: list[Case] = []
    for rel in [*artifacts, E.SEAL]:
        name = rel.replace("/", "_")
        out += [
            Case(f"{name}:flip-first", edit(rel, flip(0.0))),
            Case(f"{name}:flip-middle", edit(rel, flip(0.5))),
            Case(f"{name}:flip-last", edit(rel, flip(1.0))),
            Case(f"{name}:truncate-empty", edit(rel, lambda d: b"")),
            Case(f"{name}:truncate-one", edit(rel, lambda d: d[:-1])),
            Case(f"{name}:append-byte", edit(rel, lambda d: d + b"\n")),
            Case(f"{name}:append-1MiB", edit(rel, lambda d: d + b" " * (1 << 20))),
            Case(f"{name}:remove", remove(rel)),
            Case(f"{name}:rename", rename(rel, rel + ".renamed")),
            Case(f"{name}:symlink-inside", replace_with(rel, _symlink_inside)),
            Case(f"{name}:symlink-outside", replace_with(rel, _symlink_outside)),
            Case(f"{name}:fifo", replace_with(rel, _fifo)),
            Case(f"{name}:dev-zero-link", replace_with(rel, _dev_zero)),
            Case(f"{name}:hard-link-outside", replace_with(rel, _hard_link_outside)),
        ]
        if rel != E.SEAL:
            out += [Case(f"{name}:mode-exec", chmod(rel, stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)),
                    Case(f"{name}:mode-setgid", chmod(rel, stat.S_ISGID))]
    first, last = 0, len(artifacts) - 1
    field_edits = {
        "schema": _set("schema", "rlk-kit/seal/v1"), "run_id": _set("run_id", "someone-else"),
        "run_id-newline": lambda s: s.__setitem__("run_id", s["run_id"] + "\n"), "sealed_at": _set("sealed_at", "2020-01-01T00:00:00.000000Z"),
        "kit_version": _set("kit_version", "9.9.9"), "algorithm": _set("algorithm", "md5"),
        "root_sha256": _set("root_sha256", "0" * 64), "manifest_sha256": _set("manifest_sha256", "0" * 64),
        "validation_sha256": _set("validation_sha256", "0" * 64), "seal_sha256": _set("seal_sha256", "0" * 64),
        "validation_passed": lambda s: s.__setitem__("validation_passed", not s["validation_passed"]),
        "gate_set_version": _set("gate_set_version", "rlk-kit-gates/0"),
        "first-sha256": _set("artifacts", first, "sha256", "0" * 64), "last-sha256": _set("artifacts", last, "sha256", "f" * 64),
        "first-size": lambda s: s["artifacts"][first].__setitem__("size", s["artifacts"][first]["size"] + 1),
        "first-mode": _set("artifacts", first, "mode", "0555"), "first-path": _set("artifacts", first, "path", "other.json"),
        "path-escape": _set("artifacts", first, "path", "../outside.json"),
        "path-absolute": _set("artifacts", first, "path", "/etc/hostname"),
        "drop-artifact": lambda s: s["artifacts"].pop(last), "duplicate-artifact": lambda s: s["artifacts"].append(dict(s["artifacts"][0])),
        "extra-field": _set("trusted", True), "artifacts-empty": _set("artifacts", []),
    }
    for field_name, mutate in field_edits.items():
        out.append(Case(f"seal-field:{field_name}", seal_field(mutate)))
        out.append(Case(f"seal-field:{field_name}:signed", seal_field(mutate), source="signed", policy="key"))
    out += [
        Case("seal-signature:removed", seal_field(lambda s: s.pop("signature")), source="signed", policy="key"),
        Case("seal-signature:value-flipped", seal_field(lambda s: s["signature"].__setitem__("value", _flip_b64(s["signature"]["value"]))),
             source="signed", policy="integrity"),
        Case("seal-signature:key-swapped", seal_field(lambda s: s["signature"].__setitem__("public_key", _flip_b64(s["signature"]["public_key"]))),
             source="signed", policy="integrity"),
        Case("seal-signature:added-garbage", seal_field(lambda s: s.__setitem__("signature", {"algorithm": "ed25519"}))),
        Case("seal:deep-nesting", edit(E.SEAL, lambda d: b"[" * 100000 + b"]" * 100000)),
        Case("seal:20MiB", edit(E.SEAL, lambda d: d[:-2] + b"," + b'"x":"' + b"y" * (20 << 20) + b'"}')),
        Case("seal:not-json", edit(E.SEAL, lambda d: b"\xff\xfe garbage")),
        Case("seal:1e400", edit(E.SEAL, lambda d: d.replace(b'"algorithm"', b'"x": 1e400, "algorithm"'))),
    ]
    passed_false = {E.VALIDATION: _set("passed", True)}
    out += [
        # whole-seal recomputation by a forger: integrity holds, so it must be reported as unsigned, and fail under --key
        Case("forge:verdict-recomputed", forge(passed_false, _set("validation_passed", True)), expect="unsigned"),
        Case("forge:verdict-recomputed:key", forge(passed_false, _set("validation_passed", True)), source="signed", policy="key"),
        Case("forge:log-recomputed", forge({}, None), source="signed", expect="unsigned"),
        Case("forge:resigned-other-key", forge(passed_false, _set("validation_passed", True), key=other_key), source="signed",
             policy="key"),
        Case("forge:resigned-other-key:integrity", forge(passed_false, _set("validation_passed", True), key=other_key),
             source="signed", expect="signed-other"),
        # a recomputed seal that disagrees with the documents it seals
        Case("cross:validation-passed", forge({}, _set("validation_passed", False))),
        Case("cross:validation-gate-set", forge({E.VALIDATION: _set("gate_set_version", "rlk-kit-gates/0")})),
        Case("cross:seal-gate-set", forge({}, _set("gate_set_version", "rlk-kit-gates/0"))),
        Case("cross:validation-run-id", forge({E.VALIDATION: _set("run_id", "other")})),
        Case("cross:manifest-run-id", forge({E.MANIFEST: _set("run_id", "other")})),
        Case("cross:manifest-kit-version", forge({E.MANIFEST: _set("kit_version", "9.9.9")})),
        Case("cross:seal-kit-version", forge({}, _set("kit_version", "9.9.9"))),
        Case("cross:status-failed", forge({E.STATUS: _set("status", "failed")})),
        Case("cross:status-run-id", forge({E.STATUS: _set("run_id", "other")})),
        Case("cross:seal-run-id", forge({}, _set("run_id", "other"))),
        Case("cross:manifest-not-schema", forge({E.MANIFEST: _set("schema", "rlk-kit/stack/v1")})),
        # added entries
        Case("added:top-file", add_file("extra.json")),
        Case("added:hidden-file", add_file(".hidden")),
        Case("added:nested-file", add_file("monitors/extra.txt", b"x")),
        Case("added:new-dir-file", add_file("new/deep/file.txt", b"x")),
        Case("added:empty-dir", add_special("emptydir", "dir")),
        Case("added:fifo", add_special("pipe", "fifo")),
        Case("added:link-out", add_special("hostname", "link-out")),
        Case("added:link-dev-zero", add_special("zero", "link-zero")),
        Case("added:link-dir-out", add_special("etc", "link-dir-out")),
        Case("added:link-loop", add_special("loop", "link-loop")),
        Case("added:stale-seal-temp-different", add_file(".seal.json.tmp-1", b"{}")),
        Case("run-dir:renamed", lambda d: d.rename(d.with_name(d.name + "-x"))),
    ]
    return out


@dataclass
class Outcome:
    case: Case
    detected: bool
    status: str
    trust: str | None
    seconds: float
    problems: list
    error: str | None = None


def run_case(case: Case, sources: dict[str, Path], public_key: Path, work: Path) -> Outcome:
    run_dir = work / "runs" / sources[case.source].name
    if run_dir.parent.exists():
        _rmtree(work)
    run_dir.parent.mkdir(parents=True)
    shutil.copytree(sources[case.source], run_dir, symlinks=True)
    (run_dir.parent / E.ID_REGISTRY).write_text(run_dir.name + "\n")
    case.change(run_dir)
    if not run_dir.exists():       # the run dir itself was renamed
        run_dir = next(p for p in run_dir.parent.iterdir() if p.is_dir())
    start = time.monotonic()
    try:
        verdict = verify_run_dir(run_dir, public_key if case.policy == "key" else None,
                                 require_signature=case.policy == "key")
    except Exception as exc:        # a traceback is a failure of the matrix, counted, never hidden
        return Outcome(case, False, "traceback", None, time.monotonic() - start, [], f"{type(exc).__name__}: {exc}")
    seconds = time.monotonic() - start
    if case.expect == "unsigned":
        detected = verdict.status == "ok" and verdict.trust == "unsigned" or verdict.status == "fail"
    elif case.expect == "signed-other":
        detected = verdict.trust in ("signed", "unsigned") and verdict.trust != "trusted"
    else:
        detected = verdict.status == "fail"
    return Outcome(case, detected, verdict.status, verdict.trust, seconds, verdict.problems)


def _rmtree(path: Path) -> None:
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = Path(dirpath, d)
            if not p.is_symlink():
                p.chmod(0o755)
    shutil.rmtree(path)
