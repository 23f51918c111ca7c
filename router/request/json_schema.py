"""Client-supplied JSON Schemas: checked before anything runs, validated without reaching out.

A schema in `response_format.json_schema.schema` or `tools[].function.parameters` is the
client's text, so it is treated as hostile:

    check_client_schema(schema, param)   400 `invalid_json_schema` (InvalidRequest) unless
      - it is valid against its dialect's metaschema;
      - every `$ref` / `$dynamicRef` / `$recursiveRef` resolves INSIDE the document: a remote
        (`https://...`), file (`file:///...`) or any other outside reference is refused, and
        nothing is ever fetched (the registry's retrieve function refuses every URI);
      - no chain of references loops without consuming the instance (`{"$ref": "#"}`, or
        a → b → a through `$ref` / allOf / anyOf / oneOf / not / if / then / else /
        dependentSchemas): validation would never end. Recursion that descends into the instance
        (a tree: `items: {"$ref": "#"}`) is fine;
      - every `pattern` and `patternProperties` key compiles;
      - it holds at most `MAX_SCHEMA_OBJECTS` objects, and names its dialect (`$schema`) only at
        the root;
      - `unevaluatedProperties` is not combined with `patternProperties` (jsonschema matches those
        with Python's `re`, which cannot be bounded in time).

    schema_validator(schema, timeout_s)  a jsonschema validator for model output whose registry
      resolves nothing outside the schema, whose `pattern` / `patternProperties` /
      `additionalProperties` match with the `regex` engine under the remaining time (a
      catastrophic pattern such as `^(a|a)*$` times out, it does not freeze the process), whose
      `uniqueItems` is linear, and whose every keyword checks the deadline: validation raises
      `ValidationTimeout` once `timeout_s` is spent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import referencing.jsonschema
import regex
from jsonschema import ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import extend, validator_for
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

from router.error_codes import ErrorCode
from router.errors import InvalidRequest

Clock = Callable[[], float]
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose subschemas apply to the SAME instance: a reference cycle through only these never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas", "dependencies")
MAX_MESSAGE_CHARS = 500
# jsonschema checks a schema against its metaschema at ~0.4 ms per subschema: a bound on the
# size keeps that check of one request near 2 s at worst (OpenAI allows 5000 properties).
MAX_SCHEMA_OBJECTS = 5000


class ValidationTimeout(TimeoutError):
    """Validating one answer took longer than its time bound (a costly schema or pattern)."""


def _refuse(uri: str) -> Resource[Any]:
    """The registry's retrieve function: nothing outside the document is ever fetched."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs field; referencing's documented call


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param} {message}"[:MAX_MESSAGE_CHARS], param=param, code=ErrorCode.INVALID_JSON_SCHEMA)


def _specification(schema: Mapping[str, Any]) -> Any:
    dialect = schema.get("$schema")
    default = referencing.jsonschema.DRAFT202012
    if not isinstance(dialect, str):
        return default
    return referencing.jsonschema.specification_with(dialect, default=default)


def _in_place_children(node: Mapping[str, Any]) -> Iterator[Any]:
    for key in _IN_PLACE_ONE:
        if key in node:
            yield node[key]
    for key in _IN_PLACE_MANY:
        if isinstance(node.get(key), list):
            yield from node[key]
    for key in _IN_PLACE_MAP:
        if isinstance(node.get(key), dict):
            yield from node[key].values()


def _check_pattern(param: str, pattern: Any) -> None:
    if not isinstance(pattern, str):
        return  # the metaschema check names it
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise _bad(param, f"holds a pattern that does not compile: {pattern[:80]!r}: {exc}") from None


def _check_node(param: str, node: Mapping[str, Any], has_pattern_properties: list[bool]) -> None:
    if "pattern" in node:
        _check_pattern(param, node["pattern"])
    if isinstance(node.get("patternProperties"), dict):
        has_pattern_properties[0] = True
        for key in node["patternProperties"]:
            _check_pattern(param, key)


def _find_cycle(edges: Mapping[int, list[int]]) -> bool:
    """Whether the in-place graph has a cycle (iterative three-colour DFS)."""
    colour: dict[int, int] = {}  # 1 on the current path, 2 done
    for start in edges:
        if colour.get(start):
            continue
        stack: list[tuple[int, Iterator[int]]] = [(start, iter(edges.get(start, ())))]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
            elif colour.get(child) == 1:
                return True
            elif not colour.get(child):
                colour[child] = 1
                stack.append((child, iter(edges.get(child, ()))))
    return False


def _walk(param: str, schema: Mapping[str, Any]) -> None:
    """Every subschema once: references resolved inside the document only, patterns compiled,
    and the graph of same-instance edges collected for the cycle check."""
    spec = _specification(schema)
    root = spec.create_resource(schema)
    todo: list[tuple[Any, Any]] = [(schema, Registry(retrieve=_refuse).resolver_with_root(root))]  # type: ignore[call-arg]
    seen: set[int] = set()
    edges: dict[int, list[int]] = {}
    keep: list[Any] = []  # keeps every visited node alive, so ids stay unique
    pattern_properties = [False]
    unevaluated = False
    while todo:
        node, resolver = todo.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        if "$schema" in node and node is not schema:
            # jsonschema would switch to the plain validator of that dialect inside it, dropping
            # the time limits of schema_validator
            raise _bad(param, "may name its dialect ($schema) only at the root")
        _check_node(param, node, pattern_properties)
        unevaluated = unevaluated or "unevaluatedProperties" in node
        out = edges.setdefault(id(node), [])
        out += [id(child) for child in _in_place_children(node) if isinstance(child, dict)]
        for key in REF_KEYWORDS:
            ref = node.get(key)
            if key not in node:
                continue
            if not isinstance(ref, str):
                raise _bad(param, f"has a {key} that is not a string")
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable:
                raise _bad(
                    param,
                    f"has {key} {ref[:120]!r}, which does not resolve inside the schema "
                    "(references outside the document are not fetched: inline the definition under $defs)",
                ) from None
            if isinstance(resolved.contents, dict):
                out.append(id(resolved.contents))
                todo.append((resolved.contents, resolved.resolver))
        resource = spec.create_resource(node)
        for sub in resource.subresources():
            todo.append((sub.contents, resolver.in_subresource(sub)))
    if pattern_properties[0] and unevaluated:
        raise _bad(param, "combines unevaluatedProperties with patternProperties, which is not supported")
    if _find_cycle(edges):
        raise _bad(
            param,
            "refers to itself without descending into the instance (a $ref cycle through "
            "$ref/allOf/anyOf/oneOf/not/if/then/else): validation would never end",
        )


def count_objects(value: Any, limit: int) -> int:
    """How many JSON objects `value` holds, counting stops past `limit` (iterative)."""
    count, todo = 0, [value]
    while todo and count <= limit:
        item = todo.pop()
        if isinstance(item, dict):
            count += 1
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count


def check_client_schema(schema: Any, param: str) -> dict[str, Any]:
    """The schema itself, or 400 `invalid_json_schema` naming what is wrong with it."""
    if not isinstance(schema, dict):
        raise _bad(param, "must be a JSON Schema object")
    if count_objects(schema, MAX_SCHEMA_OBJECTS) > MAX_SCHEMA_OBJECTS:
        raise _bad(param, f"holds more than {MAX_SCHEMA_OBJECTS} objects: send a smaller schema")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise _bad(param, f"is not a valid JSON Schema: {exc.message} (at {where})") from None
    except RecursionError:
        raise _bad(param, "is nested too deeply") from None
    try:
        _walk(param, schema)
    except RecursionError:
        raise _bad(param, "is nested too deeply") from None
    return schema


# -- validation of model output --------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    """JSON Schema equality as a hashable key: 1 == 1.0, true != 1, key order ignored."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", float(value) if isinstance(value, float) and not value.is_integer() else int(value))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("other", json.dumps(value, sort_keys=True, default=str))


class _Deadline:
    def __init__(self, timeout_s: float, clock: Clock) -> None:
        self._clock = clock
        self._timeout_s = timeout_s
        self._at = clock() + timeout_s

    def check(self) -> None:
        if self._clock() > self._at:
            raise ValidationTimeout(f"output validation took longer than {self._timeout_s:g}s")

    def search(self, pattern: str, text: str) -> bool:
        remaining = self._at - self._clock()
        if remaining <= 0:
            self.check()
        try:
            return regex.search(pattern, text, timeout=max(remaining, 0.001), concurrent=True) is not None
        except TimeoutError:
            raise ValidationTimeout(
                f"pattern {pattern[:80]!r} did not finish within {self._timeout_s:g}s on the answer "
                "(catastrophic backtracking): simplify the pattern"
            ) from None


def _keywords(deadline: _Deadline) -> dict[str, Callable[..., Any]]:
    """The regex-matching keywords and uniqueItems, bounded by `deadline`."""

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and not deadline.search(patrn, instance):
            yield ValidationError(f"{instance[:80]!r} does not match {patrn[:80]!r}")

    def pattern_properties(validator: Any, value: Mapping[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in value.items():
            for key, item in instance.items():
                if deadline.search(patrn, key):
                    yield from validator.descend(item, subschema, path=key, schema_path=patrn)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        properties = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        extras = [k for k in instance if k not in properties and not any(deadline.search(p, k) for p in patterns)]
        if validator.is_type(ap, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], ap, path=extra)
        elif not ap and extras:  # jsonschema's own wording
            names = ", ".join(repr(e) for e in sorted(extras)[:10])
            if patterns:
                verb = "does" if len(extras) == 1 else "do"
                regexes = ", ".join(repr(p) for p in sorted(patterns))
                yield ValidationError(f"{names} {verb} not match any of the regexes: {regexes}")
            else:
                verb = "was" if len(extras) == 1 else "were"
                yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not (unique and validator.is_type(instance, "array")):
            return
        seen: set[Any] = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"{json.dumps(instance)[:80]} has non-unique elements")
                return
            seen.add(key)

    return {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
        "uniqueItems": unique_items,
    }


def _timed(deadline: _Deadline, keyword: Callable[..., Any]) -> Callable[..., Any]:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        deadline.check()
        return keyword(validator, value, instance, schema)

    return run


def schema_validator(schema: Mapping[str, Any], timeout_s: float, clock: Clock = time.monotonic) -> Validator:
    """A validator of model output against a client schema (see the module docstring).

    The root's `$schema` picks the dialect and is then left out of the schema validated against:
    jsonschema re-picks a validator class for every subschema that names a dialect (a `$ref` to
    the root included), which would be the plain class, without the limits set here."""
    base = validator_for(schema)
    deadline = _Deadline(timeout_s, clock)
    keywords = {**base.VALIDATORS, **_keywords(deadline)}
    cls = extend(base, validators={name: _timed(deadline, fn) for name, fn in keywords.items()})
    bare = {key: value for key, value in schema.items() if key != "$schema"}
    return cls(bare, registry=Registry(retrieve=_refuse))  # type: ignore[call-arg]  # attrs alias of _retrieve
