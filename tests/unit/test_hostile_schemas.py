"""Hostile JSON Schemas and answers, sent through the real HTTP layer (in-process ASGI) and the
real dispatcher: nothing is fetched, nothing loops, nothing freezes the event loop, no 500.

The local backend is a fake that answers like the engine's chat endpoint (a chat.completion
body whose message content is the text the test chose): the model's answer is exactly what
the output contract then checks.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import router.request.contract as contract_module
from cluster.config.deployment import parse_config
from router.errors import InvalidRequest
from router.output.output_contract import MAX_JSON_CANDIDATES, check_output, extract_json, schema_errors
from router.request.contract import RequestContract, derive_contract
from router.request.json_schema import check_client_schema, schema_validator
from router.request.openai_request import Kind
from router.routing.policy import Policy
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine, completion
from tests.unit.test_dispatch import World

GENEROUS_S = 30.0  # bounded-time checks for hostile input: generous, never a tight timing assertion
L1 = {"x-spillover-level": "L1"}


class Answering(FakeEngine):
    """Answers every chat with `content` (what a model said); `started` is set on each call."""

    def __init__(self, content: str) -> None:
        super().__init__(answer=content)
        self.started = asyncio.Event()

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self.started.set()
        return await super().call(alias, kind, body, request_id)


def _gateway(local: Answering) -> GatewayHTTP:
    config = parse_config(
        {"models": [{"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}]},
        "test",
    )
    world = World()
    dispatcher = Dispatcher(config, local, {}, world.snapshot, clocks=Clocks.of(world.clock, sleep=world.sleep))
    return GatewayHTTP(local, [ServedModel("m", "llama", "cpu", 4096)], dispatcher, created=1)


async def _client(local: Answering) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=_gateway(local).app)
    return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=GENEROUS_S * 2)


def _json_schema_body(schema: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def _tool_body(parameters: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}


@pytest.fixture
async def listener() -> AsyncIterator[tuple[str, list[int]]]:
    """A real HTTP listener on loopback that counts connections: proof that nothing was fetched."""
    hits: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(1)
        body = b'{"type": "string"}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/schema.json", hits


def _assert_invalid_schema(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json_schema"
    assert "Traceback" not in response.text
    return error


# -- no $ref leaves the document -----------------------------------------------------------------------


async def test_remote_ref_in_response_format_is_400(listener: tuple[str, list[int]]) -> None:
    url, hits = listener
    local = Answering('{"a": "x"}')
    async with await _client(local) as client:
        schema = {"type": "object", "properties": {"a": {"$ref": url}}}
        response = await client.post("/v1/chat/completions", json=_json_schema_body(schema))
    error = _assert_invalid_schema(response)
    assert error["param"] == "response_format.json_schema.schema"
    assert "does not resolve inside the schema" in error["message"]
    assert hits == [] and local.calls == []  # nothing fetched, nothing ran


async def test_file_ref_in_tool_parameters_is_400(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"enum": ["the-secret-value"]}')
    local = Answering("{}")
    async with await _client(local) as client:
        response = await client.post("/v1/chat/completions", json=_tool_body({"$ref": secret.as_uri()}))
    error = _assert_invalid_schema(response)
    assert error["param"] == "tools[0].function.parameters"
    assert "the-secret-value" not in response.text and local.calls == []


@pytest.mark.parametrize(
    "ref",
    [
        "other.json",
        "//127.0.0.1:1/x",
        "urn:example:thing",
        "#/$defs/missing",
        "https://json-schema.org/draft/2020-12/schema",
    ],
)
def test_ref_outside_the_document_is_refused(ref: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_client_schema({"$defs": {"a": {"type": "string"}}, "$ref": ref}, "p")
    assert caught.value.code == "invalid_json_schema"


def test_local_refs_and_anchors_are_accepted() -> None:
    schema = {
        "$defs": {"name": {"$anchor": "name", "type": "string"}, "n": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#name"}},
    }
    assert check_client_schema(schema, "p") is schema
    with_id = {"$id": "https://example.com/s", "$defs": {"n": {"type": "integer"}}, "items": {"$ref": "#/$defs/n"}}
    assert check_client_schema(with_id, "p") is with_id


def test_validator_registry_resolves_nothing_outside_the_schema(tmp_path: Path) -> None:
    """The validators themselves refuse outside references too (a safety net behind the check):
    a file the schema names is never read."""
    target = tmp_path / "t.json"
    target.write_text('{"type": "string"}')
    errors = schema_errors(1, {"$ref": target.as_uri()}, "content ")
    assert errors and "refers outside itself" in errors[0]
    with pytest.raises(Exception, match="Unresolvable"):
        list(schema_validator({"$ref": target.as_uri()}, 5.0).iter_errors(1))


LOOP = "#/properties/x/$defs/l"


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        {"anyOf": [{"not": {"$ref": "#"}}]},
        {
            "properties": {
                "x": {"$defs": {"l": {"oneOf": [{"$ref": "#/properties/x/$defs/l"}]}}, "$ref": "#/properties/x/$defs/l"}
            }
        },
    ],
    ids=["self", "a-b-a", "any-not-self", "nested-loop"],
)
async def test_recursive_schema_is_400_not_500(schema: dict[str, Any]) -> None:
    local = Answering('{"x": 1}')
    async with await _client(local) as client:
        response = await client.post("/v1/chat/completions", json=_json_schema_body(schema), headers=L1)
    error = _assert_invalid_schema(response)
    assert "refers to itself" in error["message"] and local.calls == []


async def test_recursion_that_descends_into_the_answer_is_allowed() -> None:
    tree = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name"],
    }
    answer = json.dumps({"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]})
    async with await _client(Answering(answer)) as client:
        response = await client.post("/v1/chat/completions", json=_json_schema_body(tree), headers=L1)
    assert response.status_code == 200, response.text


# -- validation cannot freeze a replica ------------------------------------------------------------------


CATASTROPHIC = "^(a|a)*$"  # exponential backtracking on "aaaa...!"


class HostileOrPlain(Answering):
    """Answers `content` to requests with a response_format, and plain text to the others."""

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        if "response_format" in body:
            return await super().call(alias, kind, body, request_id)
        return BackendReply(body=completion(alias, "fine"))


async def test_catastrophic_pattern_bounded() -> None:
    """A pattern that backtracks exponentially on the answer ends as a clear 502 within a bounded
    time, and the same gateway keeps serving other requests while it is being checked."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": CATASTROPHIC}}}
    backend = HostileOrPlain(json.dumps({"a": "a" * 40 + "!"}))
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    began = time.monotonic()
    async with await _client(backend) as client:
        task = asyncio.create_task(client.post("/v1/chat/completions", json=_json_schema_body(schema), headers=L1))
        await backend.started.wait()
        served = [await client.post("/v1/chat/completions", json=plain) for _ in range(5)]
        served_while_checking = not task.done()
        response = await task
    assert [r.status_code for r in served] == [200] * 5
    assert served_while_checking  # the hostile check did not hold the event loop
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "contract_violation"
    assert any("could not be checked" in e for e in error["errors"]), error
    assert time.monotonic() - began < GENEROUS_S


async def test_catastrophic_pattern_properties_key_bounded() -> None:
    schema = {"type": "object", "patternProperties": {CATASTROPHIC: {}}, "additionalProperties": False}
    began = time.monotonic()
    async with await _client(Answering(json.dumps({"a" * 40 + "!": 1}))) as client:
        response = await client.post("/v1/chat/completions", json=_json_schema_body(schema), headers=L1)
    assert response.status_code == 502 and response.json()["error"]["code"] == "contract_violation"
    assert time.monotonic() - began < GENEROUS_S


async def test_catastrophic_pattern_behind_a_ref_to_a_root_naming_its_dialect_is_bounded() -> None:
    """jsonschema re-picks the validator class for a subschema naming a dialect ($ref "#" to a root
    with $schema): the limits must survive that."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": CATASTROPHIC}, "child": {"$ref": "#"}},
    }
    began = time.monotonic()
    async with await _client(Answering(json.dumps({"child": {"child": {"a": "a" * 40 + "!"}}}))) as client:
        response = await client.post("/v1/chat/completions", json=_json_schema_body(schema), headers=L1)
    assert response.status_code == 502 and response.json()["error"]["code"] == "contract_violation"
    assert time.monotonic() - began < GENEROUS_S


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
async def test_a_large_schema_is_checked_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a client schema against its metaschema costs ~0.4 ms per subschema in jsonschema:
    the gateway does it in a worker thread, so a large one does not stall other requests. The check is
    held until three plain requests were answered: had it run on the event loop, none could be (the hold
    then ends after GENEROUS_S and the assertion fails), whatever the machine's speed."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4_000)}}
    checking, release = threading.Event(), threading.Event()
    real_check = contract_module.check_client_schema

    def held_check(checked: Any, param: str) -> Any:
        if len(checked.get("properties", {})) == 4_000:
            checking.set()
            release.wait(GENEROUS_S)
        return real_check(checked, param)

    monkeypatch.setattr(contract_module, "check_client_schema", held_check)
    backend = HostileOrPlain(json.dumps({"p0": "x"}))
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with await _client(backend) as client:
        task = asyncio.create_task(client.post("/v1/chat/completions", json=_json_schema_body(schema)))
        while not checking.is_set():  # the check has started, in whichever thread it runs
            await asyncio.sleep(0.01)
        served = [await client.post("/v1/chat/completions", json=plain) for _ in range(3)]
        served_while_checking = not task.done()
        release.set()
        response = await task
    assert [r.status_code for r in served] == [200] * 3 and served_while_checking
    assert response.status_code == 200, response.text


def test_dialect_below_the_root_is_400() -> None:
    nested = {"properties": {"a": {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "^a$"}}}
    with pytest.raises(InvalidRequest, match=r"\$schema"):
        check_client_schema(nested, "p")


def test_huge_schema_is_400_before_the_costly_metaschema_check() -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    began = time.monotonic()
    with pytest.raises(InvalidRequest, match="more than"):
        check_client_schema(huge, "p")
    assert time.monotonic() - began < GENEROUS_S


async def test_many_tools_share_one_schema_size_bound() -> None:
    """The bound holds for the request, not per schema: 50 tools of 200 objects each are refused."""
    params = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(199)}}
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": params}} for i in range(50)]
    local = Answering("{}")
    async with await _client(local) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
        response = await client.post("/v1/chat/completions", json=body)
    error = _assert_invalid_schema(response)
    assert "more than" in error["message"] and local.calls == []


def test_pattern_that_does_not_compile_is_400() -> None:
    with pytest.raises(InvalidRequest, match=r"regex|does not compile"):
        check_client_schema({"type": "string", "pattern": "(unclosed"}, "p")


def test_unevaluated_properties_with_pattern_properties_is_400() -> None:
    """jsonschema matches patternProperties with Python's `re` inside unevaluatedProperties, which
    no time limit can stop: the combination is refused up front."""
    with pytest.raises(InvalidRequest, match="unevaluatedProperties"):
        check_client_schema({"patternProperties": {"^x": {}}, "unevaluatedProperties": False}, "p")


def _contract(body: dict[str, Any]) -> RequestContract:
    return derive_contract(body, L1, Policy())


def test_extract_json_linear_in_answer_size() -> None:
    """Openings that never close, or never parse, cost at most MAX_JSON_CANDIDATES linear scans
    (quadratic before: one scan per opening)."""
    n = 200_000
    began = time.monotonic()
    assert extract_json("{" * n) is None
    assert extract_json("[" * n + "x") is None
    assert extract_json("{x}" * n) is None
    assert extract_json("{x}" * (MAX_JSON_CANDIDATES - 1) + '{"a": 1}') == ({"a": 1}, '{"a": 1}')
    assert time.monotonic() - began < GENEROUS_S


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_answer_nested_too_deeply_is_a_violation_not_a_crash(content: str) -> None:
    verdict = check_output(_contract(_json_schema_body({"type": "object"})), {"content": content})
    assert verdict.status == "violated"


def test_unique_items_is_linear() -> None:
    """uniqueItems over thousands of objects (jsonschema compares unsortable items pairwise)."""
    schema = {"type": "array", "uniqueItems": True}
    items = [{"i": i} for i in range(30_000)]
    began = time.monotonic()
    assert check_output(_contract(_json_schema_body(schema)), {"content": json.dumps(items)}).status == "ok"
    dupes = [*items, {"i": 7}]
    verdict = check_output(_contract(_json_schema_body(schema)), {"content": json.dumps(dupes)})
    assert verdict.status == "violated" and "non-unique" in verdict.errors[0]
    assert time.monotonic() - began < GENEROUS_S
    # JSON Schema equality: 1 == 1.0, but true != 1
    assert check_output(_contract(_json_schema_body(schema)), {"content": "[1, 1.0]"}).status == "violated"
    assert check_output(_contract(_json_schema_body(schema)), {"content": "[1, true]"}).status == "ok"


def test_validation_time_bound_gives_a_clear_error() -> None:
    """Past its time bound, one check ends with an error saying so (a fake clock jumps past it)."""
    ticks = iter(range(0, 1000, 10))
    contract = _contract(_json_schema_body({"type": "object", "properties": {"a": {"type": "string"}}}))
    verdict = check_output(contract, {"content": '{"a": "x"}'}, timeout_s=5, clock=lambda: float(next(ticks)))
    assert verdict.status == "violated"
    assert "took longer than" in verdict.errors[0]
