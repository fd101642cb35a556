"""One reader for runs: a run directory or a bare VIME log becomes an :class:`ArmLog`.

A run directory holds ``run.log`` and, when the kit wrote it, ``manifest.json`` (arm name, global
batch size, maximum response length, seeds) and ``seal.json``. A run directory with a manifest is
verified as ``kit verify`` does (seal, hashes, gates, manifest schema); what fails is kept in
``evidence_problems``, and such a run cannot be one side of a controlled comparison. A bare log
file stands alone: the arm name is the file stem unless ``name`` overrides it, and the global batch
size comes from ``train/global_batch_size`` in the step records. Example::

    arm = load_arm(Path("runs/g10-s1234"))          # run dir
    arm = load_arm(Path("G11.log"), name="strict")  # bare log
    arm.steps[0].value(keys.STEP_TIME)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from kit.engines.vime import keys
from kit.engines.vime.records import (
    RecordConflict,
    StepRecords,
    UnparseableLine,
    collect_steps,
    generation_progress_seconds,
    is_finite_number,
    parse_records,
)
from kit.evidence.audit import verify_run_dir
from kit.evidence.bundle import SEAL
from kit.model.documents import read_json_file, schema_problems
from kit.model.errors import BadInput
from kit.model.regular_files import iter_regular_lines

RUN_LOG = "run.log"
MANIFEST = "manifest.json"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# No metric comes near this; a larger value (1e308, 10**400) would overflow the sums and means into inf.
MAX_ABS_VALUE = 1e100


@dataclass(frozen=True)
class ArmLog:
    """The per-step records of one run plus what its manifest says about it."""

    name: str
    log_path: Path
    run_dir: Path | None
    manifest: dict | None
    global_batch_size: int
    global_batch_size_origin: str
    max_response_len: int | None
    steps: dict[int, StepRecords]
    # finished tqdm generation bars, one per step in step order, when the log has a usable set
    progress_seconds: tuple[int, ...] | None = None
    notes: tuple[str, ...] = field(default=())
    # record lines whose dict does not parse: skipped, and reported in notes and on stderr
    unparseable: tuple[UnparseableLine, ...] = field(default=())
    # "<pointer>: <message>" per failed check of the run dir (seal, hashes, gates, manifest schema);
    # empty for a run dir that verifies and for a bare log (which has no evidence to check)
    evidence_problems: tuple[str, ...] = field(default=())

    def unparseable_messages(self) -> list[str]:
        """One ``<log>:<line>: ...`` message per skipped record line."""
        return [u.describe(str(self.log_path)) for u in self.unparseable]

    @property
    def step_indices(self) -> tuple[int, ...]:
        return tuple(self.steps)

    @property
    def is_bare_log(self) -> bool:
        return self.manifest is None

    def values(self, key: str) -> list:
        """The key's value at every step, None where absent or not a finite number."""
        out = []
        for rec in self.steps.values():
            v = rec.value(key)
            out.append(float(v) if is_finite_number(v) else None)
        return out


def manifest_arm(manifest: dict) -> dict:
    """The arm document a run manifest embeds (``manifest["arm"]``), or the manifest itself."""
    arm = manifest.get("arm")
    return arm if isinstance(arm, dict) else manifest


def manifest_name(manifest: dict) -> str | None:
    arm = manifest_arm(manifest)
    for holder, key in ((arm, "name"), (manifest, "arm_name"), (manifest, "group")):
        if isinstance(holder.get(key), str):
            return holder[key]
    if isinstance(manifest.get("arm"), str):
        return manifest["arm"]
    return None


def manifest_workload(manifest: dict) -> dict:
    workload = manifest_arm(manifest).get("workload")
    if not isinstance(workload, dict):
        workload = manifest.get("workload")
    return workload if isinstance(workload, dict) else {}


def _positive_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    return None


def _read_lines(path: Path):
    # A FIFO or a link to /dev/zero named as a log must be refused, not waited on or read forever.
    yield from iter_regular_lines(path, what="a VIME log file or a run directory's run.log")


def load_arm(path: Path | str, name: str | None = None, global_batch_size: int | None = None) -> ArmLog:
    """Read a run directory or a bare log file into an ArmLog; BadInput names what is wrong."""
    given, path = str(path), Path(path)     # named as given: Path() folds "a//b" into "a/b"
    if not path.exists():
        raise BadInput(f"{given}: no such file or directory; expected a run directory or a VIME log file")
    run_dir, manifest = None, None
    if path.is_dir():
        run_dir, log_path = path, path / RUN_LOG
        if not log_path.is_file():
            raise BadInput(f"{path}: a run directory must hold {RUN_LOG}")
        if (path / MANIFEST).is_file():

            manifest = read_json_file(path / MANIFEST)
            if not isinstance(manifest, dict):
                raise BadInput(f"{path / MANIFEST}: expected a JSON object")
            _refuse_unreadable_fields(path / MANIFEST, manifest)
    else:
        log_path = path

    if name is None:
        name = manifest_name(manifest) if manifest else None
        if name is None:
            name = path.name if run_dir else path.stem
    if not NAME_RE.match(name):
        raise BadInput(f"{path}: arm name {name!r} must match [A-Za-z0-9][A-Za-z0-9._-]* (use --name)")

    lines = list(_read_lines(log_path))
    unparseable: list[UnparseableLine] = []
    try:
        steps = collect_steps(parse_records(lines, unparseable))
    except RecordConflict as exc:
        raise BadInput(f"{log_path}: {exc}") from None
    if not steps and unparseable:
        raise BadInput(f"{log_path}: every record line is unparseable ({len(unparseable)} line(s): "
                       f"{_line_list(unparseable)}; first: {unparseable[0].reason}); expected Python dict reprs "
                       "like \"step 0: {'train/loss': 0.5}\"")
    if not steps:
        raise BadInput(f"{log_path}: no VIME records (lines like \"step 0: {{'train/loss': ...}}\")")
    _refuse_out_of_range(log_path, steps)

    workload = manifest_workload(manifest) if manifest else {}
    gbs, origin = _global_batch_size(log_path, steps, workload, global_batch_size)
    max_len = _positive_int(workload.get("max_response_len"))
    notes = []
    if unparseable:
        notes.append(f"{len(unparseable)} record line(s) of {log_path} skipped because their dict does not parse "
                     f"(line {_line_list(unparseable)}); the values of those records are missing")
    progress = generation_progress_seconds(lines)
    per_step = _progress_per_step(progress, len(steps))
    if progress and per_step is None:
        notes.append(f"{len(progress)} finished 'Rollout generation' bars for {len(steps)} steps; "
                     "progress times not used")
    evidence = _evidence_problems(run_dir, manifest) if run_dir is not None else ()
    return ArmLog(name, log_path, run_dir, manifest, gbs, origin, max_len, steps, per_step, tuple(notes),
                  tuple(unparseable), evidence)


def _refuse_out_of_range(log_path: Path, steps) -> None:
    """BadInput naming the line and key of the first number no metric can have (nan and inf are read as missing)."""
    for step, rec in steps.items():
        for slot, payload in rec.payloads.items():
            for key, value in (payload or {}).items():
                if not _out_of_range(value):
                    continue
                shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:20] + "..."
                raise BadInput(f"{log_path}:{rec.line_numbers.get(slot, '?')}: {key} = {shown} (step {step}) is out of "
                               f"range: a metric's magnitude must be at most {MAX_ABS_VALUE:g}; nan and inf are "
                               "read as missing")


# The parts of a kit-written manifest the analysis reads: a wrong type there is bad input (exit 2); a
# problem elsewhere (a missing host, say) only makes the run no evidence (evidence_problems).
READ_FIELDS = ("/run_id", "/arm/name", "/arm/workload", "/arm/topology", "/arm/operators", "/stack", "/inputs",
               "/kit_version")


def _refuse_unreadable_fields(path: Path, manifest: dict) -> None:
    if not str(manifest.get("schema")).startswith("rlk-kit/run-manifest/"):
        return                            # not a kit manifest: its fields are read with care, one by one
    for pointer, message in schema_problems(manifest, "run-manifest"):
        if pointer.startswith(READ_FIELDS):
            raise BadInput(f"{path}{pointer}: {message}; kit analyze reads this field of a run manifest")


def _out_of_range(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False                      # junk types are read as missing
    if isinstance(value, float) and not math.isfinite(value):
        return False                      # nan and inf too: a diverged loss is a fact of the run
    return abs(value) > MAX_ABS_VALUE     # exact for ints of any size


def _evidence_problems(run_dir: Path, manifest: dict | None) -> tuple[str, ...]:
    """What ``kit verify RUN_DIR`` finds wrong, plus the manifest's schema problems.

    verify_run_dir checks the manifest's schema only once the seal vouches for its bytes, so an
    unsealed run's manifest is checked here as well: either way its fields are not evidence."""

    if manifest is None and not (run_dir / SEAL).is_file():
        return ()  # only a log: the bare-log reason says everything
    try:
        verdict = verify_run_dir(run_dir)
        found = [f"{pointer or '/'}: {message}" for pointer, message in verdict.problems] \
            if verdict.status != "ok" else []
    except OSError as exc:  # an artifact that cannot be read cannot be vouched for
        found = [f"{exc.filename or run_dir}: cannot read ({exc.strerror})"]
    if manifest is not None:
        for pointer, message in schema_problems(manifest, "run-manifest"):
            line = f"/{MANIFEST}{pointer}: {message}"
            if line not in found:
                found.append(line)
    return tuple(found)


def _line_list(unparseable, shown: int = 10) -> str:
    numbers = ", ".join(str(u.line_number) for u in unparseable[:shown])
    return numbers + (f" and {len(unparseable) - shown} more" if len(unparseable) > shown else "")


def _global_batch_size(log_path, steps, workload, override) -> tuple[int, str]:
    logged = {_positive_int(s.value(keys.GLOBAL_BATCH_SIZE)) for s in steps.values()} - {None}
    if len(logged) > 1:
        raise BadInput(f"{log_path}: train/global_batch_size changes between steps ({sorted(logged)})")
    from_log = next(iter(logged), None)
    from_manifest = _positive_int(workload.get("global_batch_size"))
    if override is not None:
        return override, "--global-batch-size"
    if from_manifest and from_log and from_manifest != from_log:
        raise BadInput(f"{log_path}: the manifest says workload.global_batch_size={from_manifest}, "
                       f"the log says train/global_batch_size={from_log}")
    if from_manifest:
        return from_manifest, "manifest workload.global_batch_size"
    if from_log:
        return from_log, f"{keys.GLOBAL_BATCH_SIZE} in the log"
    raise BadInput(f"{log_path}: the global batch size (samples per step) is unknown: no manifest.json "
                   "with workload.global_batch_size and no train/global_batch_size in the step records; "
                   "pass --global-batch-size N")


def _progress_per_step(progress: list[int], n_steps: int) -> tuple[int, ...] | None:
    # VIME prints each finished bar once or twice (the pair must agree); anything else is unusable
    if len(progress) == n_steps:
        return tuple(progress)
    if len(progress) == 2 * n_steps and all(progress[2 * i] == progress[2 * i + 1] for i in range(n_steps)):
        return tuple(progress[0::2])
    return None


def load_arms(paths, names=None, global_batch_size=None) -> list[ArmLog]:
    """Load several runs; names must be unique (``--name`` may rename them in order)."""
    names = list(names or [])
    if len(names) > len(paths):
        raise BadInput(f"--name given {len(names)} times for {len(paths)} runs")
    arms = [load_arm(p, names[i] if i < len(names) else None, global_batch_size) for i, p in enumerate(paths)]
    return arms


