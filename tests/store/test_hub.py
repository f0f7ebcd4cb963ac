#!/usr/bin/env python3
"""End-to-end tests of `smelt pull/list/rm/inspect/arch` (through the store_cli test driver)
against a local fake Hugging Face hub (python stdlib, 127.0.0.1, free port; never the internet).

The fake hub implements what smelt uses of the real one:
  GET /api/models/{owner}/{name}/revision/main?blobs=true
      -> {"id", "sha", "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}
  GET /{owner}/{name}/resolve/{rev}/{file}   (Range: bytes=N- -> 206)
Repos: normal, one that cuts the connection mid-file, one with a wrong sha256,
a private one (401 without the right Bearer token), and 404 for anything else.
Expected values (file contents, sha256, sizes, KV bytes) are computed here independently.

usage: test_hub.py /path/to/store_cli
"""
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLI = sys.argv[1]
FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


# ---------------------------------------------------------------- fixture model
def safetensors(tensors):
    """tensors: list of (name, dtype, shape, bytes) -> safetensors file bytes"""
    hdr, off, blobs = {}, 0, []
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


rng = random.Random(1234)


def rbytes(n):
    return bytes(rng.getrandbits(8) for _ in range(n))


# 4-bit MLX-style: hidden 512, vocab 1024 -> packed [1024, 512*4/32 = 64] u32, scales/biases [1024, 512/64 = 8]
HIDDEN, VOCAB, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 512, 1024, 3, 8, 2, 64
CONFIG = {
    "model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": 1024, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "quantization": {"group_size": 64, "bits": 4},
}
TENSORS = [
    ("model.embed_tokens.weight", "U32", [VOCAB, HIDDEN * 4 // 32], rbytes(VOCAB * HIDDEN * 4 // 32 * 4)),
    ("model.embed_tokens.scales", "BF16", [VOCAB, HIDDEN // 64], rbytes(VOCAB * HIDDEN // 64 * 2)),
    ("model.embed_tokens.biases", "BF16", [VOCAB, HIDDEN // 64], rbytes(VOCAB * HIDDEN // 64 * 2)),
    ("model.norm.weight", "BF16", [HIDDEN], rbytes(HIDDEN * 2)),
]
WEIGHT_BYTES = sum(len(t[3]) for t in TENSORS)
N_PARAMS = VOCAB * HIDDEN + HIDDEN  # packed u32 -> 32/4 params each; scales/biases are not parameters
MODEL_FILES = {
    "config.json": json.dumps(CONFIG).encode(),
    "model.safetensors": safetensors(TENSORS),
    "tokenizer.json": b'{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]}}',
    "tokenizer_config.json": b'{"bos_token":null}',
    "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
    "merges.txt": b"#version: 0.2\n",
    "special_tokens_map.json": b"{}",
    # not needed by smelt: must not be downloaded
    "README.md": b"# model card\n",
    "pytorch_model.bin": b"\0" * 1000,
    "model.gguf": b"GGUF" + b"\0" * 100,
    ".gitattributes": b"*.safetensors filter=lfs\n",
    "original/params.json": b"{}",
}
WANTED = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
          "merges.txt", "special_tokens_map.json"}
LFS = {"model.safetensors"}
TOKEN = "hf_secret_token"


class Repo:
    def __init__(self, files, private=False, cut_first=None, bad_sha=False, sha=None, oversize=None, redirect=None):
        self.files, self.private, self.cut_first, self.bad_sha = files, private, set(cut_first or []), bad_sha
        self.sha = sha or hashlib.sha1(repr(sorted(files)).encode() + os.urandom(4)).hexdigest()
        # hostile hubs: {file: bytes actually sent} beyond the listed size; {file: Location}
        self.oversize, self.redirect = oversize or {}, redirect or {}


REPOS = {
    "acme/tiny": Repo(MODEL_FILES),
    "acme/cut": Repo(MODEL_FILES, cut_first=["model.safetensors"]),
    "acme/cut2": Repo(MODEL_FILES, cut_first=["model.safetensors"]),
    "acme/badsha": Repo(MODEL_FILES, bad_sha=True),
    "acme/private": Repo(MODEL_FILES, private=True),
    "mlx-community/bare": Repo(MODEL_FILES),
    "acme/ggufonly": Repo({"config.json": b"{}", "model.gguf": b"GGUF"}),
    # hostile: lists config.json at its real size, then sends 50 MB
    "acme/liar": Repo(MODEL_FILES, oversize={"config.json": 50 << 20}),
    # hostile: a revision that would change the URL
    "acme/badrev": Repo(MODEL_FILES, sha="x?y=/../../config.json"),
    # hostile: sends the download to plain http
    "acme/redirect": Repo(MODEL_FILES, redirect={"config.json": "/redirected/config.json"}),
}
RAW_PATHS = []  # every request path as sent, query included
LOG = []  # (path, range header, auth header, bytes sent)
LOCK = threading.Lock()


class Hub(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with LOCK:
            RAW_PATHS.append(self.path)
        path = self.path.split("?")[0]
        rng_h = self.headers.get("Range")
        auth = self.headers.get("Authorization")
        entry = [path, rng_h, auth, 0]
        with LOCK:
            LOG.append(entry)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            repo_id = parts[2] + "/" + parts[3]
            repo = REPOS.get(repo_id)
            if repo is None:
                return self.send_json(404, {"error": "Repository not found"})
            if repo.private and auth != "Bearer " + TOKEN:
                return self.send_json(401, {"error": "Invalid username or password."})
            sib = []
            for name, data in repo.files.items():
                s = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                if name in LFS or name.endswith(".gguf") or name.endswith(".bin"):
                    sha = hashlib.sha256(data).hexdigest()
                    if repo.bad_sha:
                        sha = hashlib.sha256(data + b"x").hexdigest()
                    s["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
                sib.append(s)
            return self.send_json(200, {"id": repo_id, "sha": repo.sha, "siblings": sib})
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = parts[0] + "/" + parts[1]
            repo = REPOS.get(repo_id)
            fname = "/".join(parts[4:])
            if repo is None or fname not in repo.files or parts[3] not in ("main", repo.sha):
                return self.send_json(404, {"error": "Entry not found"})
            if repo.private and auth != "Bearer " + TOKEN:
                return self.send_json(401, {"error": "Invalid credentials"})
            if fname in repo.redirect:
                self.send_response(302)
                self.send_header("Location", "http://%s:%d%s" % (self.server.server_address + (repo.redirect[fname],)))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if fname in repo.oversize:  # far more than listed, until the client hangs up
                total = repo.oversize[fname]
                self.send_response(200)
                self.send_header("Content-Length", str(total))
                self.end_headers()
                chunk = b"{" * 65536
                try:
                    while entry[3] < total:
                        self.wfile.write(chunk)
                        entry[3] += len(chunk)
                except OSError:
                    pass
                self.close_connection = True
                return
            data = repo.files[fname]
            start = 0
            if rng_h and rng_h.startswith("bytes="):
                start = int(rng_h[6:].split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with LOCK:
                cut = fname in repo.cut_first
                repo.cut_first.discard(fname)
            if cut:  # send 40% of the file, then drop the connection
                n = len(body) * 2 // 5
                self.wfile.write(body[:n])
                self.wfile.flush()
                entry[3] = n
                self.close_connection = True
                try:
                    import socket
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            self.wfile.write(body)
            entry[3] = len(body)
            return
        self.send_json(404, {"error": "not found"})


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    tmp = tempfile.mkdtemp(prefix="smelt-hub-test-")
    cache = os.path.join(tmp, "cache")
    store = os.path.join(cache, "models")
    env = dict(os.environ)
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "SMELT_DEFAULT_ORG", "SMELT_PULL_RETRIES",
              "SMELT_AVAILABLE_MEMORY"):
        env.pop(k, None)
    env.update({"HOME": tmp, "HF_HOME": os.path.join(tmp, "hf"), "SMELT_CACHE_DIR": cache,
                "HF_ENDPOINT": "http://127.0.0.1:%d/" % port})

    def run(*args, **extra):
        e = dict(env)
        e.update(extra)
        p = subprocess.run([CLI] + list(args), env=e, capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def files_under(d):
        out = []
        for root, _, fs in os.walk(d):
            out += [os.path.relpath(os.path.join(root, f), d) for f in fs]
        return sorted(out)

    def downloads(repo, fname):
        return [e for e in LOG if e[0] == "/%s/resolve/%s/%s" % (repo, REPOS[repo].sha, fname)]

    def check_model(repo):
        d = os.path.join(store, repo)
        check(sorted(f for f in files_under(d) if f != ".smelt-pull.json") == sorted(WANTED),
              "%s: files %s" % (repo, files_under(d)))
        for f in WANTED:
            p = os.path.join(d, f)
            check(os.path.exists(p) and open(p, "rb").read() == MODEL_FILES[f], "%s: content of %s" % (repo, f))

    # 1. normal pull
    rc, out, err = run("pull", "acme/tiny")
    check(rc == 0, "pull acme/tiny rc=%d err=%s" % (rc, err))
    check(out.strip() == os.path.join(store, "acme/tiny"), "pull prints the model dir: %r" % out)
    check_model("acme/tiny")
    requested = {e[0].rsplit("/", 1)[-1] for e in LOG if "/resolve/" in e[0]}
    check(requested == WANTED, "only needed files downloaded: %s" % sorted(requested))
    check(not os.path.exists(os.path.join(store, ".tmp")), "no temp dir left after a pull")
    meta = json.load(open(os.path.join(store, "acme/tiny/.smelt-pull.json")))
    check(meta.get("revision") == REPOS["acme/tiny"].sha, "provenance revision")
    check(all(e[2] is None for e in LOG), "no Authorization header without a token")
    # pulling again: up to date, nothing downloaded
    n0 = len([e for e in LOG if "/resolve/" in e[0]])
    rc, out, err = run("pull", "acme/tiny")
    check(rc == 0 and len([e for e in LOG if "/resolve/" in e[0]]) == n0, "re-pull is a no-op: %s" % err)

    # a new revision on the hub replaces the stored copy atomically
    old_sha = REPOS["acme/tiny"].sha
    REPOS["acme/tiny"].sha = hashlib.sha1(b"rev2").hexdigest()
    REPOS["acme/tiny"].files = dict(MODEL_FILES, **{"merges.txt": b"#version: 0.3\n"})
    rc, out, err = run("pull", "acme/tiny")
    check(rc == 0, "pull of a new revision: %s" % err)
    d = os.path.join(store, "acme/tiny")
    check(open(os.path.join(d, "merges.txt"), "rb").read() == b"#version: 0.3\n", "new revision content")
    check(json.load(open(os.path.join(d, ".smelt-pull.json")))["revision"] == REPOS["acme/tiny"].sha,
          "new revision recorded")
    check(not os.path.exists(os.path.join(store, ".tmp")), "no temp dir left after an update")
    REPOS["acme/tiny"].files = MODEL_FILES
    REPOS["acme/tiny"].sha = old_sha
    rc, out, err = run("pull", "-q", "acme/tiny")
    check(rc == 0 and open(os.path.join(d, "merges.txt"), "rb").read() == MODEL_FILES["merges.txt"], "back to rev 1")

    # bare name -> mlx-community/<name>
    rc, out, err = run("pull", "-q", "bare")
    check(rc == 0 and out.strip() == os.path.join(store, "mlx-community/bare"), "bare name pull: %s %s" % (out, err))
    check(err == "", "quiet pull prints nothing on stderr: %r" % err)

    # auto-download on first use (sm_store_resolve with allow_download), then local
    REPOS["acme/auto"] = Repo(MODEL_FILES)
    rc, out, err = run("resolve", "acme/auto")
    check(rc == 0 and out.strip() == os.path.join(store, "acme/auto"), "resolve downloads: %s %s" % (out, err))
    n1 = len(LOG)
    rc, out, err = run("resolve", "acme/auto")
    check(rc == 0 and len(LOG) == n1, "second resolve is local (no hub request)")
    rc, out, err = run("resolve", "acme/nope")
    check(rc != 0 and "not found" in err, "resolve of a missing repo: %s" % err)
    shutil.rmtree(os.path.join(store, "acme/auto"))

    # 2. resume within one run: the server drops the connection at 40% the first time
    size = len(MODEL_FILES["model.safetensors"])
    rc, out, err = run("pull", "acme/cut")
    check(rc == 0, "pull acme/cut rc=%d err=%s" % (rc, err))
    check("retrying" in err, "the retry is reported: %r" % err)
    check_model("acme/cut")
    dl = downloads("acme/cut", "model.safetensors")
    check(len(dl) == 2, "two requests for the cut file: %s" % [(e[1], e[3]) for e in dl])
    if len(dl) == 2:
        check(dl[0][1] is None and dl[0][3] == size * 2 // 5, "first request plain, cut at 40%")
        check(dl[1][1] == "bytes=%d-" % (size * 2 // 5), "second request resumes: Range %r" % dl[1][1])
        check(dl[0][3] + dl[1][3] == size, "no byte downloaded twice (%d + %d vs %d)" % (dl[0][3], dl[1][3], size))

    # 3. resume across runs: no retries -> the first pull fails, keeps the .part, stores nothing
    rc, out, err = run("pull", "acme/cut2", SMELT_PULL_RETRIES="0")
    check(rc != 0 and "interrupted" in err, "interrupted pull fails: rc=%d err=%s" % (rc, err))
    check(not os.path.exists(os.path.join(store, "acme/cut2")), "no half model in the store")
    part = os.path.join(store, ".tmp/acme--cut2/model.safetensors.part")
    check(os.path.exists(part) and os.path.getsize(part) == size * 2 // 5, "partial download kept for resume")
    rc, out, err = run("list", "-q")
    check("acme/cut2" not in out, "list does not show a half-downloaded model")
    rc, out, err = run("pull", "acme/cut2")
    check(rc == 0, "resumed pull rc=%d err=%s" % (rc, err))
    check_model("acme/cut2")
    dl = downloads("acme/cut2", "model.safetensors")
    check(len(dl) == 2 and dl[1][1] == "bytes=%d-" % (size * 2 // 5), "second run resumes with Range")

    # 4. sha256 mismatch -> error, nothing left in the store
    before = set(files_under(cache))
    rc, out, err = run("pull", "acme/badsha")
    check(rc != 0 and "sha256 mismatch" in err, "bad sha256 rejected: rc=%d err=%s" % (rc, err))
    check(set(files_under(cache)) == before, "nothing left after a checksum error: %s"
          % sorted(set(files_under(cache)) - before))

    # 5. private repo: 401 without token, success with HF_TOKEN
    rc, out, err = run("pull", "acme/private")
    check(rc != 0 and "401" in err and "HF_TOKEN" in err, "401 without token: rc=%d err=%s" % (rc, err))
    rc, out, err = run("pull", "acme/private", HF_TOKEN="wrong")
    check(rc != 0 and "401" in err, "401 with a wrong token: %s" % err)
    rc, out, err = run("pull", "acme/private", HF_TOKEN=TOKEN)
    check(rc == 0, "private pull with token rc=%d err=%s" % (rc, err))
    check_model("acme/private")
    check(all(e[2] == "Bearer " + TOKEN for e in downloads("acme/private", "model.safetensors")),
          "token sent as Bearer")
    # token file of `huggingface-cli login` (HF_HOME/token)
    os.makedirs(env["HF_HOME"], exist_ok=True)
    with open(os.path.join(env["HF_HOME"], "token"), "w") as f:
        f.write(TOKEN + "\n")
    shutil.rmtree(os.path.join(store, "acme/private"))
    rc, out, err = run("pull", "-q", "acme/private")
    check(rc == 0, "token from HF_HOME/token: %s" % err)
    os.unlink(os.path.join(env["HF_HOME"], "token"))

    # 6. missing repo -> clear 404 error; repo without safetensors -> clear error
    before = set(files_under(cache))
    rc, out, err = run("pull", "acme/nope")
    check(rc != 0 and "not found" in err and "acme/nope" in err, "404: rc=%d err=%s" % (rc, err))
    rc, out, err = run("pull", "acme/ggufonly")
    check(rc != 0 and "safetensors" in err, "gguf-only repo refused: %s" % err)
    rc, out, err = run("pull", "../../etc")
    check(rc != 0, "bad name refused")
    check(set(files_under(cache)) == before, "failed pulls leave nothing")

    # 6b. hostile hubs: nothing beyond the listed size is written, the revision is checked
    # before it goes into a URL, redirects go only to https
    before = set(files_under(cache))
    rc, out, err = run("pull", "acme/liar")
    sent = sum(e[3] for e in LOG if e[0].startswith("/acme/liar/resolve/") and e[0].endswith("/config.json"))
    check(rc != 0 and "more than" in err and "config.json" in err, "oversized download refused: rc=%d %s" % (rc, err))
    check(sent < 40 << 20, "oversized download stopped early: the hub got %d of %d bytes out" % (sent, 50 << 20))
    check(set(files_under(cache)) == before, "nothing kept of the oversized download: %s"
          % sorted(set(files_under(cache)) - before))
    rc, out, err = run("pull", "acme/badrev")
    check(rc != 0 and "invalid revision" in err, "bad revision refused: rc=%d %s" % (rc, err))
    check(not [p for p in RAW_PATHS if p.startswith("/acme/badrev/resolve/") or "y=" in p],
          "the bad revision reached no URL: %s" % [p for p in RAW_PATHS if "badrev" in p])
    rc, out, err = run("pull", "acme/redirect")
    check(rc != 0 and "https" in err, "redirect to http refused: rc=%d %s" % (rc, err))
    check(not [p for p in RAW_PATHS if p.startswith("/redirected/")], "the http redirect was not followed")
    check(set(files_under(cache)) == before, "failed hostile pulls leave nothing: %s" % sorted(set(files_under(cache)) - before))

    # 7. list (store + HF cache), inspect, rm
    snap = os.path.join(env["HF_HOME"], "hub/models--hfowner--cached/snapshots/0123abcd")
    os.makedirs(snap)
    with open(os.path.join(snap, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "quantization": {"bits": 8, "group_size": 64}}, f)
    os.makedirs(os.path.join(env["HF_HOME"], "hub/models--hfowner--cached/refs"))
    with open(os.path.join(env["HF_HOME"], "hub/models--hfowner--cached/refs/main"), "w") as f:
        f.write("0123abcd")
    # symlinks out of the store are not followed by the walk (sizes, listing)
    outside_big = os.path.join(tmp, "outside-big")
    os.makedirs(outside_big)
    with open(os.path.join(outside_big, "big.bin"), "wb") as f:
        f.truncate(5 << 20)
    os.symlink(outside_big, os.path.join(store, "acme/tiny/linked-dir"))
    os.symlink(os.path.join(outside_big, "big.bin"), os.path.join(store, "acme/tiny/linked-file"))
    os.makedirs(os.path.join(tmp, "outside-owner/model"))
    with open(os.path.join(tmp, "outside-owner/model/config.json"), "w") as f:
        f.write('{"model_type": "llama"}')
    os.symlink(os.path.join(tmp, "outside-owner"), os.path.join(store, "linkedowner"))
    rc, out, err = run("list", "--json")
    check(rc == 0, "list --json rc")
    listed = json.loads(out)
    builtin = {m["name"]: m for m in listed if m["source"] == "built-in"}
    check("smelt-tiny" in builtin and "smelt-tiny-draft" in builtin and builtin["smelt-tiny"]["arch"] == "llama",
          "the built-in models are listed as built-in: %s" % sorted(builtin))
    items = {m["name"]: m for m in listed if m["source"] != "built-in"}
    check(set(items) == {"acme/tiny", "acme/cut", "acme/cut2", "acme/private", "mlx-community/bare",
                         "hfowner/cached"}, "list names: %s" % sorted(items))
    t = items.get("acme/tiny", {})
    want_size = sum(len(MODEL_FILES[f]) for f in WANTED) + os.path.getsize(
        os.path.join(store, "acme/tiny/.smelt-pull.json"))
    check(t.get("arch") == "qwen3" and t.get("bits") == 4 and t.get("source") == "store", "list entry: %s" % t)
    check(t.get("size_bytes") == want_size, "list size %s vs %d (symlinks out of the store not counted)"
          % (t.get("size_bytes"), want_size))
    c = items.get("hfowner/cached", {})
    check(c.get("source") == "hf" and c.get("arch") == "llama" and c.get("bits") == 8, "hf cache entry: %s" % c)
    rc, out, err = run("list")
    check(rc == 0 and "acme/tiny" in out and "qwen3" in out and "4-bit" in out, "list table:\n" + out)

    rc, out, err = run("inspect", "-m", "acme/tiny", "--max-tokens", "1000", "--kv-dtype", "f16", "--json",
                       SMELT_AVAILABLE_MEMORY="64G")
    check(rc == 0, "inspect rc=%d err=%s" % (rc, err))
    if rc == 0:
        j = json.loads(out)
        check(j["weights_bytes"] == WEIGHT_BYTES, "weights %s vs %d" % (j["weights_bytes"], WEIGHT_BYTES))
        check(j["n_params"] == N_PARAMS, "params %s vs %d" % (j["n_params"], N_PARAMS))
        kv_tok = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
        check(j["kv_bytes_per_token"] == kv_tok and j["kv_bytes"] == kv_tok * 1000, "kv %s" % j["kv_bytes"])
        check(j["verdict"] == "FITS" and j["fits"] is True, "verdict FITS")
        total = j["total_bytes"]
        rc2, out2, _ = run("inspect", "-m", "acme/tiny", "--max-tokens", "1000", "--kv-dtype", "f16",
                           SMELT_AVAILABLE_MEMORY=str(total - 1))
        check(rc2 == 1 and "DOES NOT FIT" in out2, "DOES NOT FIT exits 1: rc=%d\n%s" % (rc2, out2))
        rc2, out2, _ = run("inspect", "-m", "acme/tiny", "--max-tokens", "1000", "--kv-dtype", "f16",
                           SMELT_AVAILABLE_MEMORY=str(total))
        check(rc2 == 0 and "FITS" in out2, "exactly enough FITS: rc=%d" % rc2)
    # -tp N: the largest rank's share (docs/parallel.md): the embedding whole, plus (tied, N divides the vocabulary)
    # its copy of the rank's LM-head rows; the rest and the KV heads (at least one a rank) divided
    emb = sum(len(t[3]) for t in TENSORS if t[0].startswith("model.embed_tokens."))
    kv = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * 1000
    for tp, kv_heads in ((2, 1), (4, 1)):
        rc, out, err = run("inspect", "-m", "acme/tiny", "--max-tokens", "1000", "-tp", str(tp), "--json",
                           SMELT_AVAILABLE_MEMORY="64G")
        check(rc == 0, "inspect -tp %d rc=%d err=%s" % (tp, rc, err))
        if rc == 0:
            j = json.loads(out)
            want = emb + (WEIGHT_BYTES - emb) // tp + emb // tp
            check(j["tensor_parallel"] == tp and j["split_error"] is None and j["verdict"] == "FITS",
                  "-tp %d: %s" % (tp, out))
            check(j["rank_weights_bytes"] == want, "-tp %d rank weights %s vs %d" % (tp, j["rank_weights_bytes"], want))
            check(j["rank_kv_bytes"] == kv // KV_HEADS * kv_heads, "-tp %d rank KV %s" % (tp, j["rank_kv_bytes"]))
    for tp in (3, 16):
        rc, out, err = run("inspect", "-m", "acme/tiny", "-tp", str(tp), SMELT_AVAILABLE_MEMORY="64G")
        check(rc == 1 and "DOES NOT SPLIT" in out and "split evenly" in out, "-tp %d: rc=%d\n%s" % (tp, rc, out))
    # -pp N: the largest stage (weights and KV): stage r holds layers round(LAYERS * r / N) ..
    # round(LAYERS * (r + 1) / N) - 1 (src/model/pp.c), rank 0 also the embedding (tied: also the LM head)
    layer_bytes = (WEIGHT_BYTES - emb) // LAYERS
    for pp in range(2, LAYERS + 1):
        stages = []
        first = [int(LAYERS * s / pp + 0.5) for s in range(pp + 1)]
        for r in range(pp):
            nl = first[r + 1] - first[r]
            stages.append((layer_bytes * nl + (emb if r == 0 else 0), kv // LAYERS * nl))
        want_w, want_kv = max(stages, key=lambda x: x[0] + x[1])
        rc, out, err = run("inspect", "-m", "acme/tiny", "--max-tokens", "1000", "-pp", str(pp), "--json",
                           SMELT_AVAILABLE_MEMORY="64G")
        check(rc == 0, "inspect -pp %d rc=%d err=%s" % (pp, rc, err))
        if rc == 0:
            j = json.loads(out)
            check(j["pipeline_parallel"] == pp and j["split_error"] is None and j["verdict"] == "FITS",
                  "-pp %d: %s" % (pp, out))
            check(j["rank_weights_bytes"] == want_w and j["rank_kv_bytes"] == want_kv,
                  "-pp %d: rank weights %s, KV %s vs %d, %d" % (pp, j["rank_weights_bytes"], j["rank_kv_bytes"],
                                                               want_w, want_kv))
    rc, out, err = run("inspect", "-m", "acme/tiny", "-pp", str(LAYERS + 1), SMELT_AVAILABLE_MEMORY="64G")
    check(rc == 1 and "DOES NOT SPLIT" in out and "fewer than the stages" in out, "-pp %d: rc=%d\n%s" % (LAYERS + 1, rc, out))
    rc, out, err = run("inspect", "-m", "acme/tiny", "-pp", "2", "-tp", "2")
    check(rc == 2 and "one or the other" in err, "-pp with -tp: rc=%d %s" % (rc, err))
    for bad in ("0", "17", "x"):
        rc, out, err = run("inspect", "-m", "acme/tiny", "-tp", bad)
        check(rc == 2 and "tensor-parallel" in err, "-tp %s is a usage error: rc=%d %s" % (bad, rc, err))
    rc, out, err = run("inspect", "-m", "acme/tiny", "--kv-dtype", "f8")
    check(rc == 2, "bad --kv-dtype is a usage error (2)")
    rc, out, err = run("inspect", "-m", "acme/not-here")
    check(rc == 2 and "not found" in err, "inspect of a missing model: rc=%d %s" % (rc, err))

    outside = os.path.join(tmp, "outside-model")
    os.makedirs(outside)
    open(os.path.join(outside, "config.json"), "w").write("{}")
    rc, out, err = run("rm", "--yes", outside)
    check(rc == 1 and os.path.exists(outside) and "not inside" in err, "rm refuses outside paths: %s" % err)
    rc, out, err = run("rm", "--yes", snap)
    check(rc == 1 and os.path.exists(snap), "rm refuses the HF cache")
    rc, out, err = run("rm", "--yes", "acme/tiny")
    check(rc == 0 and not os.path.exists(os.path.join(store, "acme/tiny")), "rm acme/tiny: %s" % err)
    check(os.path.getsize(os.path.join(outside_big, "big.bin")) == 5 << 20, "rm leaves symlink targets alone")
    os.unlink(os.path.join(store, "linkedowner"))
    check(os.path.exists(os.path.join(store, "acme/cut")), "rm leaves other models")
    rc, out, err = run("rm", os.path.join(store, "acme/cut"))  # stdin is not a TTY: no prompt
    check(rc == 0 and not os.path.exists(os.path.join(store, "acme/cut")), "rm by path inside the store")
    rc, out, err = run("rm", "--yes", "acme/tiny")
    check(rc == 1 and "not in the store" in err, "rm of a missing model: %s" % err)

    # 8. arch
    rc, out, err = run("arch")
    check(rc == 0 and all(a in out for a in ("llama", "mistral", "qwen2", "qwen3")), "arch table:\n" + out)
    rc, out, err = run("arch", "--json")
    check(rc == 0 and {a["model_type"] for a in json.loads(out)} >= {"llama", "mistral", "qwen2", "qwen3"},
          "arch --json")

    srv.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS), file=sys.stderr)
        return 1
    print("store hub tests passed")
    return 0


if __name__ == "__main__":
    if CLI == "--serve":  # manual testing: run only the fake hub
        srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0), Hub)
        print("fake hub on http://127.0.0.1:%d" % srv.server_address[1], flush=True)
        srv.serve_forever()
    sys.exit(main())
