"""The claim workflow on the smoke pair, for real: a claim sealed before its runs, the runs bound to it
(3 seeds x native/consistency), evaluated exactly as declared, the verdict checked by kit verify, and the
reviewer's page rendered in Debian's headless chromium (scripts/ensure-browser.sh installs it).

Cases: supported (the v1 example, one criterion); not supported (a v2 claim of two criteria, one the
data meets and one it cannot); incomplete (a declared seed left out); refused (runs made without the
claim); kit verify refusing an edited claim, an edited verdict and swapped runs, and still checking a
v1 verdict; the page's DOM (verdict, every table, every image loaded, nothing fetched) and screenshots
(laptop and narrow), kept in the test's tmp dir, for the one-criterion and the two-criterion verdict."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.documents import schema_problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "claims" / "smoke-mismatch.json"
pytestmark = pytest.mark.slow


def kit(*args, cwd: Path, timeout=600):
    # this checkout's kit, whatever the installed one points at (the site is outside the repository)
    env = dict(os.environ, KIT_WORKSPACE=str(cwd / "ws"), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def ok(proc, code=0):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-1500:], proc.stderr[-2500:])
    assert "Traceback" not in proc.stderr
    return proc


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Runs made before any claim (unbound), then two sealed claims and their bound runs."""
    site = tmp_path_factory.mktemp("claims")
    for mode in ("native", "consistency"):
        ok(kit("run", "--arm", "smoke", "--mode", mode, "--seeds", "1", "--rollouts", "2", "--allow-dirty", "--json",
               cwd=site))
    ok(kit("claim", "seal", str(EXAMPLE), "--out", "supported.sealed.json", cwd=site))
    doc = json.loads(EXAMPLE.read_text())
    metric = doc.pop("metric")
    # two criteria over the same runs: the data meets the first, not the second (false by construction)
    doc.update(schema="rlk-kit/claim/v2", name="smoke-more-mismatches", seeds=[1],
               hypothesis="R/R shows no mismatched token, and at least as many mismatched tokens per step as P/P.",
               criteria=[{"name": "no-mismatch", "metric": metric, "rule": {"kind": "zero-and-positive", "min_tokens": 100}},
                         {"name": "more-mismatches", "metric": metric, "rule": {"kind": "difference-lower-bound", "bound": 0.0}}],
               inconclusive="The 95 % CI of R/R − P/P mismatched tokens per step contains 0.")
    del doc["rule"]
    (site / "not-supported.json").write_text(json.dumps(doc))
    ok(kit("claim", "seal", "not-supported.json", cwd=site))
    for claim in ("supported.sealed.json", "not-supported.sealed.json"):
        ok(kit("run", "--claim", claim, "--allow-dirty", "--json", cwd=site))
    return site


def runs_of(site: Path, prefix: str) -> list[str]:
    return sorted(str(p) for p in (site / "ws" / "runs").glob(f"{prefix}-*"))


def verdict(site: Path, claim: str, out: str, *runs, code: int):
    proc = ok(kit("claim", "evaluate", claim, *runs, "--out", out, "--json", cwd=site), code)
    doc = json.loads(proc.stdout)
    assert doc == json.loads((site / out).read_text()) and schema_problems(doc, "claim-verdict") == []
    return doc


def test_bound_runs_carry_the_claim_in_their_sealed_manifest(site):
    sealed = json.loads((site / "supported.sealed.json").read_text())
    runs = runs_of(site, "smoke-mismatch")
    assert [Path(r).name for r in runs] == sorted(r["run_id"] for r in sealed["runs"])
    for run in runs:
        manifest = json.loads((Path(run) / "manifest.json").read_text())
        assert manifest["claim"]["sha256"] == sealed["sealed"]["claim_sha256"]
        assert manifest["arm"]["workload"]["seed"] == manifest["claim"]["seed"]
        ok(kit("verify", run, cwd=site))


def test_supported(site):
    doc = verdict(site, "supported.sealed.json", "supported.verdict.json", code=0)
    assert doc["verdict"] == "supported", doc["reasons"]
    assert doc["schema"] == "rlk-kit/claim-verdict/v2" and doc["claim"]["schema"] == "rlk-kit/claim/v1"
    assert [r["status"] for r in doc["runs"]] == ["counted"] * 6 and doc["refused"] == []
    (criterion,) = doc["criteria"]           # a v1 claim is one criterion, named after its metric
    assert (criterion["name"], criterion["verdict"]) == ("mismatch_count", "supported")
    totals = criterion["statistics"]["totals"]
    assert totals["treatment_mismatches"] == 0 < totals["reference_mismatches"]
    assert totals["treatment_tokens"] == totals["reference_tokens"] > 400
    assert doc["identity"]["provenance"] == "same-host" and doc["identity"]["controlled"] is True
    assert doc["does_not_prove"] and doc["kit_version"]
    ok(kit("verify", "supported.verdict.json", "supported.sealed.json", cwd=site))


def test_not_supported(site):
    doc = verdict(site, "not-supported.sealed.json", "not-supported.verdict.json", code=1)
    assert doc["verdict"] == "not supported", doc["reasons"]
    # each criterion has its own statistics and sub-verdict; one not supported makes the claim not supported
    assert [(c["name"], c["verdict"]) for c in doc["criteria"]] == [("no-mismatch", "supported"),
                                                                    ("more-mismatches", "not supported")]
    first, second = doc["criteria"]
    assert first["statistics"]["totals"]["treatment_mismatches"] == 0 and first["rule"]["min_tokens"] == 100
    assert second["statistics"]["difference"]["ci95_high"] < 0 and "totals" not in second["statistics"]
    assert len(doc["reasons"]) == 2 and doc["reasons"][1].startswith("more-mismatches: not supported")
    ok(kit("verify", "not-supported.verdict.json", cwd=site))
    proc = ok(kit("claim", "evaluate", "not-supported.sealed.json", "--out", "not-supported2.json", cwd=site), 1)
    assert "criterion   no-mismatch: SUPPORTED" in proc.stdout and "more-mismatches: NOT SUPPORTED" in proc.stdout


def test_a_seed_left_out_is_incomplete_and_named(site):
    runs = [r for r in runs_of(site, "smoke-mismatch") if not r.endswith("treatment-s2")]
    doc = verdict(site, "supported.sealed.json", "incomplete.verdict.json", *runs, code=1)
    assert doc["verdict"] == "incomplete" and [c["statistics"] for c in doc["criteria"]] == [None]
    assert doc["criteria"][0]["verdict"] == "incomplete"
    missing = [r for r in doc["runs"] if r["status"] != "counted"]
    assert [(r["run_id"], r["status"]) for r in missing] == [("smoke-mismatch-treatment-s2", "missing")]
    assert any("smoke-mismatch-treatment-s2" in r["run"] and "not given" in r["reason"] for r in doc["refused"])


def test_runs_made_before_the_claim_are_refused(site):
    unbound = [str(p) for p in (site / "ws" / "runs").glob("smoke*-g*-s1")]
    assert len(unbound) == 2
    doc = verdict(site, "supported.sealed.json", "before.verdict.json", *unbound, code=1)
    assert doc["verdict"] == "incomplete"
    assert sorted(r["run"] for r in doc["refused"] if "not bound" in r["reason"]) == sorted(unbound)
    assert all(r["status"] == "missing" for r in doc["runs"])
    proc = ok(kit("claim", "evaluate", "supported.sealed.json", *unbound, "--out", "before2.json", cwd=site), 1)
    assert "INCOMPLETE" in proc.stdout and "not bound to claim smoke-mismatch" in proc.stdout


def test_no_analysis_option_can_be_given_on_the_command_line(site):
    proc = kit("claim", "evaluate", "supported.sealed.json", "--steady-from", "1", "--out", "x.json", cwd=site)
    assert proc.returncode == 2 and "--steady-from" in proc.stderr and not (site / "x.json").exists()


def test_kit_verify_refuses_an_edited_claim_an_edited_verdict_and_swapped_runs(site, tmp_path):
    verdict(site, "supported.sealed.json", "tamper.verdict.json", code=0)
    copy = tmp_path / "copy"
    shutil.copytree(site, copy, symlinks=True)
    ok(kit("verify", "tamper.verdict.json", cwd=copy))          # the copy checks its own files
    claim = copy / "supported.sealed.json"
    edited = json.loads(claim.read_text())
    edited["rule"]["min_tokens"] = 1
    claim.chmod(0o644)
    claim.write_text(json.dumps(edited))
    proc = ok(kit("verify", "tamper.verdict.json", "supported.sealed.json", cwd=copy), 1)
    assert proc.stdout.count("edited after it was sealed") == 2

    copy2 = tmp_path / "copy2"
    shutil.copytree(site, copy2, symlinks=True)
    doc = json.loads((copy2 / "tamper.verdict.json").read_text())
    doc["criteria"][0]["statistics"]["totals"]["treatment_mismatches"] = 0.0 if doc["verdict"] != "supported" else 5.0
    (copy2 / "tamper.verdict.json").chmod(0o644)
    (copy2 / "tamper.verdict.json").write_text(json.dumps(doc))
    assert "the verdict was edited" in ok(kit("verify", "tamper.verdict.json", cwd=copy2), 1).stdout

    copy3 = tmp_path / "copy3"
    shutil.copytree(site, copy3, symlinks=True)
    runs = copy3 / "ws" / "runs"
    (runs / "smoke-mismatch-treatment-s1").rename(runs / "swap")
    (runs / "smoke-mismatch-treatment-s2").rename(runs / "smoke-mismatch-treatment-s1")
    (runs / "swap").rename(runs / "smoke-mismatch-treatment-s2")
    assert "the runs were swapped" in ok(kit("verify", "tamper.verdict.json", cwd=copy3), 1).stdout


def test_a_v1_verdict_still_verifies_and_renders(site, tmp_path):
    """A verdict written before claims had criteria (claim-verdict/v1: one rule, one statistics) is still
    checked as it was, and its page shows its one criterion."""
    from kit.evidence.claims import seal_verdict

    doc = verdict(site, "supported.sealed.json", "v1-source.verdict.json", code=0)
    (criterion,) = doc["criteria"]
    old = {k: v for k, v in doc.items() if k not in ("criteria", "kit_version", "verdict_sha256")}
    old.update(schema="rlk-kit/claim-verdict/v1", statistics=criterion["statistics"], reasons=criterion["reasons"],
               claim={**{k: v for k, v in doc["claim"].items() if k != "schema"}, "rule": criterion["rule_text"]})
    (site / "v1.verdict.json").write_text(json.dumps(seal_verdict(old)))
    ok(kit("verify", "v1.verdict.json", cwd=site))
    proc = ok(kit("report", "v1.verdict.json", "--out", str(tmp_path / "page"), "--json", cwd=site))
    assert json.loads(proc.stdout)["verdict"] == "supported"
    text = (tmp_path / "page" / "index.html").read_text()
    assert 'id="criteria"' in text and 'id="totals"' in text and "mismatch_count" in text
    edited = dict(json.loads((site / "v1.verdict.json").read_text()), verdict="not supported")
    (site / "v1-edited.verdict.json").write_text(json.dumps(edited))
    assert "the verdict was edited" in ok(kit("verify", "v1-edited.verdict.json", cwd=site), 1).stdout


def chromium(*args, cwd: Path) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium")
    assert browser, "Debian's chromium is not installed: run scripts/ensure-browser.sh (scripts/test does)"
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={cwd / 'chromium-profile'}", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


VERDICTS = {"supported.verdict.json": ("supported.sealed.json", 0), "not-supported.verdict.json": ("not-supported.sealed.json", 1)}


@pytest.mark.parametrize("args, banner, tables", [
    (["supported.verdict.json"], "supported",
     {"criteria", "claim-options", "runs", "refused", "evidence", "identity", "gates", "statistics", "effects", "totals",
      "monitors"}),
    (["not-supported.verdict.json"], "not supported",       # two criteria: one table set and one figure row each
     {"criteria", "claim-options", "statistics-no-mismatch", "effects-no-mismatch", "totals-no-mismatch",
      "statistics-more-mismatches", "effects-more-mismatches", "gates", "monitors"}),
    (["ws/runs/smoke-mismatch-reference-s1", "ws/runs/smoke-mismatch-treatment-s1"], "controlled",
     {"identity", "evidence", "not-comparable", "gates", "statistics", "monitors"}),
])
def test_the_page_renders_in_a_headless_browser(site, tmp_path, args, banner, tables):
    for name, (claim, code) in VERDICTS.items():
        if args == [name] and not (site / name).exists():
            verdict(site, claim, name, code=code)
    out = tmp_path / "page"
    proc = ok(kit("report", *args, "--out", str(out), "--json", cwd=site))
    assert json.loads(proc.stdout)["verdict"] == banner
    page = out / "index.html"
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//)""", text), "the page must fetch nothing"
    dom = chromium("--dump-dom", page.as_uri(), cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-ready="yes"' in html
    shown = re.search(r'<div class="banner [a-z]+" id="verdict"><div class="verdict">([^<]*)</div>', html)
    assert shown and shown.group(1) == banner
    assert tables <= set(re.findall(r'<table id="([a-z-]+)"', html))
    loaded = re.findall(r'<img [^>]*data-loaded="(yes|no)"', html)
    assert loaded and set(loaded) == {"yes"}, loaded
    for name, size in (("laptop", "1280,2000"), ("narrow", "390,2400")):
        shot = tmp_path / f"page-{name}.png"
        result = chromium(f"--screenshot={shot}", f"--window-size={size}", page.as_uri(), cwd=tmp_path)
        assert result.returncode == 0 and shot.read_bytes().startswith(b"\x89PNG"), result.stderr[-2000:]
    printed = tmp_path / "page.pdf"              # it prints: the print style gives a PDF of the page
    result = chromium(f"--print-to-pdf={printed}", "--no-pdf-header-footer", page.as_uri(), cwd=tmp_path)
    assert result.returncode == 0 and printed.read_bytes().startswith(b"%PDF"), result.stderr[-2000:]


def test_the_noise_floor_counts_mismatched_tokens_as_the_verdict_does(site, tmp_path):
    doc = verdict(site, "supported.sealed.json", "noise.verdict.json", code=0)
    proc = ok(kit("analyze", "replicates", *runs_of(site, "smoke-mismatch-reference"),
                  *runs_of(site, "smoke-mismatch-treatment"), "--out", str(tmp_path / "noise"), "--no-figures", cwd=site))
    assert "mismatch_count" in proc.stdout
    replicates = json.loads((tmp_path / "noise" / "replicates.json").read_text())
    by_arm = {a["arm"]: a["metrics"]["mismatch_count"]["seed_means"] for a in replicates["arms"]}
    stats = doc["criteria"][0]["statistics"]["arms"]
    assert by_arm["smoke-native"] == stats["reference"]["seed_means"] and by_arm["smoke"] == stats["treatment"]["seed_means"]
    assert min(by_arm["smoke-native"]) > 10          # tokens per step (x16), not the engine's per-sample mean
    diff = replicates["differences"][0]["metrics"]["mismatch_count"]
    ours = doc["criteria"][0]["statistics"]["difference"]
    assert (diff["ci95_low"], diff["ci95_high"]) == (ours["ci95_low"], ours["ci95_high"])
