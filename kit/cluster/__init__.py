"""Multi-node clusters: a local rehearsal of pinned containers, Slurm batch scripts, KubeRay documents."""
