"""Catalog: the stacks, arms and arm matrices of a manifests directory, resolved.

The manifests directory is ``$KIT_MANIFESTS``, else ``./manifests``, else the one beside the
installed package (an editable checkout). Example::

    catalog = Catalog.default()
    arm = catalog.arm("G10")            # names or files: catalog.arm_ref("manifests/G10.json")
    arm.stack.name, arm.stack.sha256
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kit.model.arm import Arm, arm_rule_problems, matrix_arm_documents, resolve_arm_document
from kit.model.documents import read_json_file, require_valid, schema_problems
from kit.model.errors import BadInput, KitError
from kit.model.lock import LOCK_SCHEMA
from kit.model.stack import Stack, StackResolutionError, resolve_stack_document
import sys


def default_manifests_dir() -> Path:
    env = os.environ.get("KIT_MANIFESTS")
    if env:
        return Path(env)
    local = Path.cwd() / "manifests"
    if local.is_dir():
        return local
    return Path(__file__).resolve().parents[2] / "manifests"


# default of ``flag``: name the option or argument of the running command that carried the value
FROM_COMMAND_LINE = "<from the command line>"


def command_line_source(value: str) -> str | None:
    """The option (``--arm``) or argument (``B``) of the running click command that carried ``value``.

    Errors name the flag a user typed; the catalog is also used outside any command, and then (or when
    no parameter holds the value) this is None.
    """

    click = sys.modules.get("click")  # only a running CLI has imported it
    ctx = click.get_current_context(silent=True) if click is not None else None
    while ctx is not None:
        for param in ctx.command.params:
            held = ctx.params.get(param.name)
            if held == value or (isinstance(held, (list, tuple)) and value in held):
                if isinstance(param, click.Option):
                    return max(param.opts, key=len)
                return param.human_readable_name
        ctx = ctx.parent
    return None


@dataclass
class Catalog:
    directory: Path
    stack_docs: dict[str, tuple[dict, str]] = field(default_factory=dict)   # name -> (raw doc, file)
    arm_docs: dict[str, tuple[dict, str]] = field(default_factory=dict)
    matrix_docs: dict[str, tuple[dict, str]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)               # file -> why
    # (schema, name) -> every file that uses the name; more than one is a lock error, never a silent pick
    files_by_name: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    lock_docs: dict[tuple[str, str], tuple[dict, str]] = field(default_factory=dict)  # (stack, platform) ->

    @classmethod
    def default(cls) -> "Catalog":
        return cls.load(default_manifests_dir())

    @classmethod
    def load(cls, directory: Path | str) -> "Catalog":
        directory = Path(directory)
        if not directory.is_dir():
            raise BadInput(f"{directory}: manifests directory not found (set KIT_MANIFESTS or run from the checkout)")
        cat = cls(directory)
        for path in sorted(directory.glob("*.json")):
            try:
                doc = read_json_file(path)
            except KitError as exc:
                cat.unreadable[str(path)] = str(exc)
                continue
            cat._add(doc, str(path))
        cat._resolve_arms()
        return cat

    def _resolve_arms(self) -> None:
        """Arms that extend another hold their resolved document; one that cannot resolve keeps its raw
        one (its schema check then names what is missing)."""
        raw = dict(self.arm_docs)
        for name, (doc, path) in raw.items():
            if isinstance(doc, dict) and "extends" in doc:
                try:
                    self.arm_docs[name] = (resolve_arm_document(doc, lambda n: (raw.get(n) or (None,))[0]), path)
                except ValueError:
                    pass

    def resolve_arm(self, doc: dict, source: str) -> dict:
        """The arm ``doc`` resolved through ``extends`` against this catalog's arms; BadInput names the problem."""
        try:
            return resolve_arm_document(doc, lambda n: (self.arm_docs.get(n) or (None,))[0])
        except ValueError as exc:
            raise BadInput(f"{source}: {exc}") from None

    def _add(self, doc, path: str) -> None:
        if isinstance(doc, dict) and doc.get("schema") == LOCK_SCHEMA and isinstance(doc.get("stack"), str):
            self.lock_docs.setdefault((doc["stack"], str(doc.get("platform"))), (doc, path))
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            return
        kind = {"rlk-kit/stack/v1": self.stack_docs, "rlk-kit/arm/v1": self.arm_docs,
                "rlk-kit/arm-matrix/v1": self.matrix_docs}.get(_kind(doc))
        if kind is not None:
            kind.setdefault(doc["name"], (doc, path))
            self.files_by_name.setdefault((_kind(doc), doc["name"]), []).append(path)

    def name_clash(self, doc: dict, path: str) -> str | None:
        """Why ``doc``'s name is ambiguous in this catalog (another lock file of the same kind uses it);
        None when it names one document."""
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            return None
        others = [p for p in self.files_by_name.get((_kind(doc), doc["name"]), [])
                  if Path(p).resolve() != Path(path).resolve()]
        if others:
            return f"name {doc['name']!r} is also used by {', '.join(others)}; names must be unique in {self.directory}"
        return None   # (a generated arm named like a written one is a matrix rule: kit/evidence/verify.py)

    # --- stacks ---------------------------------------------------------------

    def raw_stack(self, name: str) -> dict | None:
        entry = self.stack_docs.get(name)
        return entry[0] if entry else None

    def resolve_stack(self, doc: dict, source: str) -> Stack:
        require_valid(doc, source, "stack")
        try:
            resolved = resolve_stack_document(doc, self.raw_stack)
        except StackResolutionError as exc:
            raise BadInput(f"{source}: {exc.pointer}: {exc}") from None
        require_valid(resolved, f"{source} (resolved through extends)", "stack")
        return Stack(doc["name"], resolved, source)

    def stack(self, name: str) -> Stack:
        entry = self.stack_docs.get(name)
        if entry is None:
            known = ", ".join(sorted(self.stack_docs)) or "none"
            raise BadInput(f"unknown stack {name!r}; stacks in {self.directory}: {known}")
        self._refuse_ambiguous("rlk-kit/stack/v1", name)
        return self.resolve_stack(*entry)

    def lock(self, stack_name: str, platform: str) -> tuple[dict, str] | None:
        """(lock document, file) of a stack's platform, or None when it has not been locked."""
        return self.lock_docs.get((stack_name, platform))

    # --- arms -----------------------------------------------------------------

    def all_arm_documents(self) -> dict[str, tuple[dict, str]]:
        """Arms written out plus arms generated by matrices (generated names never shadow written ones)."""
        out = dict(self.arm_docs)
        bases = {name: doc for name, (doc, _) in self.arm_docs.items() if not schema_problems(doc, "arm")}
        for matrix, path in self.matrix_docs.values():
            if schema_problems(matrix, "arm-matrix"):
                continue
            for doc in matrix_arm_documents(matrix, bases):
                out.setdefault(doc["name"], (doc, f"{path}#{doc['name']}"))
        return out

    def arm_names(self) -> list[str]:
        return sorted(self.all_arm_documents())

    def arm(self, name: str, *, flag: str | None = FROM_COMMAND_LINE) -> Arm:
        """The named arm. ``flag`` is the option or argument the name came from, named in the error;
        by default it is found on the running command line (``--arm`` for ``kit plan --arm nope``),
        ``None`` names none."""
        return self._arm(name, flag, files=False)

    def _arm(self, name: str, flag: str | None, *, files: bool) -> Arm:
        entry = self.all_arm_documents().get(name)
        if entry is None:
            raise self._unknown_arm(name, flag, files=files)
        self._refuse_ambiguous("rlk-kit/arm/v1", name)
        return self.arm_from_document(*entry)

    def _refuse_ambiguous(self, schema: str, name: str) -> None:
        files = self.files_by_name.get((schema, name), [])
        if len(files) > 1:
            raise BadInput(f"{schema.split('/')[1]} {name!r} is defined by {len(files)} files ({', '.join(files)}); "
                           "names must be unique, see kit verify")

    def _unknown_arm(self, name: str, flag: str | None, *, files: bool) -> BadInput:
        if flag is FROM_COMMAND_LINE:
            flag = command_line_source(name)
        given = f" given to {flag}" if flag else ""
        accepted = "an arm file (*.json) or one of the arms" if files else "the arms"
        return BadInput(f"unknown arm {name!r}{given}; accepted: {accepted} in {self.directory}: "
                        f"{', '.join(self.arm_names()) or 'none'}")

    def arm_from_document(self, doc: dict, source: str, *, check_rules: bool = True) -> Arm:
        if "extends" in doc:   # a layered arm may hold partial objects: its resolved form is validated
            doc = self.resolve_arm(doc, source)
            source = f"{source} (resolved through extends)"
        require_valid(doc, source, "arm")
        stack = self.stack(doc["stack"]["name"])
        if check_rules:
            problems = arm_rule_problems(doc, stack)
            if problems:
                shown = "; ".join(f"{p}: {m}" for p, m in problems[:4])
                raise BadInput(f"{source}: {shown}")
        return Arm(doc["name"], doc, stack, source)

    def arm_ref(self, ref: str, *, flag: str | None = FROM_COMMAND_LINE) -> Arm:
        """An arm by name, or by the path of an arm file (whose directory supplies its stacks)."""
        path = Path(ref)
        if ref.endswith(".json") or os.sep in ref or path.exists():
            doc = read_json_file(path)
            catalog = self if path.resolve().parent == self.directory.resolve() else Catalog.load(path.resolve().parent)
            return catalog.arm_from_document(doc, str(path))
        return self._arm(ref, flag, files=True)


def _kind(doc: dict):
    """The document kind a catalog files it under: arm/v2 only widens arm/v1 (the gpu engine), so both are arms;
    stack/v2 widens stack/v1 (platform variants, locks), so both are stacks."""
    schema = doc.get("schema")
    return {"rlk-kit/arm/v2": "rlk-kit/arm/v1", "rlk-kit/arm/v3": "rlk-kit/arm/v1", "rlk-kit/arm/v4": "rlk-kit/arm/v1",
            "rlk-kit/arm/v5": "rlk-kit/arm/v1",
            "rlk-kit/stack/v2": "rlk-kit/stack/v1"}.get(schema, schema)
