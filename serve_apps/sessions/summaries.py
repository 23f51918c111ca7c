"""Summaries of a session's older turns, written by the local summariser model (serve_apps/sessions/turns.py).

`Summariser.summary` writes the summary of a compression plan's older turns with
`sessions.compress.summariser` (a local model alias; the request's own by default) within
`summary_timeout_s`, or — when it cannot answer — the start of each turn (`extractive`). A summary
a model wrote is kept per session with the label of the turns it summarises (router/sessions/summary_cache.py,
router/sessions/carried.py): a later turn reuses it for the turns it covers, but only on a target that label
admits; anywhere else it is written afresh from the turns the request itself carries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from cluster.config.session import CompressSection
from router.request.contract import CHARS_PER_TOKEN, RequestContract
from router.routing.capabilities import Target
from router.routing.filters import carried_refusal
from router.sessions.carried import Label
from router.sessions.compress import CompressionPlan, extractive_summary, transcript
from router.sessions.summary_cache import SummaryCache, incremental_transcript
from serve_apps.backend import ModelBackend

log = logging.getLogger("spillover.sessions")

SUMMARISE = (
    "Summarise the conversation below for another assistant that will continue it. Keep the task, "
    "decisions, names and numbers; at most {words} words."
)
TRANSCRIPT_CHARS = 6000


class Summariser:
    def __init__(self, local: ModelBackend, settings: CompressSection) -> None:
        self._local = local
        self._settings = settings
        self.kept = SummaryCache()  # this replica's summaries of sessions' older turns

    async def summary(
        self,
        messages: list[Any],
        plan: CompressionPlan,
        request_id: str,
        contract: RequestContract,
        key: str,
        target: Target,
        label: Label,
    ) -> tuple[str, str, int]:
        """(the summary of the planned turns for `target`, who wrote it: model:<alias> | extractive,
        how many of the turns a kept summary covered). `label`: the turn's own (what a new summary keeps)."""
        settings = self._settings
        run = messages[plan.start : plan.end]
        kept = self.kept.find(key, run)
        if kept is not None and carried_refusal(kept.label, contract, target) is not None:
            kept = None  # its turns may not go there: written afresh from what this request carries
        if kept is not None and kept.count == len(run):
            return kept.text, kept.by, kept.count
        alias = settings.summariser or contract.model
        words = settings.summary_tokens * 3 // 4
        told = (
            incremental_transcript(kept, messages, plan, TRANSCRIPT_CHARS)
            if kept
            else transcript(messages, plan, TRANSCRIPT_CHARS)
        )
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
            text = answer_text(reply.body)
            if text:
                text = text[: settings.summary_tokens * CHARS_PER_TOKEN]  # what compressed() keeps of it
                self.kept.keep(key, text, f"model:{alias}", run, kept.label.join(label) if kept else label)
                return text, f"model:{alias}", kept.count if kept else 0
        except Exception as exc:  # noqa: BLE001 -- a summariser that fails leaves the extractive summary
            log.warning("summariser %s did not answer: %s", alias, type(exc).__name__)
        return extractive_summary(messages, plan, settings.summary_tokens), "extractive", 0


def answer_message(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    try:
        message = body["choices"][0]["message"] if body is not None else None
    except (KeyError, IndexError, TypeError):
        return None
    return kept_answer(message) if isinstance(message, Mapping) else None


def answer_text(body: Mapping[str, Any] | None) -> str | None:
    message = answer_message(body)
    return message_text(message) if message is not None else None


def kept_answer(message: Mapping[str, Any]) -> dict[str, Any]:
    """An answer as a session keeps it: its role, content and tool calls."""
    return {k: message[k] for k in ("role", "content", "tool_calls") if message.get(k) is not None}


def message_text(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    return content.strip() if isinstance(content, str) else None
