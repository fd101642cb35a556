"""Adapters: the kit's only doors to the outside systems it drives.

``docker`` is the only module that imports docker-py, ``ray`` the only one that imports the Ray SDK,
``gpus`` the only one that lists GPUs. Everything above them speaks the kit's own terms, so a new SDK
version or a new timeout is one edit here.
"""
