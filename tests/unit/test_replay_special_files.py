"""`spillover replay --decisions` on what is not a plain log: a FIFO fed forever (or never), `/dev/zero`, a
log whose JSON parses into far more than its bytes, and log text that would drive a terminal. Reading
stops at `--max-bytes` (exit 2), never hangs, holds about the log's bytes, and prints no raw control
character. Every test is bounded by a pytest-timeout mark: a hang fails it instead of the suite.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from cluster.decision_log_reader import read_decision_log
from spillover.main import main
from tests.unit.replay_world import make_config, record_run, write_yaml

BOUND_S = 20.0


def _replay(tmp_path: Path, decisions: Path, *extra: str) -> int:
    policy = write_yaml(tmp_path / "same.yaml", make_config())
    return main(["replay", "--policy", str(policy), "--decisions", str(decisions), *extra])


class EndlessWriter(threading.Thread):
    """Writes decision-log-looking lines into a FIFO until the reader goes away (EPIPE)."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo, self.written, self.stopped_by = fifo, 0, ""

    def run(self) -> None:
        line = (json.dumps({"request_id": "r", "contract": {}}) + "\n").encode() * 1000
        try:
            with open(self.fifo, "wb", buffering=0) as out:
                while True:
                    self.written += out.write(line)
        except BrokenPipeError:
            self.stopped_by = "EPIPE"
        except OSError as exc:
            self.stopped_by = errno.errorcode.get(exc.errno or 0, str(exc))


@pytest.mark.timeout(60)
def test_replay_max_bytes_on_fifo_fed_forever(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "decisions.fifo"
    os.mkfifo(fifo)
    writer = EndlessWriter(fifo)
    writer.start()
    started = time.monotonic()
    code = _replay(tmp_path, fifo, "--max-bytes", str(1024 * 1024))
    err = capsys.readouterr().err
    assert code == 2 and "more than the limit of 1048576 bytes (--max-bytes)" in err and "Traceback" not in err
    writer.join(BOUND_S)
    assert writer.stopped_by == "EPIPE"  # the reader closed the pipe at the bound
    assert time.monotonic() - started < BOUND_S


@pytest.mark.timeout(60)
def test_replay_max_bytes_on_fifo_nobody_writes_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Opening a FIFO for reading waits for a writer; the reader does not: no writer is an empty log."""
    fifo = tmp_path / "silent.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert _replay(tmp_path, fifo) == 1  # nothing replayable trips the guard
    assert "no request could be replayed" in capsys.readouterr().out
    assert time.monotonic() - started < BOUND_S


@pytest.mark.timeout(60)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_replay_max_bytes_on_devices_is_refused(
    device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    started = time.monotonic()
    assert _replay(tmp_path, Path(device)) == 2
    err = capsys.readouterr().err
    assert "not a regular file or a pipe" in err and "Traceback" not in err
    assert time.monotonic() - started < BOUND_S


@pytest.mark.timeout(60)
def test_replay_max_bytes_on_a_pipe_of_dev_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--decisions <(cat /dev/zero)`: a pipe of one endless line, stopped at the bound."""
    read_end, write_end = os.pipe()
    feeder = threading.Thread(target=_copy_zeros, args=(write_end,), daemon=True)
    feeder.start()
    started = time.monotonic()
    code = _replay(tmp_path, Path(f"/dev/fd/{read_end}"), "--max-bytes", str(2 * 1024 * 1024))
    os.close(read_end)
    assert code == 2 and "more than the limit of 2097152 bytes" in capsys.readouterr().err
    feeder.join(BOUND_S)
    assert time.monotonic() - started < BOUND_S


def _copy_zeros(fd: int) -> None:
    try:
        while True:
            os.write(fd, bytes(64 * 1024))
    except OSError:
        pass
    finally:
        os.close(fd)


def test_replay_memory_per_log_byte_is_bounded(tmp_path: Path) -> None:
    """Schema blobs of `[{}, {}, ...]` parse into ~20 times their bytes; the reader holds their lines."""
    path = tmp_path / "blobs.jsonl"
    body = ",".join(["{}"] * 200)
    with open(path, "w") as out:
        for i in range(5000):
            out.write(json.dumps({"kind": "schema", "id": f"s{i}", "body": json.loads(f"[{body}]")}) + "\n")
            out.write(json.dumps({"request_id": f"r{i}", "contract": {"json_schema_id": f"s{i}", "x": [{}] * 50}}))
            out.write("\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        log = read_decision_log(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(log.records) == 5000 and len(log.blobs) == 5000
    assert peak < 3 * size  # parsed whole, this log takes about 20 times its size


def test_replay_terminal_escapes_in_log_content_are_neutralised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "decisions.jsonl"
    lines = [json.loads(line) for line in record_run(path)]
    records = [x for x in lines if "kind" not in x]
    hostile = dict(records[0])
    hostile["request_id"] = "evil\x1b]0;owned\x07"
    hostile["attempts"] = [{"target": "cloud:sim/m\x1b[2J\x9b31m\u202e", "outcome": "ok"}]
    hostile["contract"] = {**hostile["contract"], "inputs": {"x-business-scenario": "nope\x1b[31m\r"}}
    path.write_text(path.read_text() + json.dumps(hostile) + "\n")
    policy = write_yaml(tmp_path / "same.yaml", make_config())
    main(["replay", "--policy", str(policy), "--decisions", str(path), "--max-changed-pct", "100"])
    text = capsys.readouterr().out
    assert not any(c in text for c in "\x1b\x07\x9b\r\u202e")
    assert "\\x1b" in text  # shown escaped, not dropped
    main(["replay", "--policy", str(policy), "--decisions", str(path), "--json", "--max-changed-pct", "100"])
    text = capsys.readouterr().out
    assert not any(c in text for c in "\x1b\x07\x9b\r\u202e")
    report = json.loads(text)
    assert len(report["requests"]) == len(records) + 1
