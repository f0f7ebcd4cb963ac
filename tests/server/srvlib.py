"""What the Python server tests (test_hardening.py, test_spec.py, test_pipeline.py) share: their failure
list and check(), and a `smelt serve` process on an ephemeral port, found from its "listening on" line,
with a JSON POST and a /metrics reading."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

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
    announced within wait_s seconds; with a device other than the CPU that the server could not use,
    exits 77 (ctest's skip) instead."""

    def __init__(self, binary, args, env=None, log_file=None, wait_s=30, device="cpu"):
        try:
            self._start(binary, args, env, log_file, wait_s)
        except StartError as e:
            if device != "cpu" and re.search(r"CUDA|cuda|GPU", e.log):  # the test is skipped (ctest: 77)
                print("no usable %s device: skipped\n%s" % (device, e.log))
                sys.exit(77)
            raise

    def _start(self, binary, args, env, log_file, wait_s):
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

    def post(self, path, body):
        """POST body as JSON; the response's text"""
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.read().decode()

    def metric(self, name):
        """an unlabelled series of /metrics, None when absent"""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=30) as r:
            m = re.search(r"^%s (\S+)$" % re.escape(name), r.read().decode(), re.M)
        return float(m.group(1)) if m else None

    def wait(self, t):
        try:
            return self.p.wait(t)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
