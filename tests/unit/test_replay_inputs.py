"""Hostile replay inputs: malformed JSONL lines, over-long lines, huge files, bad policies; and the
`spillover replay` command's exit codes (0 the guards hold, 1 a guard tripped, 2 bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.decision_log_reader import read_decision_log
from router.errors import ConfigError
from spillover.main import main
from tests.unit.replay_world import make_config, record_run, write_yaml
from tests.unit.test_replay import FORBID_SIM


def test_malformed_lines_are_counted_named_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    good = record_run(path)
    junk = [
        "not json",
        "[1, 2]",
        '{"kind": "schema"}',
        '{"kind": "nonsense", "id": "x", "body": 1}',
        '{"request_id": 7, "contract": {}}',
        "",
    ]
    path.write_bytes(("\n".join(junk) + "\n").encode() + b"\xff\xfe{\n" + path.read_bytes())
    log = read_decision_log(path)
    assert len(log.records) == sum(1 for line in good if '"kind"' not in line[:9])
    assert log.malformed == 6
    assert log.examples[0] == "line 1: not JSON (JSONDecodeError)"
    assert log.examples[-1] == "line 7: not JSON (UnicodeDecodeError)"


def test_an_over_long_line_is_skipped_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    record_run(path)
    path.write_bytes(b'{"x": "' + b"a" * 20000 + b'"}\n' + path.read_bytes())
    log = read_decision_log(path, max_line_bytes=8192)
    assert log.malformed == 1 and log.examples == ["line 1: longer than 8192 bytes"]
    assert len(log.records) == 6


def test_a_file_over_the_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of nothing
    with pytest.raises(ConfigError, match="67108864 bytes is more than the limit of 1048576"):
        read_decision_log(path, max_bytes=1024 * 1024)
    with pytest.raises(ConfigError, match="No such file"):
        read_decision_log(tmp_path / "missing.jsonl")


def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_file: Path, *extra: str) -> tuple[int, str]:
    log = tmp_path / "decisions.jsonl"
    if not log.exists():
        record_run(log)
    code = main(["replay", "--policy", str(policy_file), "--decisions", str(log), *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_cli_exit_codes_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = write_yaml(tmp_path / "same.yaml", make_config())
    forbid = write_yaml(tmp_path / "forbid.yaml", make_config(FORBID_SIM))
    code, text = run_cli(tmp_path, capsys, same)
    assert code == 0 and "guards: ok" in text and "6 of 6 recorded requests replayed" in text
    code, text = run_cli(tmp_path, capsys, forbid)
    assert code == 1 and "33.3% of requests change (guard: at most 10%)" in text
    assert "cloud:sim/m -> cloud:sim2/m: 2" in text and "tools-1: cloud:sim/m -> cloud:sim2/m" in text
    code, text = run_cli(tmp_path, capsys, forbid, "--max-changed-pct", "50", "--json")
    assert code == 0
    report = json.loads(text)
    assert report["summary"]["changed"] == 2 and len(report["requests"]) == 6


def test_cli_policy_only_file_uses_the_config_for_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_yaml(tmp_path / "base.yaml", make_config())
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps({"policy": FORBID_SIM}))
    code, text = run_cli(tmp_path, capsys, policy, "--config", str(base))
    assert code == 1 and "cloud:sim/m -> cloud:sim2/m: 2" in text


@pytest.mark.parametrize(
    ("policy_text", "extra", "expected"),
    [
        ("version: [unclosed", (), "not valid YAML"),
        ("policy: {scenarios: {}}", (), "policy.scenarios"),
        ("{models: []}", (), "models"),
        ("policy: {version: x}", ("--max-bytes", "10"), "more than the limit of 10"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str, extra: tuple[str, ...], expected: str
) -> None:
    base = write_yaml(tmp_path / "base.yaml", make_config())
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    code, text = run_cli(tmp_path, capsys, policy, "--config", str(base), *extra)
    assert code == 2 and expected in text and "Traceback" not in text


def test_cli_rejects_bad_guard_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = write_yaml(tmp_path / "same.yaml", make_config())
    for bad in (["--max-changed-pct", "nan"], ["--max-changed-pct", "-1"], ["--max-no-capable", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(tmp_path, capsys, same, *bad)
        assert exit_info.value.code == 2


def test_a_log_of_only_junk_trips_the_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = write_yaml(tmp_path / "same.yaml", make_config())
    (tmp_path / "decisions.jsonl").write_text("junk\n{}\n")
    code, text = run_cli(tmp_path, capsys, same)
    assert code == 1 and "no request could be replayed" in text and "line 1: not JSON" in text


def test_the_committed_example_still_replays_to_its_report(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "docs/examples/replay"
    args = ["replay", "--policy", str(example / "no-cloud-sim.yaml"), "--decisions", str(example / "decisions.jsonl")]
    assert main(args) == 1
    assert capsys.readouterr().out == (example / "report.txt").read_text()
    assert main([*args, "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == json.loads((example / "report.json").read_text())
