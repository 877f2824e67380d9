"""`hablar chat` in a pseudo-terminal: two turns that share the history, /clear, a multi-line
message, Ctrl-C stopping a reply (the chat goes on), /system and /exit."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pexpect

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))
PROMPT = r"\n> "


def spawn(*args: str) -> pexpect.spawn:
    assert BIN.exists(), f"hablar binary not built: {BIN}"
    c = pexpect.spawn(str(BIN), ["chat", "--temp", "0", "-c", "1024", "-t", "1", *args], encoding="utf-8",
                      timeout=120)
    c.expect(PROMPT)
    return c


def ask(c: pexpect.spawn, text: str) -> str:
    c.sendline(text)
    c.expect(PROMPT)
    return c.before.split("\n", 1)[1].strip()  # the line after our echoed input


def test_turns_clear_and_multiline():
    c = spawn()
    first = ask(c, "My name is Zorblax. Remember it.")
    assert first
    # The second turn sees the first (history): the model answers with the name.
    recall = ask(c, "What is my name?")
    assert "Zorblax" in recall, recall
    c.sendline("/clear")
    c.expect("conversation cleared")
    c.expect(PROMPT)
    forgot = ask(c, "What is my name?")
    assert "Zorblax" not in forgot, forgot
    # A line ending in \ goes on: both lines are one message.
    c.sendline("What is 2+2?\\")
    c.expect(r"\n\. ")  # the continuation prompt, not a reply
    c.sendline("Answer with a number.")
    c.expect(PROMPT)
    answer = c.before.split("\n", 1)[1].lower()
    assert "4" in answer or "four" in answer, answer
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on():
    c = spawn("--system", "You are a storyteller who writes very long stories.")
    c.sendline("Tell me a very long story about a dragon and a knight.")
    c.expect(r"knight\.\r?\n")  # our line's echo
    c.expect(r"\w+ \w+ \w+")  # the reply has started
    start = time.monotonic()
    c.sendintr()
    c.expect(r"\[stopped\]")
    c.expect(PROMPT)
    assert time.monotonic() - start < 5
    # The chat continues (the stopped reply stays in the history).
    assert ask(c, "What is 2+2?")
    c.sendline("/system Answer in one word.")
    c.expect("system message set")
    c.expect(PROMPT)
    # Ctrl-C at the prompt ends the chat.
    c.sendintr()
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_run_cnv_is_the_chat_with_p_as_system():
    def reply(args):
        c = pexpect.spawn(str(BIN), [*args, "--temp", "0", "-c", "1024", "-n", "16", "-t", "1"],
                          encoding="utf-8", timeout=120)
        c.expect(PROMPT)
        text = ask(c, "What is your name?")
        c.sendeof()
        c.expect(pexpect.EOF)
        c.close()
        assert c.exitstatus == 0
        return text

    system = "You are a pirate called Quibble. Always say arr."
    via_run = reply(["run", "-cnv", "-p", system])
    assert via_run == reply(["chat", "--system", system])
    assert via_run != reply(["chat"])  # the system message made a difference


def test_a_long_conversation_drops_its_oldest_turns():
    """A conversation that outgrows -c loses its oldest turns (the system message stays) and
    the chat goes on; a message that cannot fit even alone is refused and the chat goes on."""
    assert BIN.exists(), f"hablar binary not built: {BIN}"
    c = pexpect.spawn(str(BIN), ["chat", "--temp", "0", "-c", "256", "-n", "24", "-t", "1",
                                 "--system", "You answer in one short sentence."],
                      encoding="utf-8", timeout=120)
    c.expect(PROMPT)
    filler = "Here is a fact about rivers and mountains and valleys and seas. " * 3
    for i in range(4):
        c.sendline(f"{filler} Question {i}: what is {i}+{i}?")
        c.expect(PROMPT)
    assert "oldest turns left the conversation" in c.before, c.before
    answer = ask(c, "What is 3+3?")
    assert answer
    c.sendline("word " * 400)
    c.expect("does not fit the context")
    c.expect(PROMPT)
    assert ask(c, "Hello")
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
