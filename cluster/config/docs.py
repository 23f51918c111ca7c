"""docs/configuration.md, generated from the config's pydantic models.

    python -m cluster.config.docs > docs/configuration.md

One table per section of `SpilloverConfig` (cluster/config/deployment.py, and the models it embeds from
cluster/config/resilience.py, router/routing/watermarks.py, router/routing/policy.py and
router/routing/capabilities.py):
each key's path, its type with the bounds validation enforces, its default and the field's
`description`. A field whose type is a model is a section with its own table: `key` for a nested
or optional model, `key[]` for a list of them, `key.<name>` for a mapping of them. A model that
appears under two paths (`watermarks`, `models[].watermarks`) is tabled once and linked.

The descriptions live on the fields (`Field(description=...)`), so the schema and its documentation
are defined once; `render()` refuses a field without one. tests/unit/test_docs.py fails when the
committed docs/configuration.md differs from `render()`.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from cluster.config.deployment import SpilloverConfig

COMMAND = "python -m cluster.config.docs > docs/configuration.md"
SOURCES = (
    "cluster/config/deployment.py",
    "cluster/config/model_spec.py",
    "cluster/config/perf.py",
    "cluster/config/resilience.py",
    "cluster/config/session.py",
    "router/routing/watermarks.py",
    "router/routing/policy.py",
    "router/routing/capabilities.py",
)
MIB = 1024 * 1024
MAP_KEYS = {"models": "<alias>"}  # what a mapping's keys are, where "<name>" would mislead


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Table:
    path: str  # "" for the top level
    intro: str
    rows: tuple[Row, ...]


def _models_in(annotation: Any, key: str = "<name>") -> list[tuple[str, type[BaseModel]]]:
    """The models a field's type holds, each with the path suffix of its keys ("", "[]", ".<name>")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin is typing.Annotated:
        return _models_in(args[0], key)
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _models_in(arg, key)]
    if origin in (list, tuple):
        return [("[]" + suffix, model) for suffix, model in _models_in(args[0], key)]
    if origin is dict:
        return [(f".{key}" + suffix, model) for suffix, model in _models_in(args[1], key)]
    return []


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "mapping"
    if inspect.isclass(annotation) and origin is None:
        return annotation.__name__
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " / ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin in (list, tuple):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"map of {_type(args[0])} to {_type(args[1])}"
    return str(annotation)


def _bounds(field: FieldInfo) -> list[str]:
    bounds = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            bounds.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            bounds.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen):
            bounds.append(f"at least {item.min_length} long")
        elif isinstance(item, annotated_types.MaxLen):
            bounds.append(f"at most {item.max_length} long")
        elif getattr(item, "pattern", None):
            bounds.append(f"matches `{item.pattern}`")
    return bounds


def _scalar(value: Any) -> str:
    """As it would be written in the YAML file (a string YAML would read as another type is quoted)."""
    if isinstance(value, float) and float(f"{value:g}") == value:
        return f"{value:g}"
    if isinstance(value, str) and value and yaml.safe_load(value) == value:
        return value
    return json.dumps(value, separators=(", ", ": "))


def _default(name: str, field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return "its keys' defaults"
    value = TypeAdapter(field.annotation or Any).dump_python(default, mode="json")
    text = f"`{_scalar(value)}`"
    if name.endswith("_bytes") and isinstance(value, int) and value % MIB == 0:
        text += f" ({value // MIB} MiB)"
    return text


def _anchor(path: str) -> str:
    """GitHub's anchor of the heading of `path`'s table: lower case, only word characters, - and spaces."""
    return re.sub(r"[^\w\- ]", "", path.lower()).replace(" ", "-") if path else "top-level"


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith((".", ")", ":")) else ".")


def _doc(model: type[BaseModel]) -> str:
    """The first paragraph of the model's own docstring."""
    text = model.__dict__.get("__doc__") or ""
    return _sentence(inspect.cleandoc(text).split("\n\n")[0])


def _tables(
    model: type[BaseModel], path: str, intro: str, seen: dict[type[BaseModel], str], missing: list[str]
) -> list[Table]:
    seen[model] = path
    rows: list[Row] = []
    nested: list[tuple[str, type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        description = " ".join((field.description or "").split())
        if not description:
            missing.append(key)
        kind = ", ".join([_type(field.annotation), *_bounds(field)])
        for suffix, inner in _models_in(field.annotation, MAP_KEYS.get(name, "<name>")):
            if inner in seen:
                link = f"[`{seen[inner] or 'top level'}`](#{_anchor(seen[inner])})"
                description = f"{description}; same keys as {link}"
            else:
                nested.append((key + suffix, inner, description))
                kind += f"; keys: [`{key + suffix}`](#{_anchor(key + suffix)})"
                seen[inner] = key + suffix
        rows.append(Row(f"`{key}`", kind, _default(name, field), description))
    tables = [Table(path, " ".join(filter(None, [_sentence(intro), _doc(model)])), tuple(rows))]
    for key, inner, description in nested:
        tables += _tables(inner, key, description, seen, missing)
    return tables


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole of docs/configuration.md; raises ValueError naming any key without a description."""
    missing: list[str] = []
    tables = _tables(SpilloverConfig, "", "", {}, missing)
    if missing:
        raise ValueError("config fields without a description (add Field(description=...)): " + ", ".join(missing))
    sources = ", ".join(f"`{s}`" for s in SOURCES)
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated by `{COMMAND}` from the pydantic models; edit their descriptions, not this file. -->",
        "",
        "One YAML file per deployment (`configs/local.yaml` is the embedded default, `configs/gpu.yaml` a GPU",
        "cluster), validated before anything starts: unknown keys are errors, and an error names the file, the",
        "key's path and the reason. `--overlay PATH` merges a partial file on top (`models[]` entries matched by",
        "`alias`). In a key path `[]` stands for every entry of a list and `<name>` for a key of a mapping.",
        "",
        f"Generated from the models in {sources}: the type column shows the bounds that validation enforces.",
        "",
        *(f"- [`{t.path}`](#{_anchor(t.path)})" if t.path else "- [top level](#top-level)" for t in tables),
    ]
    for table in tables:
        title = f"`{table.path}`" if table.path else "Top level"
        lines += ["", f"## {title}", ""]
        if table.intro:
            lines += [table.intro, ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        lines += [
            f"| {_cell(r.key)} | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.description)} |" for r in table.rows
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
