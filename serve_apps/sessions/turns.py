"""The dispatcher's side of sessions: read the pin, steer the plan, carry the state on a switch.

One `Turn` per request that names a session (router/sessions/session_id.py), in this order:

1. `Sessions.open` reads the session's record through the replica's pin cache (serve_apps/sessions/pins.py)
   and, with `sessions.store`, its stored turns; the labels both carry (router/sessions/carried.py) are joined
   into the turn's contract (`RequestContract.carried`): the turn may go only where the turns its
   session carries could (the carried-state rule, docs/security.md).
2. `Turn.planner` wraps the dispatcher's plan: when nothing can take the whole history (a 400
   context_length_exceeded, or a wait because the only other targets' windows are too small), or the
   pinned target's window is what keeps it out, it plans again with the history as short as
   compression can make it; then router/sessions/sessions.py's
   `decide_pin` keeps the session on its pinned target or switches it (the scenario's `switch`).
   Every re-plan of a wait for local room goes through the same wrapper.
3. `Turn.body_for(target, body)`, before each attempt: a history that does not fit the target's
   window is compressed (router/sessions/compress.py; the summary: serve_apps/sessions/summaries.py), and on a
   target other than the pinned one the session's anchor is added after the client's system
   messages (router/sessions/anchor.py). Both are user messages: their text is the client's, never a system
   prompt.
4. `Turn.close` stores the pin (compare-and-set) with the anchor updated from a validated JSON
   answer and the label of the turn (its own constraints joined with what it carried), and
   `Turn.view()` is the decision record's `session` field. A streamed answer is known
   only when its stream ends: `Turn.stream_ended` (called from serve_apps/dispatch/streams.py) then
   updates the anchor and the stored history with it, as `close` does for a complete answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import reduce
from typing import Any

from cluster.config.deployment import SpilloverConfig
from router.errors import NoCapableModel
from router.headers import CONTRACT
from router.learning.decision import Attempt
from router.output.tool_calls import StreamedMessage
from router.request.contract import RequestContract, estimate_prompt_tokens
from router.routing.capabilities import Target
from router.routing.plan import Plan
from router.sessions.anchor import anchor_message, update_anchor, with_anchor
from router.sessions.carried import Label, Origin, effective_label, from_json
from router.sessions.compress import compressed, floor_tokens, message_tokens, plan_compression
from router.sessions.history import grown, supply
from router.sessions.session_id import pin_key
from router.sessions.sessions import PinDecision, after_failover, decide_pin
from serve_apps.backend import ModelBackend
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.sessions.history import HistoryClient, HistoryStore, Stored, local_history
from serve_apps.sessions.pins import PinClient, PinTable, Record, local_pins
from serve_apps.sessions.summaries import Summariser, answer_message, answer_text, kept_answer, message_text
from serve_apps.streams.account import StreamEnd

log = logging.getLogger("spillover.sessions")


class Sessions:
    def __init__(
        self,
        config: SpilloverConfig,
        local: ModelBackend,
        pins: PinClient | None = None,
        history: HistoryClient | None = None,
        replica: str | None = None,
    ) -> None:
        self._config = config
        self.replica = replica  # the gateway replica this runs in, named in each turn's record
        self._settings = config.sessions
        self._local = local
        if pins is None:  # no shared table (tests, a gateway without Ray): pins live in this process
            table = PinTable(ttl_s=self._settings.ttl_s, max_sessions=self._settings.max_sessions)
            pins = PinClient(*local_pins(table), cache_s=0.0)
        self.pins = pins
        if history is None and self._settings.store:  # likewise for the stored turns
            store = HistoryStore(ttl_s=self._settings.ttl_s, total_bytes=self._settings.history_total_bytes)
            history = HistoryClient(*local_history(store))
        self.history = history if self._settings.store else None
        self.summariser = Summariser(local, self._settings.compress)  # this replica's kept summaries
        self.pending: set[asyncio.Task[None]] = set()  # streamed answers being stored (Turn.stream_ended)

    async def open(self, contract: RequestContract, body: Mapping[str, Any], request_id: str) -> Turn:
        if not self._settings.enabled or contract.session is None:
            return Turn(None, self, contract, body, request_id, None, False)
        key = pin_key(contract.tenant, contract.model, contract.session)
        record, answered = await self.pins.lookup(key)
        turn = Turn(key, self, contract, body, request_id, record, answered)
        if self.history is not None and isinstance(body.get("messages"), list):
            turn.supply(await self.history.read(key), self._settings.history_tokens)
        turn.carry()
        return turn


def _length_bound(error: NoCapableModel) -> bool:
    """Whether only the context window (and what the session carries) kept every target out: then a
    compressed history may still fit."""
    filters = {r.get("filter") for r in error.reasons}
    return "context" in filters and filters <= {"context", "carried"}


def _own(label: Any, tenant: str | None) -> bool:
    """Whether a stored label is of `tenant`'s turns (one that cannot be read is taken as `tenant`'s, strictest)."""
    return from_json(label, tenant).tenant == tenant


class Turn:
    def __init__(
        self,
        key: str | None,
        sessions: Sessions,
        contract: RequestContract,
        body: Mapping[str, Any],
        request_id: str,
        record: Record | None,
        answered: bool,
    ) -> None:
        self._key = key
        self._sessions = sessions
        self._settings = sessions._settings
        self._contract = contract
        self._messages = body.get("messages") if isinstance(body.get("messages"), list) else None
        self._request_id = request_id
        if record is not None and not _own(record.get("label"), contract.tenant):
            log.warning("session pin of another tenant ignored")  # keys hold the tenant: never expected
            record = None
        self._record = record
        # the labels of what the session carries (router/sessions/carried.py): the pin's anchor, the stored history
        self._labels: list[Label] = [from_json(record.get("label"), contract.tenant)] if record else []
        turns = record["turns"] + 1 if record else (1 if answered else None)
        self._origin = Origin(request_id, contract.scenario, turns)
        self._label: dict[str, Any] | None = None  # after close: the label this turn left
        self._table_answered = answered
        self._pinned: str | None = record["target"] if record else None
        self._anchor: dict[str, Any] = dict(record.get("anchor") or {}) if record else {}
        self.decision: PinDecision | None = None
        self._prepared: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # target id -> (body, what was done)
        self._floor_planned = False
        self._stored: Record | None = None
        self.contract, self.body = contract, dict(body)
        self._sent: list[Any] | None = None  # with sessions.store: the client's own messages
        self._history: list[Any] | None = None  # with sessions.store: the stored ones (None: unavailable)
        self._history_view: dict[str, Any] | None = None
        self._answered: tuple[str, list[Any] | None] | None = None  # after close: the target, the stored history

    def supply(self, read: Stored | None, history_tokens: int) -> None:
        """Put the session's stored turns in front of the client's (sessions.store; router/sessions/history.py)."""
        stored, label = read if read is not None else (None, None)
        if label is not None and not _own(label, self._contract.tenant):
            log.warning("session history of another tenant ignored")  # keys hold the tenant: never expected
            stored, label = [], None
        self._sent, self._history = list(self._messages or []), stored
        if stored is None:
            self._history_view = {"store": "unavailable"}
            return
        if (
            stored or label is not None
        ):  # stored turns without a label count as the strictest (router/sessions/carried.py)
            self._labels.append(from_json(label, self._contract.tenant))
        supplied = supply(stored, self._sent, history_tokens)
        self._sent = supplied.new  # what the store gets after this turn (not what the client re-sent)
        self._messages = supplied.messages
        self.body = {**self.body, "messages": supplied.messages}
        tools = self.contract.needs_tools or any(isinstance(m, dict) and m.get("role") == "tool" for m in stored)
        self.contract = self._contract = replace(
            self.contract, est_prompt_tokens=estimate_prompt_tokens(self.body)[0], needs_tools=tools
        )
        self._history_view = {"supplied": supplied.supplied, "dropped": supplied.dropped, "tokens": supplied.tokens}
        if supplied.resent:
            self._history_view["resent"] = supplied.resent

    def carry(self) -> None:
        """The turn's contract joined with the labels of what its session carries (the carried-state rule)."""
        if self._labels:
            carried = reduce(Label.join, self._labels)
            self.contract = self._contract = replace(self._contract, carried=carried)

    @property
    def active(self) -> bool:
        return self._key is not None

    def _floor(self) -> int | None:
        if self._messages is None:
            return None
        compress = self._settings.compress
        tokens = floor_tokens(self._messages, keep_last=compress.keep_last, summary_tokens=compress.summary_tokens)
        if self._anchor:
            tokens += message_tokens(with_anchor([], self._anchor)[0])
        return tokens

    def planner(self, plan: Callable[[RequestContract], Plan]) -> Callable[[], Plan]:
        """`plan` (the dispatcher's, for one contract) with compression and the pin decision applied."""
        if not self.active:
            return lambda: plan(self._contract)
        rule = self._sessions._config.policy.scenarios[self._contract.scenario].switch

        def planned() -> Plan:
            made = self._with_floor(plan)
            steered, self.decision = decide_pin(self._pinned, made, rule)
            text = self.decision.describe()
            reason = text if self.decision.action == "switch" else f"{text}; {steered.reason}"
            return replace(steered, reason=reason)

        return planned

    def _with_floor(self, plan: Callable[[RequestContract], Plan]) -> Plan:
        """The plan for the whole history; when no target can take it, the plan for the history as
        compression would shorten it (the compression itself happens per target in `body_for`)."""
        floor = self._floor()
        try:
            made: Plan | None = plan(self._contract)
        except NoCapableModel as error:
            if not _length_bound(error) or floor is None or floor >= self._contract.est_prompt_tokens:
                raise
            made = None
        cut = made.pipeline.removed if made is not None else ()
        pinned_cut = any(r.target == self._pinned and r.filter == "context" for r in cut)  # it can take it shortened
        context_bound = made is None or pinned_cut or (made.route == "wait" and any(r.filter == "context" for r in cut))
        if not context_bound or floor is None or floor >= self._contract.est_prompt_tokens:
            assert made is not None
            return made
        shorter = plan(replace(self._contract, est_prompt_tokens=floor))
        if made is not None and shorter.route == "wait" and not pinned_cut:
            return made
        self._floor_planned = True
        return shorter

    async def body_for(self, target: Target, body: dict[str, Any]) -> dict[str, Any]:
        """The body `target` gets: with the anchor on a switch, compressed when the history does not fit."""
        if not self.active or self._messages is None:
            return body
        if target.id in self._prepared:
            return {**body, "messages": self._prepared[target.id][0]["messages"]}
        messages: list[Any] = list(self._messages)
        done: dict[str, Any] = {"target": target.id}
        anchored = self._pinned is not None and target.id != self._pinned and bool(self._anchor)
        window = target.caps.context_window
        if window:
            compress = self._settings.compress
            # the contract's estimate also counts the tool definitions: they stay, so the messages get the rest
            others = max(0, self._contract.est_prompt_tokens - sum(message_tokens(m) for m in self._messages))
            anchor = message_tokens(anchor_message(self._anchor)) if anchored else 0
            budget = window - self._contract.max_output_tokens - others - anchor
            plan = plan_compression(
                messages, budget, keep_last=compress.keep_last, summary_tokens=compress.summary_tokens
            )
            if plan.needed and plan.fits:
                summary, by, reused = await self._sessions.summariser.summary(
                    messages, plan, self._request_id, self.contract, self._key or "", target, self._left()
                )
                messages = compressed(messages, plan, summary, compress.summary_tokens)
                done["compression"] = {**plan.view(), "summary_by": by}
                if reused:
                    done["compression"]["summary_reused"] = reused
        if anchored:  # after the client's system messages, before the summary (router/sessions/anchor.py)
            messages = with_anchor(messages, self._anchor)
            done["anchor"] = True
        self._prepared[target.id] = ({"messages": messages}, done)
        return {**body, "messages": messages}

    async def close(self, trail: list[Attempt], done: Dispatched) -> None:
        """Store the pin on the target that answered, with the anchor updated from a validated answer."""
        if not self.active or self._key is None:
            return
        # a stream's attempt reads `streaming` until it ends: the target that started answering
        answered = next((a.target for a in reversed(trail) if a.outcome in ("ok", "streaming")), None)
        failure = next((f"{a.target} failed ({a.error})" for a in reversed(trail) if a.outcome == "error"), "")
        if self.decision is not None:
            self.decision = after_failover(self.decision, answered, failure)
        if answered is None:
            return
        anchor = None
        if self._messages is not None:
            validated = done.reply.body is not None and done.headers.get(CONTRACT) in (None, "repaired")
            text = answer_text(done.reply.body) if validated else None
            anchor = update_anchor(self._anchor, self._messages, text, self._settings.anchor.rules())
            self._anchor = anchor
        self._label = label = self._left().to_json()
        self._stored = await self._sessions.pins.record(self._key, self._pinned, answered, anchor, label)
        kept = None
        if self._sessions.history is not None and self._history is not None and self._sent is not None:
            message = answer_message(done.reply.body)
            kept = grown(self._history, self._sent, message, self._settings.history_max_bytes)
            await self._sessions.history.write(self._key, kept, label)
        self._answered = (answered, kept)

    def _left(self) -> Label:
        """The label of what this turn leaves behind: its own constraints joined with what it carried."""
        return effective_label(self.contract, self._origin)

    def stream_ended(self, end: StreamEnd, message: StreamedMessage) -> None:
        """A streamed turn's end: a whole answer that passed its output contract (nothing flagged)
        updates the anchor and the stored history as `close` does for a complete one. Called in the
        stream's `finally`, which must not await: the storing runs as a task."""
        if self._answered is None or end.outcome != "ok" or end.contract is not None or message.overflowed:
            return
        task = asyncio.get_running_loop().create_task(self._streamed_answer(message.message()))
        self._sessions.pending.add(task)
        task.add_done_callback(self._sessions.pending.discard)

    async def _streamed_answer(self, message: dict[str, Any]) -> None:
        assert self._answered is not None and self._key is not None and self._label is not None
        target, kept = self._answered
        answer = kept_answer(message)
        if self._messages is not None:
            rules = self._settings.anchor.rules()
            self._anchor = update_anchor(self._anchor, self._messages, message_text(answer), rules)
            await self._sessions.pins.set_anchor(self._key, target, self._anchor, self._label)
        if self._sessions.history is not None and kept is not None:
            grown_by = grown(kept, [], answer, self._settings.history_max_bytes)
            await self._sessions.history.write(self._key, grown_by, self._label)

    def view(self) -> dict[str, Any] | None:
        """The decision record's `session` field."""
        if not self.active:
            return None
        view: dict[str, Any] = {"id": self._contract.session, "pinned": self._pinned}
        if self._sessions.replica is not None:
            view["gateway_replica"] = self._sessions.replica
        if not self._table_answered:
            view["pin_table"] = "unavailable"
        if self.decision is not None:
            d = self.decision
            view.update(action=d.action, target=d.target, reason=d.reason[:300])
            if d.action == "switch":
                view["switch"] = {"from": d.pinned, "to": d.target, "why": d.why}
        if self._floor_planned:
            view["planned_compressed"] = True
        prepared = [what for _, what in self._prepared.values() if len(what) > 1]
        if prepared:
            view["prepared"] = prepared
        if self._history_view is not None:
            view["history"] = self._history_view
        if self._stored is not None:
            view["stored"] = {k: self._stored[k] for k in ("target", "turns", "switches") if k in self._stored}
        return view
