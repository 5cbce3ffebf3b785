"""``uniqjob run --overlap`` in the record machine: what ``LockMachine.overlap`` decides.

See :meth:`Backend.overlap <.base.Backend.overlap>`; the Redis store's OVERLAP script
(redis/_overlap.py) is the same machine. The key's pending run is the record's ``o``: ``p`` its
token ("" once it took the key while a run watched it: ``w`` then tells that run), ``h`` its
holder (``host:pid``), ``u`` until when its place holds, ``w`` the token of the run whose holder
watches it take the key (``"follow"``). On the run lock: ``stop``, who asked it to stop; ``owed``,
set when a run coalesced into the pending run while it held the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..locks import RUNNING

if TYPE_CHECKING:
    from ._records import LockMachine
    from .base import Overlap, OverlapMode

__all__ = ["overlap"]


def overlap(m: LockMachine, token: str, mode: OverlapMode, lease: float, holder: str) -> Overlap:
    """Decide what the run of ``token`` (``holder``: ``host:pid``) does; ``m`` records what it changed."""
    q, r, o = m.q, m.r, m.o
    p, w = ("", "") if o is None else (o["p"], o.get("w", ""))
    if mode == "withdraw":
        if o is not None and p == token:
            ran = w and r is not None and r["token"] == token  # it took the key: tell who waits for that
            m.o = {"p": "", "h": "", "u": m.now + lease, "w": w} if ran else None
            m.changed = True
        return "free"
    if mode == "follow":
        return _follow(m, token)
    orphan = q is not None and q["state"] == RUNNING and r is None
    busy = (q is not None and not orphan and q["token"] != token) or (r is not None and r["token"] != token)
    if mode == "terminate":
        if r is not None and r["token"] != token:
            if not r.get("stop"):
                m.r, m.changed = {**r, "stop": holder}, True
            return "stopping"
        return "busy" if busy else "free"
    if p and p != token and (r is None or r["token"] != p):  # another run is pending
        if r is not None:  # its holder runs once more if need be (see _follow)
            m.r, m.changed = {**r, "owed": holder}, True
        return "coalesced"
    if not busy:
        return "free"
    m.o, m.changed = {**(o or {}), "p": token, "h": holder, "u": m.now + lease}, True
    return "pending"


def _follow(m: LockMachine, token: str) -> Overlap:
    """``"follow"``: does the run of ``token``, which ends, owe the runs coalesced behind it a run?"""
    r, o = m.r, m.o
    p, w = ("", "") if o is None else (o["p"], o.get("w", ""))
    if r is not None and r["token"] == token:  # it still holds the key: a run waits, or runs coalesced?
        if o is not None and p and p != token:
            m.o, m.changed = {**o, "w": token}, True  # watch the pending run take the key
            return "coalesced"
        return "pending" if r.get("owed") else "free"
    if w != token or o is None:
        return "pending"  # the pending run it watched is gone: the run is the caller's to give
    if p and r is None:
        return "coalesced"  # it still waits
    # a run holds the key (started after ours: the pending run, or another), or the pending run ran
    m.o, m.changed = ({k: v for k, v in o.items() if k != "w"} if p else None), True
    return "free"
