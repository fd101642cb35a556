"""What the model floor knows of each engine: the facts an arm document is judged by.

The rest of an engine (its command, log parser, the gates it needs, what it needs of a host) lives in
``kit/engines/<name>/``, which builds on these traits. An arm names its engine; every question about
it goes through :func:`traits` rather than comparing names. Example::

    traits("smoke").platform            # 'cpu'
    traits("vime").fixed_evidence_level # None: the topology decides
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.model.errors import BadInput


@dataclass(frozen=True)
class EngineTraits:
    name: str
    platform: str                      # the image platform its arms run on by default
    reward_model: str                  # the one reward it implements (an arm without workload.algorithm gets it)
    fixed_evidence_level: str | None   # its arms' evidence level whatever the topology; None: the topology decides
    runs_on_host: bool                 # the local runtime can run it on the kit's host (in-process or a local Ray head)
    needs_gpus: bool                   # its arms need GPUs (and a GPU container runtime)
    uses_input_files: bool             # model, checkpoint and prompt data from the workspace (kit prepare)
    job_in_image_dir: bool             # its job starts in an in-image source directory (not an uploaded working_dir)
    reads_arm_file: bool               # its job reads the run's arm.json (--arm-file), which a cluster must be sent
    routes_required: bool              # every module's kernel route line must be in its log (else optional)
    model_identity_in_log: bool        # its log states the model it built (checked against the pinned inputs)
    captures_graphs: bool              # it can capture CUDA graphs (graph.mode other than NONE)
    production_choice: bool            # its arms choose the production implementation (arm/v5 ``production``)


SMOKE = EngineTraits("smoke", platform="cpu", reward_model="copy", fixed_evidence_level="smoke", runs_on_host=True,
                     needs_gpus=False, uses_input_files=False, job_in_image_dir=False, reads_arm_file=True,
                     routes_required=True, model_identity_in_log=True, captures_graphs=False,
                     production_choice=False)
VIME = EngineTraits("vime", platform="cuda", reward_model="deepscaler", fixed_evidence_level=None, runs_on_host=False,
                    needs_gpus=True, uses_input_files=True, job_in_image_dir=True, reads_arm_file=False,
                    routes_required=False, model_identity_in_log=False, captures_graphs=True,
                    production_choice=False)

GPU = EngineTraits("gpu", platform="cuda", reward_model="successor", fixed_evidence_level=None, runs_on_host=True,
                   needs_gpus=True, uses_input_files=False, job_in_image_dir=False, reads_arm_file=True,
                   routes_required=False, model_identity_in_log=False, captures_graphs=False,
                   production_choice=True)

TRAITS: dict[str, EngineTraits] = {t.name: t for t in (SMOKE, VIME, GPU)}


def traits(name: str) -> EngineTraits:
    """The traits of a named engine; BadInput naming the accepted ones otherwise."""
    try:
        return TRAITS[name]
    except KeyError:
        raise BadInput(f"engine {name!r}: accepted {', '.join(sorted(TRAITS))}") from None
