"""One file's verdict from `kit verify`: what it is, ok/fail/unreadable, the problems by JSON pointer,
notes, and for a run dir the trust level its seal holds.

It sits apart from the readers that produce it (kit.evidence.verify for documents, kit.evidence.audit
for run directories) so that both can return it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FileVerdict:
    path: str
    kind: str = "unknown"
    status: str = "ok"                                   # ok | fail | unreadable
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trust: str | None = None                             # run dirs: unsigned | signed | trusted (kit.evidence.signing)

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "status": self.status,
                "problems": [{"pointer": p, "message": m} for p, m in self.problems], "notes": list(self.notes)} \
            | ({"trust": self.trust} if self.trust else {})
