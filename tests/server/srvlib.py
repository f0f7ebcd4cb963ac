"""What the Python server tests (test_hardening.py, test_spec.py) share: their failure list and
check(), and a `smelt serve` process on an ephemeral port, found from its "listening on" line."""
import os
import re
import subprocess
import sys
import threading
import time

FAILS = []
LISTEN = r"listening on http://[^\s]+:(\d+)"


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr, flush=True)
    return cond


class StartError(RuntimeError):
    """the server exited or never said where it listens; log: what it printed"""

    def __init__(self, log):
        super().__init__("server did not start:\n" + log)
        self.log = log


class Server:
    """`BIN serve --host 127.0.0.1 --port 0 ARGS...`; log_file: the server logs there (--log-file), not to
    stderr, and the port is read from it. Raises StartError (the process stopped) when no port is
    announced within wait_s seconds."""

    def __init__(self, binary, args, env=None, log_file=None, wait_s=30):
        if log_file:
            args = list(args) + ["--log-file", log_file]
        self.p = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", *args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.log, self.port = [], None
        ready = threading.Event()

        def reader():
            for line in iter(self.p.stderr.readline, b""):
                line = line.decode("utf-8", "replace")
                self.log.append(line)
                m = re.search(LISTEN, line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if log_file:
            for _ in range(300):
                m = os.path.exists(log_file) and re.search(LISTEN, open(log_file).read())
                if m or self.p.poll() is not None:
                    self.port = int(m.group(1)) if m else None
                    break
                time.sleep(0.1)
        ready.wait(wait_s)
        if self.port is None:
            self.stop()  # never leave a server behind
            raise StartError("".join(self.log))

    def text(self):
        return "".join(self.log)

    def wait(self, t):
        try:
            return self.p.wait(t)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
