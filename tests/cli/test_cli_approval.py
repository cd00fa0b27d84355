"""`agentloop run` asks on the terminal before a call that requires approval.

The command runs in a subprocess whose stdin, stdout and stderr are a pseudo-terminal
(`os.openpty`); the test reads until the prompt appears, then answers. Without a terminal
the call is refused with a line saying so. The model is `MessagesServer`, over the SDK.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import with_ctrl_c

from agentloop.cli.approve import NOT_ASKED, REFUSED
from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, reply, tool_call

PAYER = """\
from agentloop import hookimpl, tool


@tool(requires_approval=True)
def pay(to: str, amount: int) -> str:
    \"\"\"Pay someone.\"\"\"
    return f"paid {amount} to {to}"


def note(text: str) -> str:
    \"\"\"Take a note.\"\"\"
    return f"noted: {text}"


@hookimpl
def agentloop_register_tools(register):
    register(pay)
    register(note)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the `payer` plugin, installed as pip would lay it out."""
    root = tmp_path_factory.mktemp("site")
    module = "agentloop_cli_test_payer"
    (root / f"{module}.py").write_text(PAYER)
    info = root / f"{module}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: payer\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[agentloop]\npayer = {module}\n")
    return root


def command(server: MessagesServer, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentloop",
        "run",
        "Pay Ada 5",
        "--plugin",
        "payer",
        "--base-url",
        server.base_url,
        "--api-key",
        "sk-ant-test",
        *extra,
    ]


def environment(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, ENV_VAR: "payer", "TERM": "dumb"}


class Terminal:
    """A subprocess on a pseudo-terminal: read what it prints, type answers."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.fd, child = os.openpty()
        self.process = subprocess.Popen(
            args, stdin=child, stdout=child, stderr=child, env=env, preexec_fn=with_ctrl_c
        )
        os.close(child)
        self.seen = b""
        self.read = 0  # where the next read_until starts looking

    def read_until(self, text: str) -> str:
        """What was printed since the last call, up to `text` once it appears.

        Waits at most 30 s for each chunk, a guard against a hang (not a synchronisation).
        """
        while text.encode() not in self.seen[self.read :]:
            ready, _, _ = select.select([self.fd], [], [], 30)
            assert ready, f"no {text!r} in {self.seen.decode(errors='replace')!r}"
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            assert chunk, f"ended without {text!r}: {self.seen.decode(errors='replace')!r}"
            self.seen += chunk
        start = self.read
        self.read = self.seen.index(text.encode(), start) + len(text.encode())
        return self.seen[start : self.read].decode(errors="replace")

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def finish(self) -> tuple[int, str]:
        """Wait for the end; its exit code and everything it printed."""
        while True:
            ready, _, _ = select.select([self.fd], [], [], 30)
            assert ready, "the command did not finish"
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        os.close(self.fd)
        return self.process.wait(timeout=30), self.seen.decode(errors="replace")


def tool_result(server: MessagesServer) -> dict[str, Any]:
    """The tool_result the model got for the first call (its cache breakpoint left out)."""
    result: dict[str, Any] = dict(server.requests[1]["messages"][-1]["content"][0])
    result.pop("cache_control", None)
    return result


def test_yes_runs_the_call(site: Path) -> None:
    call = tool_call("pay", {"to": "Ada", "amount": 5})
    with MessagesServer([reply(call), reply("Paid Ada.")]) as server:
        terminal = Terminal(command(server), environment(site))
        shown = terminal.read_until("Allow? [y]es / [n]o / [e]dit: ")
        assert 'pay wants to run with {"to": "Ada", "amount": 5}' in shown
        assert "(tool 'pay' requires approval)" in shown
        terminal.type("y")
        code, printed = terminal.finish()
    assert code == 0, printed
    assert tool_result(server)["content"] == "paid 5 to Ada"
    assert printed.rstrip().endswith("Paid Ada.")


def test_no_refuses_the_call(site: Path) -> None:
    call = tool_call("pay", {"to": "Ada", "amount": 5})
    with MessagesServer([reply(call), reply("I was not allowed to pay.")]) as server:
        terminal = Terminal(command(server), environment(site))
        terminal.read_until("Allow?")
        terminal.type("n")
        code, printed = terminal.finish()
    assert code == 0, printed
    assert tool_result(server) == {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "content": f"Denied: {REFUSED}",
        "is_error": True,
    }


def test_edit_asks_again_until_the_tool_accepts_the_input(site: Path) -> None:
    call = tool_call("pay", {"to": "Ada", "amount": 5})
    with MessagesServer([reply(call), reply("Paid 3.")]) as server:
        terminal = Terminal(command(server), environment(site))
        terminal.read_until("Allow?")
        terminal.type("maybe")
        terminal.read_until("Answer y, n or e.")
        terminal.type("e")
        terminal.read_until("New input")
        terminal.type('{"to": "Ada", "amount": "lots"}')
        shown = terminal.read_until("New input")
        assert "Invalid input for tool 'pay'" in shown
        assert "amount: Input should be a valid integer" in shown
        terminal.type('{"to": "Ada", "amount": 3}')
        code, printed = terminal.finish()
    assert code == 0, shown + printed
    assert tool_result(server)["content"].endswith("paid 3 to Ada")


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        pytest.param("pay", (), id="the-tool-asks"),
        pytest.param("note", ("--require-approval", "note"), id="the-command-line-asks"),
    ],
)
def test_without_a_terminal_the_call_is_refused_with_a_line(
    site: Path, name: str, extra: tuple[str, ...]
) -> None:
    call = tool_call(name, {"to": "Ada", "amount": 5} if name == "pay" else {"text": "x"})
    with MessagesServer([reply(call), reply("Not allowed.")]) as server:
        done = subprocess.run(
            command(server, *extra),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=environment(site),
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert (
        f"agentloop: refused {name} ({call['id']}): it requires approval and stdin is not a "
        "terminal to ask on\n"
    ) in done.stderr
    assert tool_result(server)["content"] == f"Denied: {NOT_ASKED}"
    assert tool_result(server)["is_error"] is True


def test_require_approval_names_an_exposed_tool(site: Path) -> None:
    with MessagesServer([]) as server:
        done = subprocess.run(
            command(server, "--require-approval", "nope"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=environment(site),
            timeout=60,
        )
    assert done.returncode == 2
    assert (
        done.stderr == "agentloop: error: approval_required names nope, not tools of this agent\n"
    )
    assert server.requests == []


def test_ctrl_c_at_the_prompt_interrupts_the_command(site: Path) -> None:
    call = tool_call("pay", {"to": "Ada", "amount": 5})
    with MessagesServer([reply(call)]) as server:
        terminal = Terminal(command(server), environment(site))
        terminal.read_until("Allow?")
        terminal.process.send_signal(signal.SIGINT)  # Ctrl-C, as a terminal would send it
        code, printed = terminal.finish()
    assert code == 130 and "agentloop: error: interrupted" in printed, printed
    assert len(server.requests) == 1
