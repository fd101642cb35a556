"""The tamper matrix over a real sealed smoke run: every case detected (or, for a forger who recomputes
the whole unsigned seal, reported as unsigned), no traceback, every verify call under 10 s."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sealed_run import sealed_smoke  # noqa: F401  (a session fixture)
from tamper_cases import cases, run_case

from kit.evidence.signing import load_private_key

MAX_VERIFY_S = 10.0


def test_tamper_matrix(sealed_smoke, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    src = sealed_smoke["unsigned"]
    artifacts = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file() and p.name != "seal.json")
    matrix = cases(artifacts, Ed25519PrivateKey.generate())
    assert len(matrix) >= 170, len(matrix)
    assert load_private_key(sealed_smoke["key"])   # the signed copy was sealed with this key
    outcomes = [run_case(c, sealed_smoke, sealed_smoke["pub"], tmp_path / "work") for c in matrix]
    missed = [(o.case.id, o.status, o.trust, o.error) for o in outcomes if not o.detected]
    slow = [(o.case.id, round(o.seconds, 2)) for o in outcomes if o.seconds >= MAX_VERIFY_S]
    figures = {"cases": len(outcomes), "detected": sum(o.detected for o in outcomes),
               "tracebacks": sum(o.error is not None for o in outcomes),
               "max_verify_s": round(max(o.seconds for o in outcomes), 3),
               "reported_unsigned": sum(o.case.expect == "unsigned" for o in outcomes),
               "artifacts": artifacts}
    if os.environ.get("KIT_EVIDENCE_FIGURES"):      # benchmarks/evidence_report.py collects them
        Path(os.environ["KIT_EVIDENCE_FIGURES"], "tamper.json").write_text(json.dumps(
            figures | {"outcomes": [{"id": o.case.id, "status": o.status, "trust": o.trust, "seconds": round(o.seconds, 4),
                                     "first_problem": (o.problems[0][0] + ": " + o.problems[0][1])[:200] if o.problems else None}
                                    for o in outcomes]}, indent=1))
    assert not missed, missed
    assert not slow, slow


def test_the_untampered_copies_verify(sealed_smoke):
    from kit.evidence.audit import verify_run_dir

    signed = verify_run_dir(sealed_smoke["signed"], sealed_smoke["pub"], require_signature=True)
    assert (signed.status, signed.trust) == ("ok", "trusted"), signed.problems
    unsigned = verify_run_dir(sealed_smoke["unsigned"])
    assert (unsigned.status, unsigned.trust) == ("ok", "unsigned"), unsigned.problems
    assert verify_run_dir(sealed_smoke["unsigned"], require_signature=True).status == "fail"
    anyone = verify_run_dir(sealed_smoke["signed"])
    assert (anyone.status, anyone.trust) == ("ok", "signed") and "nobody named" in anyone.notes[0]
