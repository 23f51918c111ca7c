"""Trace parsers of `bench replay` (bench/replay/traces.py): each public format, format detection, and hostile
files — missing fields, negative or fractional tokens, unsorted or non-finite times, junk, huge lines — each a
one-line `TraceError` (exit 2) naming the line, in bounded time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay.traces import MAX_LINE_BYTES, ColumnMap, TraceError, read_trace

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def mooncake_lines(*rows: dict[str, object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_mooncake_rows_and_detection(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        mooncake_lines(
            {"timestamp": 3000, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
            {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]},
            {"timestamp": 9000, "input_length": 10, "output_length": 0, "hash_ids": [3]},
            {"timestamp": 12000, "input_length": 20, "output_length": 7},
        ),
    )
    trace = read_trace(path)
    assert trace.format == "mooncake" and trace.block_tokens == 512 and trace.skipped == 1
    assert [r.arrival_s for r in trace.requests] == [0.0, 0.0, 9.0]  # ms -> s, from the first request
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in trace.requests] == [
        (1000, 10, (0, 1)),
        (600, 5, (0, 2)),
        (20, 7, ()),
    ]
    assert [r.line for r in trace.requests] == [1, 2, 4]


def test_the_committed_mooncake_slice_reads_whole() -> None:
    trace = read_trace(REPO / "bench" / "traces" / "mooncake-conversation-10min.jsonl")
    assert trace.format == "mooncake" and len(trace.requests) + trace.skipped == 2263
    assert 590 < trace.duration_s < 600
    assert sum(1 for r in trace.requests if r.hash_ids and r.hash_ids[0] == 0) > 1000  # a shared system prefix


def test_azure_csv(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51,879,15\n"
    )
    trace = read_trace(write(tmp_path, "azure.csv", text))
    assert trace.format == "azure" and trace.block_tokens is None
    assert [round(r.arrival_s, 6) for r in trace.requests] == [0.0, 4.314579, 4.31941]
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [(374, 44), (396, 109), (879, 15)]


def test_burstgpt_csv_skips_failed_rows(tmp_path: Path) -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    trace = read_trace(write(tmp_path, "burst.csv", text))
    assert trace.format == "burstgpt" and trace.skipped == 1
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in trace.requests] == [(0, 472, 18), (113, 417, 276)]


def test_generic_csv_with_a_column_map(tmp_path: Path) -> None:
    text = "ts_ms,prompt,completion,blocks\n1000,50,5,1 2 3\n1500,60,6,1 2 4\n"
    columns = ColumnMap.parse("time=ts_ms,input=prompt,output=completion,blocks=blocks", "ms")
    trace = read_trace(write(tmp_path, "mine.csv", text), "csv", columns)
    assert [(r.arrival_s, r.hash_ids) for r in trace.requests] == [(0.0, (1, 2, 3)), (0.5, (1, 2, 4))]


@pytest.mark.parametrize(
    "text",
    [
        "time=a,input=b",  # no output
        "time=a,input=b,output=c,time=d",  # twice
        "time=a,input=b,output=c,colour=d",  # unknown key
        "time,input=b,output=c",  # no '='
    ],
)
def test_bad_column_maps(text: str) -> None:
    with pytest.raises(TraceError):
        ColumnMap.parse(text)
    with pytest.raises(TraceError, match="--time-unit"):
        ColumnMap.parse("time=a,input=b,output=c", "fortnights")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"input_length": 1, "output_length": 1}], "line 1: missing timestamp"),
        ([{"timestamp": 0, "input_length": -5, "output_length": 1}], "line 1: input tokens must be a whole number"),
        ([{"timestamp": 0, "input_length": 2.5, "output_length": 1}], "line 1: input tokens"),
        ([{"timestamp": 0, "input_length": 1, "output_length": "many"}], "line 1: output tokens must be a number"),
        ([{"timestamp": 0, "input_length": 10**12, "output_length": 1}], "line 1: input tokens must be a whole"),
        ([{"timestamp": True, "input_length": 1, "output_length": 1}], "line 1: timestamp must be a number"),
        ([{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "0 1"}], "hash_ids must be a list"),
        ([{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0.5]}], "hash_ids must be whole"),
        (
            [
                {"timestamp": 5000, "input_length": 1, "output_length": 1},
                {"timestamp": 4000, "input_length": 1, "output_length": 1},
            ],
            "line 2: time 4 s is before the previous request's 5 s",
        ),
        ([{"timestamp": 0, "input_length": 1, "output_length": 0}], "no request to replay"),
    ],
)
def test_hostile_mooncake_rows(tmp_path: Path, rows: list[dict[str, object]], message: str) -> None:
    path = write(tmp_path, "bad.jsonl", mooncake_lines(*rows))
    with pytest.raises(TraceError, match=message) as caught:
        read_trace(path)
    assert caught.value.exit_code == 2 and str(path) in caught.value.message


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "the file is empty"),
        ("junk.jsonl", "{not json\n", "line 1: not a JSON object"),
        ("list.jsonl", "[1, 2]\n", "line 1: not a JSON object"),
        ("nan.jsonl", '{"timestamp": NaN, "input_length": 1, "output_length": 1}\n', "must be finite"),
        ("latin1.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,\xe9,1\n", "not UTF-8"),
        ("short.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n", "line 2: 2 fields"),
        ("when.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "line 2: time 'yesterday'"),
        ("what.csv", "a,b,c\n1,2,3\n", "cannot tell the format"),
        ("huge.jsonl", "{" + " " * (MAX_LINE_BYTES + 5) + "}\n", "longer than"),
    ],
)
def test_hostile_files(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, name, content))


def test_missing_file_and_bad_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nothing.jsonl")
    path = write(tmp_path, "t.csv", "x\n")
    with pytest.raises(TraceError, match="--format must be one of"):
        read_trace(path, "parquet")
    with pytest.raises(TraceError, match="needs --columns"):
        read_trace(path, "csv")
    with pytest.raises(TraceError, match="no column 'ts'"):
        read_trace(path, "csv", ColumnMap.parse("time=ts,input=i,output=o"))
