"""Secret redaction for everything a run directory records.

An environment variable is secret when its name contains TOKEN, KEY, SECRET, PASSWORD, PASSWD,
CREDENTIAL or AUTH (any case). Its value is replaced in the recorded environment, and every
occurrence of the value is also scrubbed from text the kit writes (log lines, commands), so a
workload that echoes its environment cannot leak it into sealed evidence. A password written into a
URL (``HTTPS_PROXY=http://user:pass@proxy:3128``) is secret whatever the variable's name: it is
replaced in the URL and scrubbed the same way. Example::

    >>> redact_env({"HF_TOKEN": "hf_abcdef123", "PATH": "/bin"})
    {'HF_TOKEN': '<redacted>', 'PATH': '/bin'}
    >>> Redactor.from_env({"HF_TOKEN": "hf_abcdef123"}).text("login hf_abcdef123 ok")
    'login <redacted:HF_TOKEN> ok'
    >>> redact_env({"HTTPS_PROXY": "http://me:s3cret@proxy:3128"})
    {'HTTPS_PROXY': 'http://me:<redacted>@proxy:3128'}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from kit.evidence.environment import is_recorded, recorded_secrets

SECRET_NAME_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
REDACTED = "<redacted>"
# Shorter values are not scrubbed from free text: replacing "1" or "yes" everywhere would destroy
# the log. Their names and values are still redacted in the recorded environment.
MIN_SCRUB_LENGTH = 6


# scheme://user:password@ : the password part (group 2) of a URL's user information
URL_PASSWORD_RE = re.compile(r"([a-z][a-z0-9+.-]*://[^/:@\s]*:)([^/@\s]+)(@)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


def url_passwords(value: str) -> list[str]:
    """``url_passwords("http://me:s3cret@proxy:3128") == ["s3cret"]``."""
    return [m.group(2) for m in URL_PASSWORD_RE.finditer(value)]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` whose secret-named values are replaced by ``<redacted>`` and whose URLs lose
    their passwords."""
    return {k: (REDACTED if is_secret_name(k) else URL_PASSWORD_RE.sub(rf"\1{REDACTED}\3", v)
                if isinstance(v, str) else v) for k, v in sorted(env.items())}


@dataclass(frozen=True)
class Redactor:
    """Scrubs known secret values from text and from JSON-like documents."""

    secrets: tuple[tuple[str, str], ...] = ()   # (name, value), longest value first

    @classmethod
    def from_recorded(cls, env_host: Mapping[str, str], env_job: Mapping[str, str]) -> "Redactor":
        """Scrubs only the secrets among the variables a run records (:mod:`kit.evidence.environment`):
        an unrecorded variable (``AUTH_MODE=succeeded``) never rewrites anything."""
        recorded = recorded_secrets(env_host, env_job)
        urls = {k: v for k, v in (*env_host.items(), *env_job.items()) if isinstance(v, str) and is_recorded(k)}
        return cls.from_env(recorded, urls)

    @classmethod
    def from_env(cls, *envs: Mapping[str, str]) -> "Redactor":
        found: dict[str, str] = {}
        for env in envs:
            for name, value in env.items():
                if not isinstance(value, str):
                    continue
                if is_secret_name(name) and len(value) >= MIN_SCRUB_LENGTH:
                    found.setdefault(value, name)
                for password in url_passwords(value):
                    if len(password) >= MIN_SCRUB_LENGTH:
                        found.setdefault(password, name)
        # longest first, so a secret containing another is replaced whole
        pairs = sorted(((name, value) for value, name in found.items()), key=lambda p: -len(p[1]))
        return cls(tuple(pairs))

    def text(self, s: str) -> str:
        for name, value in self.secrets:
            if value in s:
                s = s.replace(value, f"<redacted:{name}>")
        return s

    def document(self, doc: Any) -> Any:
        """Apply ``text`` to every string (keys included) of a JSON-like value."""
        if not self.secrets:
            return doc
        if isinstance(doc, str):
            return self.text(doc)
        if isinstance(doc, dict):
            return {self.text(k) if isinstance(k, str) else k: self.document(v) for k, v in doc.items()}
        if isinstance(doc, list):
            return [self.document(v) for v in doc]
        if isinstance(doc, tuple):
            return tuple(self.document(v) for v in doc)
        return doc
