"""Property-based: every mutation of a valid lock gets a clean verdict, never a traceback."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from kit.evidence.verify import verify_document_file

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
LOCKS = ["G10.json", "native.json", "smoke.json", "stack-vime-g11.json", "stack-vime-base.json", "module-matrix.json"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)


def paths_of(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths_of(v, prefix + (i,))


def mutate(doc, path, action, value):
    doc = copy.deepcopy(doc)
    if not path:
        return value if action == "replace" else doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if action == "delete":
        del parent[key]
    elif action == "replace":
        parent[key] = value
    elif action == "add" and isinstance(parent, dict):
        parent[f"x_{key}"] = value
    return doc


@st.composite
def mutated_locks(draw):
    name = draw(st.sampled_from(LOCKS))
    doc = json.loads((MANIFESTS / name).read_text())
    path = draw(st.sampled_from(list(paths_of(doc))))
    action = draw(st.sampled_from(["delete", "replace", "add"]))
    value = draw(json_values)
    return name, doc, mutate(doc, path, action, value), path, action


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated_locks())
def test_mutations_get_a_clean_verdict(tmp_path_factory, case):
    name, original, mutated, path, action = case
    workdir = tmp_path_factory.mktemp("locks")
    shutil.copytree(MANIFESTS, workdir, dirs_exist_ok=True)
    target = workdir / name
    target.write_text(json.dumps(mutated))
    verdict = verify_document_file(target)          # must not raise
    assert verdict.status in ("ok", "fail")
    assert all(isinstance(p, str) and isinstance(m, str) and m for p, m in verdict.problems)
    if mutated == original:
        assert verdict.status == "ok"
    if action == "delete" and path and path[0] in ("schema", "name") and len(path) == 1:
        assert verdict.status == "fail"


SHA_FIELDS = st.text(alphabet="0123456789abcdef", min_size=1, max_size=39) | st.text(alphabet="ghijklmnop-/_.", min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(bad=SHA_FIELDS)
def test_any_non_full_commit_is_refused(tmp_path_factory, bad):
    workdir = tmp_path_factory.mktemp("locks")
    shutil.copytree(MANIFESTS, workdir, dirs_exist_ok=True)
    doc = json.loads((workdir / "stack-vime-g11.json").read_text())
    doc["sources"][0]["commit"] = bad
    (workdir / "stack-vime-g11.json").write_text(json.dumps(doc))
    verdict = verify_document_file(workdir / "stack-vime-g11.json")
    assert verdict.status == "fail"
    assert any(p == "/sources/0/commit" for p, _ in verdict.problems)


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(tmp_path_factory, raw):
    target = tmp_path_factory.mktemp("bytes") / "x.json"
    target.write_bytes(raw)
    verdict = verify_document_file(target)
    assert verdict.status in ("fail", "unreadable")
