#!/usr/bin/env python3
"""The smelt run REPL driven through a pseudo-terminal (issue 29): the banner, turns that keep the
conversation's KV cache (asserted by the stats line's cached / prefilled counts), Ctrl+C that stops a
reply and returns to the prompt, the context filling up (oldest turns dropped with a notice, or an
error with --context-overflow error), slash commands, multi-line input, history, and the progress
bar of perplexity on a terminal. Built-in model, no network.

usage: test_repl.py SMELT_BIN SOURCE_DIR WORKDIR
"""
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time

BIN, SRC, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ENV = dict(os.environ, SMELT_CACHE_DIR=os.path.join(WORK, "cache"), HF_HUB_CACHE=os.path.join(WORK, "hf"),
           HF_ENDPOINT="http://127.0.0.1:9", HOME=WORK, TERM="xterm", LC_ALL="C.UTF-8")
ENV.pop("SMELT_DEFAULT_MODEL", None)
STATS = re.compile(rb"\[prompt (\d+) tokens: (\d+) cached, (\d+) prefilled .*?generated (\d+) tokens.*?stop: (\w+)")


class Term:
    """a program on a pseudo-terminal: expect(regex) waits for output, send() types"""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.chdir(WORK)
            os.execve(BIN, [BIN] + list(args), ENV)
        self.buf = b""
        self.pos = 0  # expect() searches output after the previous match

    def _read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            return None
        if not data:
            return None
        self.buf += data
        return True

    def expect(self, pattern, timeout=60):
        if isinstance(pattern, re.Pattern):
            rx = pattern
        else:
            rx = re.compile(pattern if isinstance(pattern, bytes) else pattern.encode(), re.S)
        end = time.time() + timeout
        while True:
            m = rx.search(self.buf, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = end - time.time()
            if left <= 0 or self._read(min(left, 0.5)) is None:
                m = rx.search(self.buf, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                tail = self.buf[self.pos:][-1500:].decode(errors="replace")
                check(False, "%s waiting for %r; output after the last match:\n%s"
                      % ("timed out" if left <= 0 else "end of output", pattern, tail))
                return None

    def _alive(self):
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            return pid == 0
        except ChildProcessError:
            return False

    def send(self, s):
        os.write(self.fd, s.encode() if isinstance(s, str) else s)

    def line(self, s):
        self.send(s + "\r")

    def wait(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            self._read(0.2)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        check(False, "the program did not exit")
        return None

    def turn(self, text):
        """send a message; the stats line of its reply -> (prompt, cached, prefilled, generated, stop)"""
        self.line(text)
        m = self.expect(STATS)
        self.expect(r">>> ")
        return (int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5].decode()) if m else None


# 1. turns keep the KV cache; slash commands; multi-line input; history; /exit
t = Term("run", "--temp", "0", "-n", "24")
m = t.expect(r"smelt \S+ \| smelt-tiny \(built-in\): llama.*context 512 tokens \(f16 KV\) \| decode ~\d+ tok/s")
check(m is not None, "banner with model, device, context and speed")
t.expect(r">>> ")
s1 = t.turn("Hello there")
s2 = t.turn("How are you?")
check(s1 and s1[1] == 0 and s1[2] == s1[0], "turn 1 prefills its prompt: %s" % (s1,))
# turn 2 reuses at least the whole first prompt: only the reply's end and the new message are prefilled
check(s1 and s2 and s2[1] >= s1[0] and s2[2] <= s2[0] - s1[0], "turn 2 reuses turn 1's KV: %s then %s" % (s1, s2))
check(s1 and s2 and s2[1] >= s1[0] + s1[3] - 2, "turn 2 reuses the reply's KV too: %s then %s" % (s1, s2))
t.line("/help")
t.expect(r"/regenerate.*/exit")
t.line("/system You answer in one word.")
t.expect(r"\[system prompt set\]")
t.line("/system")
t.expect(r"\[system prompt: You answer in one word\.\]")
s3 = t.turn("What now?")
# a new system prompt changes the prompt's start: nothing but BOS-level tokens can be reused
check(s3 and s3[1] < s1[0], "a changed system prompt is not served from the old KV: %s" % (s3,))
# /regenerate: the same prompt again, all of it but its last token from the cache
s4 = t.turn("/regenerate")
check(s4 and s3 and s4[0] == s3[0] and s4[1] == s4[0] - 1 and s4[2] == 1, "regenerate reuses the prompt: %s" % (s4,))
save = os.path.join(WORK, "conv.json")
t.line("/save " + save)
t.expect(r"\[saved 6 messages")
conv = json.load(open(save))
roles = [m["role"] for m in conv["messages"]]
check(roles == ["system"] + ["user", "assistant"] * 3, "saved roles: %s" % roles)
t.line("/clear")
t.expect(r"\[conversation cleared\]")
t.line("/load " + save)
t.expect(r"\[loaded 6 messages .*with a system prompt\]")
s5 = t.turn("/regenerate")
check(s5 and s4 and s5[0] == s4[0] and s5[1] == s5[0] - 1, "after /load the KV still matches: %s" % (s5,))
t.line("/nosuch")
t.expect(r"unknown command /nosuch")
t.line('"""')
t.line("first line")
t.line('second line"""')
t.expect(STATS)
t.expect(r">>> ")
t.line("line a\\")
t.line("line b")
t.expect(STATS)
t.expect(r">>> ")
t.line("/save " + save)
t.expect(r"\[saved")
users = [m["content"] for m in json.load(open(save))["messages"] if m["role"] == "user"]
check(users[-2:] == ["first line\nsecond line", "line a\nline b"], "multi-line messages: %r" % users[-2:])
t.line("/system")  # history: Up recalls it
t.expect(r"\[system prompt:")
t.send("\x1b[A\r")
t.expect(r"\[system prompt:")
t.line("/exit")
rc = t.wait()
check(rc == 0, "/exit: exit status %s" % rc)
check(os.path.exists(os.path.join(WORK, "cache", "history")), "history saved")

# 2. Ctrl+C stops a reply and returns to the prompt
# the reply's start, from a one-shot run of the same greedy conversation
start = subprocess.run([BIN, "run", "-p", "Tell me a long story", "--temp", "0", "-n", "6", "--no-stats"], env=ENV,
                       cwd=WORK, capture_output=True, stdin=subprocess.DEVNULL, timeout=60).stdout.strip()
check(len(start) >= 8, "the one-shot reply: %r" % start)
t = Term("run", "--temp", "0", "--ignore-eos", "-t", "1")
t.expect(r">>> ")
t.line("Tell me a long story")
t.expect(re.escape(start.replace(b"\n", b"\r\n")))  # the reply has started
t.send("\x03")
t.expect(r"\[interrupted\]")
m = t.expect(STATS)
check(m and m[5] == b"cancelled" and 0 < int(m[4]) < 400, "Ctrl+C stops the reply: %s" % (m and m[0]))
t.expect(r">>> ")
time.sleep(0.5)
t.send("partial input\x03")  # at the prompt: a fresh line, not the end
t.expect(r">>> ")
s = t.turn("/regenerate")
check(s and s[1] == s[0] - 1, "after Ctrl+C the conversation goes on: %s" % (s,))
t.line("/exit")
check(t.wait() == 0, "exit after Ctrl+C")

# 3. the context fills: the reply says so, the oldest turns are dropped with a notice
t = Term("run", "--temp", "0", "-c", "160", "--ignore-eos", "-t", "1")
t.expect(r">>> ")
s = t.turn("Go on")
check(s and s[4] == "context", "a reply up to the context: %s" % (s,))
check(b"[reply stopped: the context (160 tokens) is full" in t.buf, "context stop notice")
s = t.turn("And then?")
check(s is not None and b"[context full: dropped the oldest" in t.buf, "oldest turns dropped with a notice")
time.sleep(0.5)  # libedit prints the prompt before it takes the terminal: a ^D typed between is lost
t.send("\x04")  # Ctrl+D
rc = t.wait()
check(rc == 0, "Ctrl+D: exit status %s" % rc)

# 4. --context-overflow error: the turn is refused, the session goes on
t = Term("run", "--temp", "0", "-c", "160", "--ignore-eos", "--context-overflow", "error")
t.expect(r">>> ")
s = t.turn("Tell me a long story")
check(s and s[4] == "context", "first reply fills the context: %s" % (s,))
t.line("More")
t.expect(r"exceed the context of 160 tokens \(--context-overflow error\)")
t.expect(r">>> ")
t.line("/clear")
t.expect(r"cleared")
s = t.turn("Short")
check(s is not None, "after /clear the conversation goes on")
t.line("/quit")
check(t.wait() == 0, "/quit exits 0")

# 5. a progress bar for long work on a terminal (perplexity)
t = Term("perplexity", "-f", os.path.join(SRC, "tests/golden/heldout.txt"), "-c", "128", "-t", "1")
t.expect(r"perplexity \[[#.]{30}\] \d+/\d+", timeout=120)
t.expect(r"perplexity [\d.]+ over \d+ tokens", timeout=300)
check(t.wait() == 0, "perplexity exit status")

if FAILS:
    print("%d check(s) failed" % len(FAILS))
    sys.exit(1)
print("repl tests passed")
