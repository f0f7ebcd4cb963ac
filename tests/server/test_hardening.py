#!/usr/bin/env python3
"""Hostile-client and operator tests of `smelt serve` (issue 33), one section per finding:

  slowloris   slow / idle connections are closed at the header deadline (408), a client address
              cannot take more than --max-conns-per-ip, /health stays fast meanwhile
  bodies      without the API key a large declared body is refused (401) before it is sent; with
              it, bodies beyond --max-buffered-body are refused (503 + Retry-After); RSS bounded
  drain       SIGTERM / SIGINT with live streams: every stream completes or ends with an error
              event and [DONE]; no new connections; exit 0; SIGHUP reopens --log-file
  weights     the weights file truncated or overwritten under load: requests fail with a clear
              error, the server exits 3 (not killed by SIGBUS); with --no-mmap it keeps serving
  framing     duplicate / conflicting Content-Length, Content-Length + chunked -> 400, nothing
              smuggled through
  loaders     config.json (generation_config.json, tokenizer files) as a FIFO or a link to /dev/zero
              -> error in < 1 s

Everything talks to 127.0.0.1 only (slow clients also bind 127.0.0.2 as a second client address
when the system allows it); every loop is bounded in count and time.

usage: test_hardening.py SMELT_BIN MAKE_TEST_MODEL WORKDIR [section ...]
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import srvlib
from srvlib import FAILS, check

BIN, MAKE_MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
ONLY = set(sys.argv[4:])


# ---------------------------------------------------------------- helpers
class Server(srvlib.Server):
    def __init__(self, model, *args, log_file=None):
        """log_file: the server logs there (--log-file), not to stderr"""
        super().__init__(BIN, ["-m", model, *args], log_file=log_file)

    def rss(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def connect(port, src=None, timeout=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if src:
        s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit_s=10):
    """bytes until the peer closes (or limit_s); never raises"""
    out = b""
    end = time.time() + limit_s
    try:
        while time.time() < end:
            s.settimeout(max(0.05, end - time.time()))
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    return out


def parse_response(raw):
    """(status, headers dict, body bytes) of the first response in raw, or None"""
    i = raw.find(b"\r\n\r\n")
    if i < 0 or not raw.startswith(b"HTTP/1."):
        return None
    head = raw[:i].decode("latin1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    rest = raw[i + 4:]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            j = rest.find(b"\r\n")
            if j < 0:
                break
            n = int(rest[:j].split(b";")[0] or b"0", 16)
            if n == 0:
                break
            body += rest[j + 2:j + 2 + n]
            rest = rest[j + 2 + n + 2:]
        return status, headers, body
    n = int(headers.get("content-length", len(rest)))
    return status, headers, rest[:n]


def request(port, method, path, body=None, headers=None, timeout=10):
    h = {"Host": "127.0.0.1", "Connection": "close"}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    raw = ("%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n").encode()
    s = connect(port, timeout=timeout)
    s.sendall(raw + (body or b""))
    out = read_all(s, timeout)
    s.close()
    return parse_response(out)


def sse_events(body):
    """data payloads of an SSE body"""
    return [line[6:] for line in body.decode("utf-8", "replace").split("\n") if line.startswith("data: ")]


def make_model(name):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run([MAKE_MODEL, d], check=True, timeout=60)
    return d


def greedy_prompt(port, n=200):
    """a prompt whose greedy continuation runs n tokens without an end token: a long stream"""
    for p in ["a", "b", "hello", "Once upon", "x", "The", "1", "zz"]:
        r = request(port, "POST", "/v1/completions",
                    json.dumps({"prompt": p, "max_tokens": n, "temperature": 0}).encode())
        if r and r[0] == 200 and json.loads(r[2])["choices"][0]["finish_reason"] == "length":
            return p
    return None


class Stream(threading.Thread):
    """a streaming request on its own connection; .first is set at the first data event"""

    def __init__(self, port, payload, path="/v1/completions"):
        super().__init__(daemon=True)
        self.first = threading.Event()
        self.raw = b""
        body = json.dumps(dict(payload, stream=True)).encode()
        self.s = connect(port, timeout=30)
        self.s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n" % (path, len(body))).encode() + body)
        self.start()

    def run(self):
        end = time.time() + 30
        try:
            while time.time() < end:
                d = self.s.recv(65536)
                if not d:
                    break
                self.raw += d
                if b"data: " in self.raw:
                    self.first.set()
        except OSError:
            pass
        self.first.set()

    def events(self):
        r = parse_response(self.raw)
        return sse_events(r[2]) if r else []


def can_bind(addr):
    try:
        s = socket.socket()
        s.bind((addr, 0))
        s.close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- 1. slowloris
def test_slowloris(model):
    other = "127.0.0.2" if can_bind("127.0.0.2") else None
    per_ip = 30
    srv = Server(model, "--header-timeout", "1", "--max-conns-per-ip", str(per_ip if other else 0),
                 "--max-conns", "200", "--http-threads", "2")
    try:
        # a request whose headers stop coming gets a 408 with a JSON body at the deadline
        t0 = time.time()
        s = connect(srv.port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
        r = parse_response(read_all(s, 5))
        took = time.time() - t0
        s.close()
        check(r is not None and r[0] == 408 and json.loads(r[2])["error"]["code"] == "request_timeout",
              "slowloris: 408 JSON at the header deadline, got %r" % (r,))
        check(0.9 <= took < 2.5, "slowloris: 408 after %.2f s (deadline 1 s)" % took)
        # an idle connection is closed (silently) at the deadline too
        t0 = time.time()
        s = connect(srv.port)
        out = read_all(s, 5)
        took = time.time() - t0
        s.close()
        check(out == b"" and took < 2.5, "slowloris: idle connection closed after %.2f s (%r)" % (took, out[:60]))

        # 45 slow clients from one address, each sending a header line every 0.2 s
        n_slow = 45 if other else 30
        slow = []
        for i in range(n_slow):
            try:
                c = connect(srv.port, src=other, timeout=2)
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                slow.append(c)
            except OSError:
                pass
        stop = threading.Event()
        closed_at = {}

        def drip():
            k = 0
            end = time.time() + 4
            while not stop.is_set() and time.time() < end and len(closed_at) < len(slow):
                for c in slow:
                    if c in closed_at:
                        continue
                    try:
                        c.sendall(b"X-Drip-%d: y\r\n" % k)
                        c.settimeout(0.001)
                        if c.recv(4096) == b"":
                            closed_at[c] = time.time()
                    except socket.timeout:
                        pass
                    except OSError:
                        closed_at[c] = time.time()
                k += 1
                time.sleep(0.2)

        t_start = time.time()
        th = threading.Thread(target=drip, daemon=True)
        th.start()
        # meanwhile, new clients are served quickly
        lat = []
        for i in range(10):
            t0 = time.time()
            r = request(srv.port, "GET", "/health", timeout=5)
            lat.append(time.time() - t0)
            check(r is not None and r[0] == 200, "slowloris: /health answered during the flood (%r)" % (r,))
            time.sleep(0.1)
        check(max(lat) < 1.0, "slowloris: /health latency bounded: max %.3f s" % max(lat))
        if other:
            time.sleep(max(0, t_start + 0.6 - time.time()))
            early = sum(1 for c in slow if c in closed_at and closed_at[c] < t_start + 0.6)
            check(early >= n_slow - per_ip - 2,
                  "slowloris: connections over --max-conns-per-ip refused at once (%d of %d closed early)"
                  % (early, n_slow))
        th.join(6)
        stop.set()
        still = [c for c in slow if c not in closed_at]
        check(not still, "slowloris: %d slow connections still open after 4 s (header deadline 1 s)" % len(still))
        late = [closed_at[c] - t_start for c in slow if c in closed_at]
        check(late and max(late) < 2.5, "slowloris: all closed within 2.5 s (last at %.2f s)" % max(late or [0]))
        for c in slow:
            c.close()
        check(srv.p.poll() is None, "slowloris: server alive")
    finally:
        srv.stop()


# ---------------------------------------------------------------- 2. bodies before the API key
def test_bodies(model):
    mib = 1 << 20
    srv = Server(model, "--api-key", "sekret", "--max-body", str(mib), "--max-buffered-body", str(4 * mib))
    try:
        base = srv.rss()
        head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n" % mib)
        # without the key: 401 after the headers alone
        conns = [connect(srv.port) for _ in range(60)]
        for c in conns:
            c.sendall((head + "\r\n").encode())
        got = 0
        end = time.time() + 3  # all answers within 3 s in total
        for c in conns:
            c.settimeout(max(0.01, end - time.time()))
            try:
                r = parse_response(c.recv(65536))
                if r and r[0] == 401 and json.loads(r[2])["error"]["type"] == "authentication_error":
                    got += 1
            except OSError:
                pass
        check(got == len(conns), "bodies: %d of %d unauthenticated requests got 401 before sending the body"
              % (got, len(conns)))
        for c in conns:
            c.close()
        # bodies sent anyway (all but the last byte, then the clients wait) are not kept
        blob = b"x" * mib
        conns = [connect(srv.port) for _ in range(60)]
        end = time.time() + 10
        for c in conns:
            try:
                c.settimeout(max(0.01, min(2, end - time.time())))
                c.sendall((head + "\r\n").encode() + blob[:-1])
            except OSError:
                pass
        time.sleep(0.5)
        grow = srv.rss() - base
        check(grow < 24 * mib, "bodies: RSS grew by %.1f MiB with 60 x 1 MiB unauthenticated bodies" % (grow / mib))
        for c in conns:
            c.close()
        # with the key: bodies held in memory are capped in total (4 MiB): the rest get 503 at once
        conns = [connect(srv.port) for _ in range(12)]
        codes = []
        for c in conns:
            c.sendall((head + "Authorization: Bearer sekret\r\n\r\n").encode())
            c.sendall(blob[: mib // 2])  # half the body, then stall
        end = time.time() + 2
        for c in conns:
            c.settimeout(max(0.01, end - time.time()))
            try:
                r = parse_response(c.recv(65536))
                codes.append((r[0], r[1].get("retry-after")) if r else None)
            except OSError:
                codes.append(None)
        refused = [x for x in codes if x and x[0] == 503 and x[1]]
        check(len(refused) >= 8, "bodies: over --max-buffered-body -> 503 with Retry-After: %r" % codes)
        grow = srv.rss() - base
        check(grow < 24 * mib, "bodies: RSS grew by %.1f MiB with 12 x 1 MiB stalled bodies" % (grow / mib))
        for c in conns:
            c.close()
        r = request(srv.port, "GET", "/v1/models", headers={"Authorization": "Bearer sekret"})
        check(r is not None and r[0] == 200, "bodies: server still serves (%r)" % (r,))
    finally:
        srv.stop()


# ---------------------------------------------------------------- 3. graceful drain
def test_drain(model):
    log = os.path.join(WORK, "drain.log")
    for f in (log, log + ".1"):
        if os.path.exists(f):
            os.unlink(f)
    srv = Server(model, "-np", "6", "--shutdown-timeout", "1", "-c", "8192", log_file=log)
    try:
        port = srv.port
        check("listening on" in open(log).read() and not srv.text(), "drain: --log-file receives the log")
        # SIGHUP reopens the log (rotation): the renamed file is left alone, a new one starts
        os.rename(log, log + ".1")
        srv.p.send_signal(signal.SIGHUP)
        for _ in range(30):
            if os.path.exists(log):
                break
            time.sleep(0.1)
        check(os.path.exists(log) and "reopened" in open(log).read(), "drain: SIGHUP reopened the log file")
        check(srv.p.poll() is None, "drain: SIGHUP does not stop the server")
        prompt = greedy_prompt(port)
        check(prompt is not None, "drain: found a prompt with a long greedy continuation")
        prompt = prompt or "a"
        long_streams = [Stream(port, {"prompt": prompt, "max_tokens": 6000, "temperature": 0}) for _ in range(3)]
        chat = Stream(port, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 6000, "temperature": 0},
                      path="/v1/chat/completions")
        for s in long_streams + [chat]:
            s.first.wait(10)
        short = [Stream(port, {"prompt": "q", "max_tokens": 3, "temperature": 0}) for _ in range(2)]
        t0 = time.time()
        srv.p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:
            c = connect(port, timeout=1)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            r = parse_response(read_all(c, 2))
            c.close()
            refused = r is None or r[0] == 503
        except OSError:
            refused = True
        check(refused, "drain: no new requests served after SIGTERM")
        rc = srv.wait(8)
        took = time.time() - t0
        check(rc == 0, "drain: exit code %r after SIGTERM (want 0)" % rc)
        check(took < 5, "drain: stopped %.1f s after SIGTERM (--shutdown-timeout 1)" % took)
        for s in long_streams + [chat] + short:
            s.join(5)
        for i, s in enumerate(long_streams + [chat]):
            ev = s.events()
            check(ev and ev[-1] == "[DONE]", "drain: long stream %d ends with [DONE] (%r)" % (i, ev[-2:]))
            errs = [e for e in ev if e.startswith('{"error"')]
            check(len(errs) == 1 and "shutting down" in errs[0], "drain: long stream %d has an error event" % i)
        for i, s in enumerate(short):
            ev = s.events()
            fin = [json.loads(e)["choices"][0]["finish_reason"] for e in ev if e.startswith('{"id"')]
            check(ev and ev[-1] == "[DONE]" and fin and fin[-1] in ("stop", "length"),
                  "drain: short stream %d completed (%r)" % (i, ev[-2:]))
        check("SIGTERM" in open(log).read(), "drain: the log says why it stopped")
    finally:
        srv.stop()
    # SIGINT: the same; a waiting non-streaming request gets a JSON 503
    srv = Server(model, "-np", "1", "--shutdown-timeout", "0.5")
    try:
        prompt = greedy_prompt(srv.port, 100) or "a"
        st = Stream(srv.port, {"prompt": prompt, "max_tokens": 6000, "temperature": 0})
        st.first.wait(10)
        res = {}

        def plain():
            res["r"] = request(srv.port, "POST", "/v1/completions",
                               json.dumps({"prompt": prompt, "max_tokens": 6000, "temperature": 0}).encode())

        th = threading.Thread(target=plain, daemon=True)
        th.start()
        time.sleep(0.3)
        srv.p.send_signal(signal.SIGINT)
        rc = srv.wait(6)
        th.join(5)
        st.join(5)
        check(rc == 0, "drain: exit code %r after SIGINT" % rc)
        ev = st.events()
        check(ev and ev[-1] == "[DONE]" and any(e.startswith('{"error"') for e in ev),
              "drain: SIGINT stream ends with an error event and [DONE] (%r)" % ev[-2:])
        r = res.get("r")
        check(r is not None and r[0] == 503 and json.loads(r[2])["error"]["message"],
              "drain: waiting request answered 503 JSON (%r)" % (r,))
    finally:
        srv.stop()


# ---------------------------------------------------------------- 4. weights changed under load
def test_weights(model):
    def fresh(name):
        d = os.path.join(WORK, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(model, d)
        return d, os.path.join(d, "model.safetensors")

    for how in ("truncate", "overwrite"):
        d, wf = fresh("weights-" + how)
        srv = Server(d, "-np", "4")
        try:
            prompt = greedy_prompt(srv.port, 100) or "a"
            streams = [Stream(srv.port, {"prompt": prompt, "max_tokens": 6000, "temperature": 0}) for _ in range(3)]
            for s in streams:
                s.first.wait(10)
            size = os.path.getsize(wf)
            if how == "truncate":
                os.truncate(wf, size // 3)
            else:  # same size, other bytes, same inode
                with open(wf, "r+b") as f:
                    f.seek(size // 2)
                    f.write(os.urandom(size - size // 2))
            rc = srv.wait(10)
            check(rc == 3, "weights/%s: exit code %r (want 3; -7 would be death by SIGBUS)" % (how, rc))
            check("weights file" in srv.text() and "model.safetensors" in srv.text(),
                  "weights/%s: the log names the file:\n%s" % (how, srv.text()[-600:]))
            for i, s in enumerate(streams):
                s.join(5)
                ev = s.events()
                errs = [e for e in ev if e.startswith('{"error"')]
                check(ev and ev[-1] == "[DONE]" and errs and "weights file" in errs[0],
                      "weights/%s: stream %d ends with the error and [DONE] (%r)" % (how, i, ev[-2:]))
        finally:
            srv.stop()
    # --no-mmap: the weights were copied; the file can change, the server keeps serving
    d, wf = fresh("weights-copy")
    srv = Server(d, "--no-mmap")
    try:
        body = json.dumps({"prompt": "hello", "max_tokens": 16, "temperature": 0}).encode()
        before = request(srv.port, "POST", "/v1/completions", body)
        os.truncate(wf, os.path.getsize(wf) // 3)
        after = request(srv.port, "POST", "/v1/completions", body)
        check(before and after and before[0] == 200 and after[0] == 200 and
              json.loads(before[2])["choices"][0]["text"] == json.loads(after[2])["choices"][0]["text"],
              "weights/--no-mmap: same answer after the file was truncated")
        check(srv.p.poll() is None, "weights/--no-mmap: server alive")
    finally:
        srv.stop()


# ---------------------------------------------------------------- 5. request framing
def test_framing(model):
    srv = Server(model)
    try:
        body = b'{"prompt":"a","max_tokens":1}'
        smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        cases = {
            "two Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                  b"Content-Length: %d\r\n\r\n" % (len(body), len(body) + len(smuggled)) + body + smuggled,
            "equal Content-Length twice": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                          b"Content-Length: %d\r\n\r\n" % (len(body), len(body)) + body + smuggled,
            "Content-Length + chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % (5 + len(smuggled)) + smuggled,
            "chunked + Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                        b"Content-Length: 3\r\n\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n" + smuggled,
            "two Transfer-Encoding": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                     b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\n" + smuggled,
            "Transfer-Encoding not chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                             b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smuggled,
        }
        for name, raw in cases.items():
            s = connect(srv.port)
            s.sendall(raw)
            out = read_all(s, 3)
            s.close()
            r = parse_response(out)
            check(r is not None and r[0] == 400 and json.loads(r[2])["error"]["code"] == "bad_framing",
                  "framing/%s: 400 JSON, got %r" % (name, out[:120]))
            check(out.count(b"HTTP/1.1 ") == 1 and b"smelt_requests_total" not in out,
                  "framing/%s: one response, nothing smuggled (%d responses)" % (name, out.count(b"HTTP/1.1 ")))
        r = request(srv.port, "GET", "/metrics")
        served = re.findall(r'smelt_requests_total\{endpoint="/metrics",status="200"\} (\d+)', r[2].decode())
        check(served == [], "framing: no smuggled /metrics was served (%r)" % served)
        # a well-framed chunked request still works
        raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
               b"\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        s = connect(srv.port)
        s.sendall(raw)
        r = parse_response(read_all(s, 5))
        s.close()
        check(r is not None and r[0] == 200, "framing: chunked request body accepted (%r)" % (r,))
    finally:
        srv.stop()


# ---------------------------------------------------------------- 6. loaders
def test_loaders(model):
    for what in ("fifo", "devzero"):
        for fname in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            d = os.path.join(WORK, "loader-%s-%s" % (what, fname.split(".")[0]))
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(model, d)
            p = os.path.join(d, fname)
            if os.path.exists(p):
                os.unlink(p)
            if what == "fifo":
                os.mkfifo(p)
            else:
                os.symlink("/dev/zero", p)
            # a FIFO with no writer blocks open() and /dev/zero never ends: a loader that opened or
            # read either would still be waiting when the (generous, load-independent) timeout hits
            t0 = time.time()
            try:
                r = subprocess.run([BIN, "serve", "-m", d, "--port", "0"], capture_output=True, timeout=30)
                rc, err = r.returncode, r.stderr.decode()
            except subprocess.TimeoutExpired:
                rc, err = None, "(still loading after 30 s: it blocked on the file)"
            took = time.time() - t0
            check(rc == 1 and "not a regular file" in err and fname in err,
                  "loaders/%s %s: clear error (rc %r): %s" % (what, fname, rc, err.strip()[-200:]))
            # promptly: the tiny model loads in well under a second; 5 s leaves room for a loaded machine
            check(took < 5.0, "loaders/%s %s: failed in %.2f s (< 5 s)" % (what, fname, took))


def main():
    os.makedirs(WORK, exist_ok=True)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    except (ImportError, ValueError, OSError):
        pass
    model = make_model("model")
    tests = [("slowloris", test_slowloris), ("bodies", test_bodies), ("drain", test_drain),
             ("weights", test_weights), ("framing", test_framing), ("loaders", test_loaders)]
    for name, fn in tests:
        if ONLY and name not in ONLY:
            continue
        t0 = time.time()
        n0 = len(FAILS)
        try:
            fn(model)
        except Exception as e:  # a crash in one section is a failure, the others still run
            import traceback
            traceback.print_exc()
            check(False, "%s: %r" % (name, e))
        print("%s %s (%.1f s)" % ("ok  " if len(FAILS) == n0 else "FAIL", name, time.time() - t0), flush=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS), file=sys.stderr)
        return 1
    print("server hardening tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
