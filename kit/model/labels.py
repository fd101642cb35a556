"""The prefix of every image label the kit sets (``dev.rlk-kit.stack.sha256``, ...): one place, read by the
build (which sets them) and by the model of a node's identity (which reads them). Example::

    f"{LABEL_PREFIX}.stack.sha256"      # 'dev.rlk-kit.stack.sha256'
"""

LABEL_PREFIX = "dev.rlk-kit"
