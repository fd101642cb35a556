"""Property-based fuzzing of every reader and CLI input the evidence layer has (over 1,000 cases in all):
each input ends in a value, a verdict or one BadInput line, never a traceback or a hang.

Every case runs under a 10 s alarm; a hang fails the case."""

from __future__ import annotations

import json
import os
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from kit.cli import cli
from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.evidence.verify import verify_document_file
from kit.gates.engine import gate_set_from_document
from kit.model.documents import MAX_DEPTH, dumps_pretty, parse_json_bytes, read_json_file, shipped_schemas
from kit.model.errors import BadInput, KitError

from conftest import run_manifest, seal_test_run

def fuzz(examples: int):
    """No per-example deadline (the alarm below catches hangs); the seed policy is the profile's (tests/conftest.py)."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                          max_leaves=20)
schema_ids = st.sampled_from(shipped_schemas() + ["rlk-kit/seal/v9", "rlk-kit/x", "other/thing/v1", ""])


@contextmanager
def no_hang(seconds: int = 10):
    def _alarm(signum, frame):
        raise TimeoutError(f"hung for {seconds} s")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@fuzz(300)
@given(raw=st.one_of(st.binary(max_size=200), json_value.map(lambda v: json.dumps(v).encode()),
                     st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
                     st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
                     st.sampled_from([b"1e400", b"-1e999", b"NaN", b'{"x": Infinity}', b"1" * 5000, b"\xff\xfe",
                                      b'"\\ud800"', b"[1e308, 1e308]"])))
def test_parse_json_bytes_is_a_value_or_one_bad_input(raw):
    with no_hang():
        try:
            parse_json_bytes(raw, "fuzz.json")
        except BadInput as exc:
            assert "\n" not in str(exc) and str(exc).startswith("fuzz.json: ")


@fuzz(250)
@given(doc=st.one_of(json_value, st.fixed_dictionaries({"schema": schema_ids}, optional={
    "name": json_value, "stack": json_value, "engine": json_value, "artifacts": json_value, "run_id": json_value})))
def test_verify_document_file_gives_a_verdict(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("doc") / "doc.json"
    path.write_text(json.dumps(doc))
    with no_hang():
        verdict = verify_document_file(path)
    assert verdict.status in ("ok", "fail", "unreadable")


@pytest.fixture(scope="module")
def sealed_template(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    run_dir = E.create_run_dir(ws, "fuzz-run")
    E.write_document(run_dir, E.MANIFEST, run_manifest("smoke", "fuzz-run"))
    E.write_new_text(run_dir, E.RUN_LOG, "step 0: {}\n")
    seal_test_run(run_dir, "fuzz-run")
    return run_dir


SEAL_PATHS = ["run_id", "sealed_at", "kit_version", "algorithm", "artifacts", "root_sha256", "manifest_sha256",
              "validation_sha256", "validation_passed", "gate_set_version", "seal_sha256", "signature", "schema"]


@fuzz(250)
@given(field=st.sampled_from(SEAL_PATHS + ["artifacts/0/path", "artifacts/0/size", "artifacts/0/mode", "artifacts/0"]),
       value=json_value, drop=st.booleans())
def test_verify_run_dir_gives_a_verdict_for_any_seal_field(sealed_template, tmp_path_factory, field, value, drop):
    import shutil

    run_dir = tmp_path_factory.mktemp("runs") / "fuzz-run"
    shutil.copytree(sealed_template, run_dir)
    (run_dir.parent / E.ID_REGISTRY).write_text("fuzz-run\n")
    seal = json.loads((run_dir / E.SEAL).read_text())
    target, *rest = field.split("/")
    holder, key = (seal, target) if not rest else (seal["artifacts"][0], rest[-1]) if len(rest) == 2 else (seal["artifacts"], 0)
    if drop and isinstance(holder, dict):
        holder.pop(key, None)
    else:
        holder[key] = value
    (run_dir / E.SEAL).chmod(0o644)
    (run_dir / E.SEAL).write_text(dumps_pretty(seal))
    with no_hang():
        verdict = verify_run_dir(run_dir)
    assert verdict.status in ("fail", "unreadable", "ok")
    if verdict.status == "ok":      # only an edit that changes nothing passes
        assert seal == json.loads((sealed_template / E.SEAL).read_text())


@fuzz(150)
@given(index=st.integers(0, 10), key=st.sampled_from(["id", "rule", "parameters", "message", "applies", "extra"]),
       value=json_value)
def test_a_fuzzed_gate_set_is_a_gate_set_or_bad_input(index, key, value):
    from importlib import resources

    doc = json.loads(resources.files("kit.gates").joinpath("sets", "rlk-kit-gates.v2.json").read_text())
    doc["gates"][index][key] = value
    with no_hang():
        try:
            gate_set_from_document(doc, "fuzz.json")
        except BadInput as exc:
            assert str(exc).startswith("fuzz.json: ")


@fuzz(200)
@given(run_id=st.text(max_size=140))
def test_run_ids_are_strict(run_id):
    try:
        E.check_run_id(run_id)
    except BadInput as exc:
        assert "--run-id" in str(exc)
        return
    assert run_id == run_id.strip() and "/" not in run_id and not any(c.isspace() or ord(c) < 32 for c in run_id)
    assert run_id not in (".", "..") and len(run_id) <= 128


@fuzz(100)
@given(contents=st.lists(st.one_of(st.binary(max_size=80), json_value.map(lambda v: json.dumps(v).encode())),
                         min_size=1, max_size=3))
def test_kit_verify_over_many_files_gives_every_verdict(tmp_path_factory, contents):
    directory = tmp_path_factory.mktemp("many")
    paths = []
    for i, data in enumerate(contents):
        (directory / f"{i}.json").write_bytes(data)
        paths.append(str(directory / f"{i}.json"))
    good = str(Path(__file__).resolve().parents[2] / "manifests" / "smoke.json")
    with no_hang(30):
        result = CliRunner().invoke(cli, ["verify", "--json", good, *paths])
    assert result.exit_code in (0, 1, 2) and not isinstance(result.exception, Exception) or \
        isinstance(result.exception, SystemExit), result.output
    doc = json.loads(result.stdout)
    assert [r["path"] for r in doc["results"]] == [good, *paths]
    assert doc["results"][0]["status"] == "ok"


def test_readers_refuse_fifos_devices_and_deep_nesting_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with no_hang(5):
        for path in (fifo, Path("/dev/zero"), tmp_path):
            with pytest.raises(BadInput):
                read_json_file(path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(BadInput, match="nested deeper"):
        read_json_file(deep)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    with pytest.raises(KitError):
        read_json_file(tmp_path / "missing.json")
