"""Collective argument checks: every rank raises the same error, or none does.

A tensor-parallel call that raised on one rank only would leave the others waiting in the next
collective until its timeout (a hang, then an unrelated error). So the checks run in two steps:
each rank validates its own arguments without raising (`local`), then all ranks exchange what
they found, one ``all_gather_object`` (`agree`): any rank's local error, or a disagreement
between ranks on a value that must be the same everywhere (K, the shards' global scale, the
group size implied by the shapes), raises on every rank with a message naming the ranks and
their values. The exchange pickles a small dict per rank and waits for it on the host (a sync on
a GPU, tens of microseconds): the functions take ``check=False`` to skip it in a hot loop, and
the modules check once, on their first forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

LOCAL_ERRORS = (TypeError, ValueError, NotImplementedError)


def group_info(group=None) -> tuple[int, int]:
    """(this process's rank in `group`, the group's size); `group` None is the default group.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: this process is not a member of `group`.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tk_cute.distributed needs an initialized process group "
                           "(tk_cute.distributed.init_process_group or torch.distributed's)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the process group it was given")
    return rank, dist.get_world_size(group)


def local(fn: Callable[[], dict]) -> tuple[dict, BaseException | None]:
    """Run a rank's own validation, returning (facts, None) or ({}, the error) instead of
    raising (so the rank still takes part in `agree`)."""
    try:
        return fn(), None
    except LOCAL_ERRORS as e:
        return {}, e


def agree(group, what: str, facts: dict, error: BaseException | None = None,
          hints: dict[str, str] | None = None) -> list[dict]:
    """Exchange every rank's `facts` and local `error`; raise the same error on every rank if any
    rank had one or the facts differ between ranks.

    Args:
        group: the process group (None: the default one); every member must call this.
        what: the operation's name, for messages.
        facts: values that must be equal on every rank (shapes, global scales, options), by name.
        error: this rank's local validation error, or None.
        hints: by fact name, a sentence on how a disagreement usually comes about.

    Returns:
        Every rank's facts, by rank.

    Raises:
        TypeError, ValueError, NotImplementedError: on every rank. A local error is re-raised
            with its type where all failing ranks agree on it (ValueError otherwise), its
            message naming each failing rank; a disagreement raises ValueError naming the fact
            and each rank's value.
    """
    _, size = group_info(group)
    got: list = [None] * size
    mine = None if error is None else (type(error).__name__, str(error))
    dist.all_gather_object(got, (mine, {k: _host(v) for k, v in facts.items()}), group=group)
    failed = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
    if failed:
        kinds = {name for _, (name, _) in failed}
        exc = {e.__name__: e for e in LOCAL_ERRORS}.get(kinds.pop()) if len(kinds) == 1 else None
        ranks = ", ".join(str(r) for r, _ in failed)
        by_error: dict[tuple, list[int]] = {}  # ranks with the same error are named together
        for r, e in failed:
            by_error.setdefault(e, []).append(r)
        detail = "; ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {name}: {msg}"
                           for (name, msg), rs in by_error.items())
        raise (exc or ValueError)(f"{what}: bad input on rank(s) {ranks} of {size}: {detail}")
    all_facts = [f for _, f in got]
    for key in all_facts[0]:
        values = [f.get(key) for f in all_facts]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            hint = (hints or {}).get(key)
            raise ValueError(f"{what}: the {size} ranks must agree on {key}, got {shown}"
                             + (f" ({hint})" if hint else ""))
    return all_facts


def _host(value):
    """A fact as a host value: tensors (global scales) are read here, in the exchange, so a call
    with ``check=False`` never reads device memory."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_host(v) for v in value)
    return value


def checked(group, what: str, validate: Callable[[], dict], check: bool,
            hints: dict[str, str] | None = None) -> dict:
    """`local` + `agree` when `check`; with ``check=False`` a local error raises on this rank
    only (the caller vouched for consistent arguments) and no device value is read. Returns
    this rank's facts (device tensors among them as given)."""
    facts, error = local(validate)
    if check:
        agree(group, what, facts, error, hints)
    elif error is not None:
        raise error
    return facts
