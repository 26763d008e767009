"""Arming a guard that stops the box asks the person through MCP elicitation when the client can ask.

The guard runs locally here (no host); its stop command is a fake ``runpodctl`` that records calls.
"""

from __future__ import annotations

import pytest
from mcp import Client, types

from remote_gpu_trainer.idle import guard

from .conftest import call_error, call_ok
from .test_idle import box  # noqa: F401  (the same fake RunPod box: ledger, guard dir, recording runpodctl)


def answering(action: str, questions: list[str]):
    async def callback(context, params: types.ElicitRequestParams):
        questions.append(params.message)
        return types.ElicitResult(action=action, content={"confirm": action == "accept"})

    return callback


ARM = {"action": "stop", "idle_minutes": 60, "interval_s": 5}


@pytest.mark.anyio
async def test_arming_stop_asks_the_person_and_a_no_arms_nothing(box, server):  # noqa: F811
    questions: list[str] = []  # the session (legacy) mode Claude Code and Gemini CLI use can ask back
    async with Client(server, mode="legacy", elicitation_callback=answering("decline", questions)) as client:
        dry = await call_ok(client, "idle_guard", ARM)
        refused = await call_error(client, "idle_guard", {**ARM, "dry_run": False,
                                                          "confirm_token": dry["confirm_token"]})
    assert questions and "STOPS this box" in questions[0]
    assert "did not agree" in refused and guard.status(box / "guard") is None


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_yes_arms_the_guard(box, server, mode):  # noqa: F811
    questions: list[str] = []
    async with Client(server, mode=mode, elicitation_callback=answering("accept", questions)) as client:
        dry = await call_ok(client, "idle_guard", ARM)
        armed = await call_ok(client, "idle_guard", {**ARM, "dry_run": False, "confirm_token": dry["confirm_token"]})
    assert armed["armed"] and armed["mode"] == "armed"
    # a stateless request (auto mode) has no channel to ask back on: the token alone arms it
    assert bool(questions) is (mode == "legacy")
