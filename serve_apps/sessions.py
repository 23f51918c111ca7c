"""The dispatcher's side of sessions: read the pin, steer the plan, carry the state on a switch.

One `Turn` per request that names a session (router/session_id.py), in this order:

1. `Sessions.open` reads the session's record through the replica's pin cache (serve_apps/session_pins.py).
2. `Turn.planner` wraps the dispatcher's plan: when nothing can take the whole history (a 400
   context_length_exceeded, or a wait because the only other targets' windows are too small), or the
   pinned target's window is what keeps it out, it plans again with the history as short as
   compression can make it; then router/sessions.py's
   `decide_pin` keeps the session on its pinned target or switches it (the scenario's `switch`).
   Every re-plan of a wait for local room goes through the same wrapper.
3. `Turn.body_for(target, body)`, before each attempt: on a target other than the pinned one the
   session's anchor is added as a system message (router/anchor.py), and a history that does not
   fit the target's window is compressed (router/compress.py): the older turns are summarised by
   `sessions.compress.summariser` (a local model; the request's own by default) or, when it cannot
   answer within `summary_timeout_s`, by the start of each turn. A summary a model wrote is kept per
   session (router/summary_cache.py): a later turn reuses it for the turns it covers.
4. `Turn.close` stores the pin (compare-and-set) with the anchor updated from a validated JSON
   answer, and `Turn.view()` is the decision record's `session` field. A streamed answer is known
   only when its stream ends: `Turn.stream_ended` (called from serve_apps/dispatch_streams.py) then
   updates the anchor and the stored history with it, as `close` does for a complete answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from cluster.config import SpilloverConfig
from router.anchor import update_anchor, with_anchor
from router.capabilities import Target
from router.compress import (
    CompressionPlan,
    compressed,
    extractive_summary,
    floor_tokens,
    message_tokens,
    plan_compression,
    transcript,
)
from router.contract import CHARS_PER_TOKEN, RequestContract, estimate_prompt_tokens
from router.decision import Attempt
from router.errors import NoTargetFitsContext
from router.headers import CONTRACT
from router.history import grown, supply
from router.plan import Plan
from router.session_id import pin_key
from router.sessions import PinDecision, after_failover, decide_pin
from router.summary_cache import SummaryCache, incremental_transcript
from router.tool_calls import StreamedMessage
from serve_apps.backend import ModelBackend
from serve_apps.dispatch_types import Dispatched
from serve_apps.session_history import HistoryClient, HistoryStore, local_history
from serve_apps.session_pins import PinClient, PinTable, Record, local_pins
from serve_apps.stream_account import StreamEnd

log = logging.getLogger("spillover.sessions")

SUMMARISE = (
    "Summarise the conversation below for another assistant that will continue it. Keep the task, "
    "decisions, names and numbers; at most {words} words."
)


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
        self.summaries = SummaryCache()  # this replica's summaries of sessions' older turns
        self.pending: set[asyncio.Task[None]] = set()  # streamed answers being stored (Turn.stream_ended)

    async def open(self, contract: RequestContract, body: Mapping[str, Any], request_id: str) -> Turn:
        if not self._settings.enabled or contract.session is None:
            return Turn(None, self, contract, body, request_id, None, False)
        key = pin_key(contract.tenant, contract.model, contract.session)
        record, answered = await self.pins.lookup(key)
        turn = Turn(key, self, contract, body, request_id, record, answered)
        if self.history is not None and isinstance(body.get("messages"), list):
            turn.supply(await self.history.read(key), self._settings.history_tokens)
        return turn

    async def summary(
        self, messages: list[Any], plan: CompressionPlan, request_id: str, model: str, key: str
    ) -> tuple[str, str, int]:
        """(the summary of the planned turns, who wrote it: model:<alias> | extractive, how many of the
        turns a kept summary covered)."""
        settings = self._settings.compress
        run = messages[plan.start : plan.end]
        kept = self.summaries.find(key, run)
        if kept is not None and kept.count == len(run):
            return kept.text, kept.by, kept.count
        alias = settings.summariser or model
        words = settings.summary_tokens * 3 // 4
        told = incremental_transcript(kept, messages, plan, 6000) if kept else transcript(messages, plan, 6000)
        body = {
            "model": alias,
            "messages": [
                {"role": "system", "content": SUMMARISE.format(words=words)},
                {"role": "user", "content": told},
            ],
            "max_tokens": settings.summary_tokens,
            "temperature": 0,
        }
        try:
            reply = await asyncio.wait_for(
                self._local.call(alias, "chat", body, f"{request_id}-summary"), settings.summary_timeout_s
            )
            text = _answer_text(reply.body)
            if text:
                text = text[: settings.summary_tokens * CHARS_PER_TOKEN]  # what compressed() keeps of it
                self.summaries.keep(key, text, f"model:{alias}", run)
                return text, f"model:{alias}", kept.count if kept else 0
        except Exception as exc:  # noqa: BLE001 -- a summariser that fails leaves the extractive summary
            log.warning("summariser %s did not answer: %s", alias, type(exc).__name__)
        return extractive_summary(messages, plan, settings.summary_tokens), "extractive", 0


def _answer_message(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    try:
        message = body["choices"][0]["message"] if body is not None else None
    except (KeyError, IndexError, TypeError):
        return None
    return _kept(message) if isinstance(message, Mapping) else None


def _answer_text(body: Mapping[str, Any] | None) -> str | None:
    message = _answer_message(body)
    return _text(message) if message is not None else None


def _kept(message: Mapping[str, Any]) -> dict[str, Any]:
    """An answer as a session keeps it: its role, content and tool calls."""
    return {k: message[k] for k in ("role", "content", "tool_calls") if message.get(k) is not None}


def _text(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    return content.strip() if isinstance(content, str) else None


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
        self._record = record
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

    def supply(self, stored: list[Any] | None, history_tokens: int) -> None:
        """Put the session's stored turns in front of the client's (sessions.store; router/history.py)."""
        self._sent, self._history = list(self._messages or []), stored
        if stored is None:
            self._history_view = {"store": "unavailable"}
            return
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
        except NoTargetFitsContext:
            if floor is None or floor >= self._contract.est_prompt_tokens:
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
        if self._pinned is not None and target.id != self._pinned and self._anchor:
            messages = with_anchor(messages, self._anchor)
            done["anchor"] = True
        window = target.caps.context_window
        if window:
            compress = self._settings.compress
            # the contract's estimate also counts the tool definitions: they stay, so the messages get the rest
            others = max(0, self._contract.est_prompt_tokens - sum(message_tokens(m) for m in self._messages))
            budget = window - self._contract.max_output_tokens - others
            plan = plan_compression(
                messages, budget, keep_last=compress.keep_last, summary_tokens=compress.summary_tokens
            )
            if plan.needed and plan.fits:
                model, rid = self._contract.model, self._request_id
                summary, by, reused = await self._sessions.summary(messages, plan, rid, model, self._key or "")
                messages = compressed(messages, plan, summary, compress.summary_tokens)
                done["compression"] = {**plan.view(), "summary_by": by}
                if reused:
                    done["compression"]["summary_reused"] = reused
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
            text = _answer_text(done.reply.body) if validated else None
            anchor = update_anchor(self._anchor, self._messages, text, self._settings.anchor.rules())
            self._anchor = anchor
        self._stored = await self._sessions.pins.record(self._key, self._pinned, answered, anchor)
        kept = None
        if self._sessions.history is not None and self._history is not None and self._sent is not None:
            message = _answer_message(done.reply.body)
            kept = grown(self._history, self._sent, message, self._settings.history_max_bytes)
            await self._sessions.history.write(self._key, kept)
        self._answered = (answered, kept)

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
        assert self._answered is not None and self._key is not None
        target, kept = self._answered
        answer = _kept(message)
        if self._messages is not None:
            self._anchor = update_anchor(self._anchor, self._messages, _text(answer), self._settings.anchor.rules())
            await self._sessions.pins.set_anchor(self._key, target, self._anchor)
        if self._sessions.history is not None and kept is not None:
            grown_by = grown(kept, [], answer, self._settings.history_max_bytes)
            await self._sessions.history.write(self._key, grown_by)

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
