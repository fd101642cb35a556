"""Everything the kit knows about VIME: its train.py command line, environment and log format.

- ``records``: the ``rollout|step|perf N: {...}`` lines VIME (and the smoke workload) print.
- ``command``: the train.py command, the Ray runtime env and the flags the seed's entrypoint appended.
"""
