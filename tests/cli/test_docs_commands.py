"""Every documented `kit …` command runs as written: each line in a ``` block of README.md and docs/*.md and
each `kit …` line under `Examples:` of `kit --help` and every subcommand's `--help`, in a scratch site
(tests/cli/doc_site.py) that holds what the docs assume. Each ends with the exit code its comment states
(`# exit 1: …`, else 0), no traceback and no `kit: internal error`. A command that cannot run here is
listed with its reason in tests/cli/doc_commands_not_run.json, and that list is held to the docs too:
an entry that no document shows any more fails, so it cannot outlive the command it excuses.

The commands run in document order (README, docs/*.md alphabetically, then the --help examples), so a
sequence the docs show (cluster up, run on it, cluster down) runs in that order.
"""

from __future__ import annotations

import pytest

from doc_site import check, doc_site, docs_commands, help_examples, not_run, slurm_host  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def documented() -> dict:
    found = docs_commands()
    for text, command in help_examples().items():
        found.setdefault(text, command).sources.extend(s for s in command.sources if s not in found[text].sources)
    return found


DOCUMENTED = documented()
SKIPPED = not_run()
TO_RUN = [c for text, c in DOCUMENTED.items() if text not in SKIPPED]
# commands that take longer than the default bound (a smoke run of 40 steps, a module suite)
SLOW_SECONDS = 480


def test_the_not_run_list_names_only_documented_commands():
    stale = sorted(set(SKIPPED) - set(DOCUMENTED))
    assert not stale, f"tests/cli/doc_commands_not_run.json lists commands no document shows: {stale}"
    assert all(len(reason) > 20 for reason in SKIPPED.values()), "each entry says why it cannot run here"


def test_most_documented_commands_run():
    # the list of exceptions is for what truly cannot run here (GPUs, registries, remote hosts, hours)
    assert len(TO_RUN) >= 0.6 * len(DOCUMENTED), (len(TO_RUN), len(DOCUMENTED))


@pytest.mark.parametrize("command", TO_RUN, ids=[c.text[:90] for c in TO_RUN])
def test_documented_command_runs_as_written(command, doc_site, slurm_host):  # noqa: F811
    check(doc_site, command, SLOW_SECONDS if any(w in command.text for w in ("suite", "--seeds", "cluster")) else 240)
