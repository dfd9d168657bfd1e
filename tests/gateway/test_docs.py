"""docs/gateway.md's examples work as shown: the Python one against the fake model server, the
gateway.toml one through the config reader."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncewire.gateway.config import parse_config
from tests.conftest import _child_env
from tests.gateway.conftest import FakeOpenAI
from tests.support.docs import code_blocks

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def fenced(language: str) -> str:
    (found,) = code_blocks(DOC, language)
    return found


def test_the_model_client_example_runs(
    fake_openai: Callable[[Any], FakeOpenAI], tmp_path: Path
) -> None:
    fake = fake_openai(
        [
            {
                "kind": "tool_call",
                "text": "Let me look.",
                "name": "calendar",
                "args": {"day": "today"},
            }
        ]
    )
    code = fenced("python").replace("https://api.openai.com/v1", fake.base_url)

    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_child_env(OPENAI_API_KEY="sk-test"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "Let me look.tool_calls [('calendar', '{\"day\": \"today\"}')]\n"
    (request,) = fake.requests()
    assert request["authorization"] == "Bearer sk-test"
    assert request["body"]["tools"][0]["function"]["name"] == "calendar"


def test_the_configuration_example_reads() -> None:
    config = parse_config(fenced("toml"), Path("gateway.toml"))

    assert [p.kind for p in config.platforms] == ["telegram", "discord", "webhook"]
    assert [t.name for t in config.tools] == ["create_ticket"]


def test_the_replies_guide_says_what_the_discord_adapter_does() -> None:
    """docs/replies.md said Discord has no idempotency key; the adapter sends a nonce with
    enforce_nonce on every create (tests/gateway/test_discord_wire.py checks the wire), and its
    profile tells the engine for how long a repeat is dropped."""
    from oncewire.gateway.platforms.discord import DISCORD, NONCE_WINDOW_SECONDS
    from oncewire.replies import DISCORD_LIKE

    guide = (DOC.parent / "replies.md").read_text(encoding="utf-8")
    opening = " ".join(guide.split("## Inbound messages")[0].split())
    assert "Discord have no idempotency" not in opening
    assert "`nonce` with `enforce_nonce: true`" in opening
    assert DISCORD.idempotent_send_window_seconds == NONCE_WINDOW_SECONDS
    assert f"{NONCE_WINDOW_SECONDS:g} s for oncewire's Discord adapter" in " ".join(guide.split())
    assert DISCORD_LIKE.idempotent_send_window_seconds == 0  # "0 by default ... DISCORD_LIKE"
