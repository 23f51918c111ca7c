"""cloud-sim's request log with `--log-bodies` (bench/cloud_sim/request_log.py): each line also holds
the request body exactly as it arrived, so a test can check what a gateway sent a provider; the records
`GET /control/log` serves never hold it."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.cloud_sim import SimSettings, build_app
from bench.cloud_sim.cli import add_cloud_sim_parser
from bench.cloud_sim.request_log import BODY_BYTES
from bench.cloud_sim.server import CloudSim
from tests.unit.cloud_sim_client import chat, client_for


def _sim(log_path: Path, bodies: bool) -> CloudSim:
    settings = SimSettings(models=("sim-a",), ttft_s=0.0, tokens_per_s=0.0)
    sim: CloudSim = build_app(settings, rng=random.Random(0), log_path=log_path, log_bodies=bodies).state.cloud_sim
    return sim


async def test_with_log_bodies_each_line_holds_the_body_as_it_arrived(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    sent = chat(text="Patient John Smith, SSN 123-45-6789")
    huge = chat(text="y" * (BODY_BYTES + 10))
    async with client_for(_sim(log_path, bodies=True)) as client:
        await client.post("/v1/chat/completions", json=sent)
        await client.post("/v1/chat/completions", json=huge)
        await client.post("/v1/chat/completions", content=b"\xff not json")
        kept = (await client.get("/control/log")).json()["rows"]
    first, second, third = (json.loads(line) for line in log_path.read_text().splitlines())
    assert json.loads(first["body"]) == sent and "body_truncated" not in first
    assert second["body_truncated"] is True and len(second["body"]) == BODY_BYTES
    assert third["body"].endswith(" not json")
    assert all("body" not in row for row in kept)  # memory stays bounded


async def test_without_the_flag_the_turns_stay_out_of_the_log(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    async with client_for(_sim(log_path, bodies=False)) as client:
        await client.post("/v1/chat/completions", json=chat(text="private turn"))
    assert "private turn" not in log_path.read_text() and "body" not in json.loads(log_path.read_text())


def test_the_flag_parses() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_cloud_sim_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["cloud-sim", "--log", "x", "--log-bodies"]).log_bodies is True
    assert parser.parse_args(["cloud-sim"]).log_bodies is False
