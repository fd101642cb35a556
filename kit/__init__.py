"""rlk-kit: pinned images, sealed evidence and controlled comparisons for RL post-training runs.

Nothing here imports torch, ray or docker at import time: `kit --help` must stay fast.
"""

__version__ = "0.1.0"
