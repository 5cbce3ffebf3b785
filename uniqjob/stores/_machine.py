"""The semaphore state machine over one plain, JSON-ready record per key.

The memory and file stores run these transitions under their own mutual
exclusion (through :class:`~._template.MachineStore`, the semaphore contract
over one hook); the Redis store runs the same ones as Lua scripts
(``redis/_semaphores.py``), and the shared contract suite holds them to one meaning.

Record: ``{"key", "limit", "cls", "slots": {token: slot}, "parked": [entry, ...],
"done": {token: expires}}``. A slot: ``st`` (reserved/promoted/running), ``via``,
``h`` (holder text or ""), ``dl`` (lease deadline), ``ls`` (lease), ``since``,
``redo``, ``args``, ``p`` (payload, while promoted for a queue). An entry:
``token``, ``via``, ``h``, ``ls``, ``dl`` (inline waiters only), ``since``, ``args``, ``p``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._schema import Record
from .semaphores import (
    TOMBSTONE,
    Outcome,
    Park,
    ParkedInfo,
    Promotion,
    SemaphoreState,
    SlotInfo,
    decode_holder,
    encode_holder,
)


class Machine:
    """One key's record as of ``now``; ``changed`` says whether it must be stored."""

    def __init__(self, key: str, record: Record | None, now: float) -> None:
        record = record or {}
        self.key = key
        self.now = now
        self.limit: int = record.get("limit", 1)
        self.cls: str = record.get("cls", "")
        self.slots: dict[str, dict[str, Any]] = record.get("slots", {})
        self.parked: list[dict[str, Any]] = record.get("parked", [])
        self.done: dict[str, float] = record.get("done", {})
        self.changed = False

    def record(self) -> Record | None:
        """Return the record to store, or None when the key holds nothing."""
        if not self.slots and not self.parked and not self.done:
            return None
        return {
            "key": self.key,
            "limit": self.limit,
            "cls": self.cls,
            "slots": self.slots,
            "parked": self.parked,
            "done": self.done,
        }

    # -- settling --------------------------------------------------------------------

    def settle(self, caller: str, handoff: float) -> list[Promotion]:
        now, promos = self.now, []
        for token in [t for t, expires in self.done.items() if expires <= now]:
            del self.done[token]
            self.changed = True
        for token, slot in list(self.slots.items()):
            if slot["dl"] > now:
                continue
            if slot["st"] == "promoted" and slot["via"] == "queue":
                promos.append(self._claim_again(token, slot, caller, handoff))
            else:
                self._vacate(token, slot)
            self.changed = True
        kept = [e for e in self.parked if e["via"] != "inline" or e["dl"] > now]
        if len(kept) != len(self.parked):
            self.parked, self.changed = kept, True
        promos += self._promote(caller, handoff)
        return promos

    def _vacate(self, token: str, slot: dict[str, Any]) -> None:
        """Free a lapsed or dead holder's slot; one that ran a call pushed twice waits for its other copy.

        That copy (or the dead run's retry) then starts the slot, and its release remembers the
        token as done, so a third delivery never runs: freed outright, each would take a new
        slot and run. Kept for one lease; if no copy comes by then it is freed.
        """
        if slot["st"] == "running" and slot["redo"] > 0:
            slot.update(st="reserved", via="queue", h="", dl=self.now + slot["ls"], p="")
        else:
            del self.slots[token]

    def _claim_again(self, token: str, slot: dict[str, Any], caller: str, handoff: float) -> Promotion:
        slot.update(h=caller, dl=self.now + handoff, redo=slot["redo"] + 1)
        self.changed = True
        return Promotion(token, "queue", slot["p"], slot["redo"])

    def _promote(self, caller: str, handoff: float) -> list[Promotion]:
        promos = []
        while len(self.slots) < self.limit and self.parked:
            e = self.parked.pop(0)
            inline = e["via"] == "inline"  # the waiter keeps holding it, by the lease it kept its place with
            holder, deadline = (e["h"], e["dl"]) if inline else (caller, self.now + handoff)
            slot = self._slot("promoted", e["via"], holder, deadline=deadline, lease=e["ls"], args=e["args"])
            slot["p"] = "" if inline else e["p"]
            self.slots[e["token"]] = slot
            promos.append(Promotion(e["token"], e["via"], slot["p"], 0))
            self.changed = True
        return promos

    def _slot(
        self, st: str, via: str, holder: str, *, deadline: float, lease: float, args: str
    ) -> dict[str, Any]:
        return {
            "st": st, "via": via, "h": holder, "dl": deadline, "ls": lease, "since": self.now,
            "redo": 0, "args": args, "p": "",
        }  # fmt: skip

    def _entry(self, token: str) -> dict[str, Any] | None:
        return next((e for e in self.parked if e["token"] == token), None)

    def _position(self, token: str) -> int:
        return next(i for i, e in enumerate(self.parked, 1) if e["token"] == token)

    # -- transitions -----------------------------------------------------------------

    def acquire(
        self,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: str,
        park: Park | None,
        job_class: str,
        args: str,
        caller: str,
        handoff: float,
    ) -> Outcome:
        if (self.limit, self.cls) != (limit, job_class):
            self.limit, self.cls, self.changed = limit, job_class, True
        promos = tuple(self.settle(caller, handoff))
        if token in self.slots:
            return Outcome("taken", promos)
        if self._entry(token) is not None:
            return Outcome("parked", promos, position=self._position(token), slots=self.slot_infos())
        if len(self.slots) < limit:  # then nothing is parked: settling promoted it
            via = "inline" if running or holder else "queue"
            st = "running" if running else "reserved"
            self.slots[token] = self._slot(st, via, holder, deadline=self.now + lease, lease=lease, args=args)
            self.changed = True
            return Outcome("taken", promos)
        if park is not None:
            entry = {
                "token": token, "via": park.via, "h": encode_holder(park.holder), "ls": lease,
                "since": self.now, "args": args, "p": park.payload,
                "dl": self.now + park.lease if park.via == "inline" else None,
            }  # fmt: skip
            self.parked.append(entry)
            self.changed = True
            return Outcome("parked", promos, position=len(self.parked), slots=self.slot_infos())
        return Outcome("full", promos, slots=self.slot_infos())

    def start(
        self, token: str, *, holder: str, lease: float, takeover: str, caller: str, handoff: float
    ) -> Outcome:
        promos = tuple(self.settle(caller, handoff))
        slot = self.slots.get(token)
        if slot is not None:
            if slot["st"] == "running" and slot["h"] != takeover:
                return Outcome("busy", promos, holder=decode_holder(slot["h"]))
            slot.update(st="running", h=holder, dl=self.now + lease, ls=lease, p="")
            self.changed = True
            return Outcome("run", promos)
        entry = self._entry(token)
        if entry is not None:
            if entry["via"] == "inline" and entry["h"] == holder:
                entry["dl"] = self.now + lease
                self.changed = True
            return Outcome("parked", promos, position=self._position(token))
        if token in self.done:
            return Outcome("done", promos)
        return Outcome("missing", promos)

    def renew(self, token: str, lease: float, caller: str, handoff: float) -> Outcome:
        promos = tuple(self.settle(caller, handoff))
        slot = self.slots.get(token)
        if slot is not None:
            slot.update(dl=self.now + lease, ls=lease)
            self.changed = True
            return Outcome("ok", promos)
        entry = self._entry(token)
        if entry is None:
            return Outcome("gone", promos)
        if entry["via"] == "inline":
            entry["dl"] = self.now + lease
            self.changed = True
        return Outcome("ok", promos)

    def release(self, token: str, caller: str, handoff: float) -> Outcome:
        slot = self.slots.pop(token, None)
        if slot is not None:
            self.changed = True
            if slot["redo"] > 0:
                self.done[token] = self.now + TOMBSTONE
        promos = tuple(self.settle(caller, handoff))
        return Outcome("released" if slot is not None else "gone", promos)

    def requeue(self, token: str, lease: float, holder: str, caller: str, handoff: float) -> Outcome:
        promos = tuple(self.settle(caller, handoff))
        slot = self.slots.get(token)
        if slot is None or slot["st"] != "running" or slot["h"] != holder:
            return Outcome("gone", promos)
        slot.update(st="reserved", via="queue", h="", dl=self.now + lease, ls=lease, p="")
        self.changed = True
        return Outcome("ok", promos)

    def handed(self, token: str, promoter: str) -> bool:
        slot = self.slots.get(token)
        if slot is None or slot["st"] != "promoted" or slot["h"] != promoter:
            return False
        slot.update(st="reserved", h="", dl=self.now + slot["ls"], p="")
        self.changed = True
        return True

    def withdraw(self, token: str) -> Outcome:
        entry = self._entry(token)
        if entry is not None:
            self.parked.remove(entry)
            self.changed = True
            return Outcome("withdrawn")
        return Outcome("slot" if token in self.slots else "gone")

    def reap(self, dead: Sequence[tuple[str, str]], caller: str, handoff: float) -> Outcome:
        count, promos = 0, []
        for token, holder in dead:
            slot = self.slots.get(token)
            if slot is not None:
                if slot["h"] != holder:
                    continue
                if slot["st"] == "promoted" and slot["via"] == "queue":
                    promos.append(self._claim_again(token, slot, caller, handoff))
                else:
                    self._vacate(token, slot)
                    count += 1
                    self.changed = True
                continue
            entry = self._entry(token)
            if entry is not None and entry["via"] == "inline" and entry["h"] == holder:
                self.parked.remove(entry)
                count += 1
                self.changed = True
        promos += self.settle(caller, handoff)
        return Outcome("ok", tuple(promos), count=count)

    def discard_parked(self) -> list[tuple[str, str]]:
        dropped = [(e["token"], e["p"]) for e in self.parked]
        if dropped:
            self.parked, self.changed = [], True
        return dropped

    def drop(self, tokens: Sequence[str], caller: str, handoff: float) -> Outcome:
        count = 0
        for token in tokens:
            if self.slots.pop(token, None) is not None:
                count += 1
                self.changed = True
        promos = tuple(self.settle(caller, handoff))
        return Outcome("ok", promos, count=count)

    # -- reading ---------------------------------------------------------------------

    def slot_infos(self) -> tuple[SlotInfo, ...]:
        return tuple(
            SlotInfo(
                token=token,
                status=s["st"],
                via=s["via"],
                holder=decode_holder(s["h"]),
                since=s["since"],
                lease=s["ls"],
                lease_left=s["dl"] - self.now,
                redo=s["redo"],
                args=s["args"],
            )
            for token, s in self.slots.items()
        )

    def state(self, head: int) -> SemaphoreState:
        return SemaphoreState(
            key=self.key,
            limit=self.limit,
            job_class=self.cls,
            slots=self.slot_infos(),
            parked=len(self.parked),
            head=tuple(
                ParkedInfo(e["token"], e["via"], decode_holder(e["h"]), e["since"], e["args"])
                for e in self.parked[:head]
            ),
            now=self.now,
        )
