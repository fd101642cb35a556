"""The synthetic task: count on from the prompt's last digit, with a verifiable per-position reward.

A prompt is ``<bos> d1 d2 d3 =``; the right response is ``d3+1, d3+2, ...`` (mod 10) for the whole
response length. The reward of a response is the fraction of positions whose token is the successor
of the token before it (the first position follows ``d3``): dense, exact, and learnable by a
randomly initialised model, whose reward starts near 1/16 (16 live token ids). Example::

    >>> import torch
    >>> successor_reward(torch.tensor([[DIGIT0 + 8, DIGIT0 + 9, DIGIT0 + 0]]), torch.tensor([DIGIT0 + 7])).tolist()
    [1.0]
"""

from __future__ import annotations

PAD, BOS, EQUALS, DIGIT0 = 0, 1, 2, 3
TASK_VOCAB = 16                  # PAD, BOS, '=', ten digits, three filler ids the model must learn to avoid
PROMPT_DIGITS = 3
PROMPT_LEN = PROMPT_DIGITS + 2
PROMPT_SET_SIZE = 1000


def prompt_set(seed: int = 0):
    """The built-in prompts [PROMPT_SET_SIZE, PROMPT_LEN] (a fixed, seeded list, drawn on the CPU)."""
    import torch
    gen = torch.Generator().manual_seed(104729 + seed)
    cpu = {"device": "cpu"}   # the same list whatever device is the default
    digits = torch.randint(0, 10, (PROMPT_SET_SIZE, PROMPT_DIGITS), generator=gen, **cpu) + DIGIT0
    return torch.cat([torch.full((PROMPT_SET_SIZE, 1), BOS, **cpu), digits, torch.full((PROMPT_SET_SIZE, 1), EQUALS, **cpu)],
                     dim=1)


def prompt_set_sha256(seed: int = 0) -> str:
    import hashlib
    return hashlib.sha256(prompt_set(seed).contiguous().numpy().tobytes()).hexdigest()


def successor_reward(responses, last_prompt_digit):
    """[B] rewards: the fraction of positions i where responses[:, i] is the successor (mod 10) of the token before."""
    import torch
    previous = torch.cat([last_prompt_digit.view(-1, 1), responses[:, :-1]], dim=1)
    is_digit = (previous >= DIGIT0) & (previous < DIGIT0 + 10)
    expected = (previous - DIGIT0 + 1) % 10 + DIGIT0
    hits = (responses == expected) & is_digit
    return hits.float().mean(dim=1)
