#!/usr/bin/env python3
"""Time to first token of one-image chat requests against an OpenAI-compatible server (smelt serve,
llama-server --mmproj): each request carries a different WIDTHxHEIGHT PNG (so no image or prefix
cache answers it) and asks for one token; its latency is the time to that token. Rounds of 1 request
give the time to first token; a round of N requests sent together gives images/s through the server
(N / the round's wall time). Standard library only.

  python3 bench/vision/ttft.py URL [--size 1024x768] [--alone 5] [--batch 16] [--label NAME]
"""
import argparse
import base64
import json
import struct
import sys
import threading
import time
import urllib.request
import zlib

SEQ = [0]


def png(w, h, seed):
    """an RGB PNG of gradients and noise that differs with the seed"""
    x = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    rows = []
    for y in range(h):
        row = bytearray(1 + 3 * w)  # filter byte 0
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
        for i in range(w):
            n = (x >> (i % 29)) & 15
            row[1 + 3 * i] = (i * 255 // w + n + seed) & 255
            row[2 + 3 * i] = (y * 255 // h + n) & 255
            row[3 + 3 * i] = ((i + y) * 127 // (w + h) + 3 * n + 7 * seed) & 255
        rows.append(bytes(row))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"".join(rows), 6)) + chunk(b"IEND", b""))


def request(url, img, out, i):
    body = {"model": "m", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(img).decode()}},
        {"type": "text", "text": "Describe this image."}]}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            d = json.loads(r.read())
        out[i] = (time.time() - t0, d.get("usage", {}).get("prompt_tokens"), None)
    except Exception as e:  # noqa: BLE001 (reported, not raised: the round goes on)
        out[i] = (time.time() - t0, None, str(e)[:200])


def round_(url, imgs):
    out = [None] * len(imgs)
    th = [threading.Thread(target=request, args=(url, im, out, i)) for i, im in enumerate(imgs)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join()
    return time.time() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--size", default="1024x768")
    ap.add_argument("--alone", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--label", default="server")
    a = ap.parse_args()
    w, h = map(int, a.size.split("x"))
    n = 1 + a.alone + a.batch
    imgs = [png(w, h, s) for s in range(n)]
    errs = 0
    _, out = round_(a.url, imgs[:1])  # warm-up: first-use costs of the server
    if out[0][2]:
        sys.exit("%s: FAILED: the first request: %s" % (a.label, out[0][2]))
    lat = []
    for k in range(a.alone):
        _, out = round_(a.url, imgs[1 + k:2 + k])
        lat.append(out[0][0])
        if out[0][2]:
            errs += 1
            print("%s: error: %s" % (a.label, out[0][2]))
    ptok = out[0][1]
    wall, out = round_(a.url, imgs[1 + a.alone:])
    bad = [o[2] for o in out if o[2]]
    errs += len(bad)
    for b in bad[:3]:
        print("%s: error: %s" % (a.label, b))
    lat.sort()
    print("%s: %dx%d image, %s prompt tokens: time to first token median %.1f ms (min %.1f, max %.1f) over %d "
          "requests one at a time; %d requests together: %.2f s, %.2f images/s; %d errors" %
          (a.label, w, h, ptok, 1e3 * lat[len(lat) // 2], 1e3 * lat[0], 1e3 * lat[-1], len(lat), a.batch, wall,
           a.batch / wall, errs))


if __name__ == "__main__":
    main()
