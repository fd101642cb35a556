"""Which environment variables a run records: an allow-list, never the whole host environment.

A run records the host variables that can change what it computes or where it reads from (the
list and prefixes below, plus any the arm declares), with secret values replaced by
``<redacted>`` and URL passwords cut out; every other variable is left out, value and all. Of the
variables left out, only the names that look secret are listed (``redacted_names``), so a reader
sees that a token was present without learning it. The job's own variables (set by the kit from
the arm) are recorded whole, secret-named values redacted. Example::

    >>> record_host({"CUDA_VISIBLE_DEVICES": "0", "DB_PASS": "x", "AUTH_MODE": "on", "HF_TOKEN": "hf_1"})
    {'CUDA_VISIBLE_DEVICES': '0', 'HF_TOKEN': '<redacted>'}
    >>> redact_url_passwords("http://me:p@ss/w0rd@proxy:3128")
    'http://<redacted>@proxy:3128'
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

REDACTED = "<redacted>"

# Variables that change what a run computes or which inputs it reads.
RECORDED_NAMES = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED", "PYTHONPATH", "LD_LIBRARY_PATH",
    "LD_PRELOAD", "PATH", "LANG", "LC_ALL", "TZ", "CUBLAS_WORKSPACE_CONFIG", "HF_HOME", "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "KIT_WORKSPACE", "HTTP_PROXY", "HTTPS_PROXY",
    "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "ALL_PROXY", "all_proxy", "VIRTUAL_ENV", "CONDA_PREFIX",
    # present-or-not matters (authenticated downloads); the value is never recorded
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
})
RECORDED_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "CUDNN_", "TORCH_", "PYTORCH_", "TRITON_", "VLLM_", "RAY_", "ROCR_",
                     "HIP_", "HSA_", "ROCM_", "MIOPEN_", "XLA_", "RL_KERNEL_", "MEGATRON_", "NVTE_", "KIT_")

# A recorded variable whose name says it holds a credential keeps only its name.
SECRET_NAME_RE = re.compile(r"TOKEN|KEY|SECRET|PASS|PWD|CREDENTIAL|AUTH|JWT|DSN|WEBHOOK|CONNECTION_STRING|COOKIE|"
                            r"SESSION|PRIVATE|SIGNATURE|SAS", re.IGNORECASE)
NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})        # the shell's working directories
# scheme://userinfo@host : everything up to the last '@' before the host is the user's (passwords may hold '@' and '/')
URL_USERINFO_RE = re.compile(r"([a-z][a-z0-9+.-]*://)([^\s]*)@(?=[^@\s]*$|[^@\s/]*[/\s])", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return name not in NOT_SECRET_NAMES and bool(SECRET_NAME_RE.search(name))


def is_recorded(name: str, declared: Iterable[str] = ()) -> bool:
    return name in RECORDED_NAMES or name.startswith(RECORDED_PREFIXES) or name in set(declared)


def redact_url_passwords(value: str) -> str:
    """A URL's user information (name and password) is cut out; the host stays."""
    return URL_USERINFO_RE.sub(rf"\1{REDACTED}@", value) if "://" in value and "@" in value else value


def redact_value(name: str, value: str) -> str:
    return REDACTED if is_secret_name(name) else redact_url_passwords(value)


def record_host(env: Mapping[str, str], declared: Iterable[str] = ()) -> dict[str, str]:
    """The allow-listed host variables, secrets redacted; everything else is left out."""
    declared = tuple(declared)
    return {k: redact_value(k, v) for k, v in sorted(env.items()) if isinstance(v, str) and is_recorded(k, declared)}


def record_job(env: Mapping[str, str]) -> dict[str, str]:
    """The job's variables (the kit set them from the arm): all recorded, secrets redacted."""
    return {k: redact_value(k, str(v)) for k, v in sorted(env.items())}


def secret_names(*envs: Mapping[str, str]) -> list[str]:
    """Names (never values) of the secret-looking variables present, recorded or not."""
    return sorted({k for env in envs for k in env if is_secret_name(k)})


def recorded_secrets(env_host: Mapping[str, str], env_job: Mapping[str, str],
                     declared: Iterable[str] = ()) -> dict[str, str]:
    """``{name: raw value}`` of the secrets among the recorded variables: the only values the kit scrubs
    from documents it writes (never from the engine's log)."""
    declared = tuple(declared)
    out = {k: v for k, v in env_job.items() if isinstance(v, str) and is_secret_name(k)}
    out |= {k: v for k, v in env_host.items() if isinstance(v, str) and is_recorded(k, declared) and is_secret_name(k)}
    return out
