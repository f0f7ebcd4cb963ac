#!/usr/bin/env python3
"""Prepare the training corpus for the embedded default model (smelt-tiny).

Sources (both from Debian packages, both freely redistributable):
  * World English Bible (Debian package `sword-text-web`, module engWEB2015eb),
    public domain; exported with `diatheke` (Debian package `diatheke`).
  * The Python 3.11 documentation sources (Debian package `python3.11-doc`,
    /usr/share/doc/python3.11/html/_sources/**/*.rst.txt), PSF License v2
    (documentation code examples: Zero-Clause BSD).

Output (in OUTDIR, default .dev/corpus, which is git-ignored):
  train.txt.xz   training text (documents separated by blank lines)
  heldout.txt    held-out text, never in train.txt (also copied to tests/golden/heldout.txt)
  sources.json   what went where

Usage:
  apt-get install diatheke sword-text-web python3.11-doc
  python3 tools/prepare_corpus.py [OUTDIR]
"""
import glob
import json
import lzma
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".dev", "corpus")
WEB_MODULE = "engWEB2015eb"
PYDOC = "/usr/share/doc/python3.11/html/_sources"

# Held-out material: whole chapters / whole documents, never seen in training.
HELDOUT_BOOKS = {"Ruth", "Jonah", "Philemon", "Titus"}
HELDOUT_DOCS = {"tutorial/errors.rst.txt", "howto/sorting.rst.txt", "faq/general.rst.txt"}


def web_bible():
    raw = subprocess.run(["diatheke", "-b", WEB_MODULE, "-k", "Gen 1:1-Rev 22:21"],
                         check=True, capture_output=True, text=True).stdout
    chapters = {}  # (book, chapter) -> [verse text], in order
    order = []
    ref_re = re.compile(r"^(?P<book>(?:I{1,3} )?[A-Z][A-Za-z ]*?) (?P<ch>\d+):(?P<v>\d+): ")
    key = None
    for line in raw.splitlines():
        # diatheke repeats a psalm's <title> in front of every verse: drop titles first
        t = re.sub(r"<title[^>]*>.*?</title>", "", line)
        t = t.replace("</w><w", "</w> <w")          # word tags glued without a space
        t = re.sub(r"<note[^>]*>.*?</note>", "", t)  # footnotes
        t = re.sub(r"<[^>]+>", "", t)
        t = re.sub(r"\(%s\)\s*$" % WEB_MODULE, "", t)
        t = re.sub(r"\s+", " ", t).strip()
        m = ref_re.match(t)
        if m:
            key = (m.group("book"), int(m.group("ch")))
            t = t[m.end():]
            if key not in chapters:
                chapters[key] = []
                order.append(key)
        if not t or key is None:
            continue
        chapters[key].append(t)
    train, held = [], []
    for key in order:
        text = " ".join(chapters[key])
        doc = f"{key[0]} chapter {key[1]}.\n{text}"
        (held if key[0] in HELDOUT_BOOKS else train).append(doc)
    return train, held


ROLE_RE = re.compile(r":[a-zA-Z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")


def clean_rst(txt):
    out = []
    skip_directive = False
    for line in txt.splitlines():
        s = line.rstrip()
        if re.match(r"^\s*\.\. ", s):
            # directives / comments / targets: keep the argument of a few prose directives
            m = re.match(r"^\s*\.\. (note|warning|seealso|versionadded|versionchanged|deprecated)::\s*(.*)$", s)
            skip_directive = m is None
            if m and m.group(2):
                out.append(m.group(2))
            continue
        if skip_directive:
            if s == "" or s.startswith(" "):
                if s.strip().startswith(":") and s.strip().endswith(":"):
                    continue
                if s == "":
                    skip_directive = False
                continue
            skip_directive = False
        if re.match(r"^([=\-~*^#\"'`+])\1{3,}$", s.strip()):
            continue  # section underline
        s = ROLE_RE.sub(r"\1", s)
        s = s.replace("``", "").replace("**", "")
        s = re.sub(r"`([^`<]+?)(?:\s*<[^>]*>)?`_+", r"\1", s)
        s = s.replace("\\", "")
        out.append(s)
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return text


def python_docs():
    train, held = [], []
    files = sorted(glob.glob(os.path.join(PYDOC, "**", "*.rst.txt"), recursive=True))
    for f in files:
        rel = os.path.relpath(f, PYDOC)
        if rel.startswith(("whatsnew/changelog", "license")):
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            t = clean_rst(fh.read())
        if len(t) < 200:
            continue
        (held if rel in HELDOUT_DOCS else train).append(t)
    return train, held


def main():
    os.makedirs(OUT, exist_ok=True)
    wt, wh = web_bible()
    pt, ph = python_docs()
    train = wt + pt
    def cap(docs, n):
        t = "\n\n".join(docs)
        if len(t) > n:
            t = t[:t.rfind("\n\n", 0, n)]
        return t
    held = cap(wh, 20000) + "\n\n" + cap(ph, 20000) + "\n"
    # sanity: held-out docs are not in train
    train_text = "\n\n".join(train) + "\n"
    for doc in wh + ph:
        assert doc not in train_text
    with lzma.open(os.path.join(OUT, "train.txt.xz"), "wt", encoding="utf-8", preset=6) as fh:
        fh.write(train_text)
    with open(os.path.join(OUT, "heldout.txt"), "w", encoding="utf-8") as fh:
        fh.write(held)
    golden = os.path.join(ROOT, "tests", "golden")
    os.makedirs(golden, exist_ok=True)
    with open(os.path.join(golden, "heldout.txt"), "w", encoding="utf-8") as fh:
        fh.write(held)
    info = {
        "train_chars": len(train_text), "heldout_chars": len(held),
        "web_train_chapters": len(wt), "web_heldout_chapters": len(wh),
        "pydoc_train_docs": len(pt), "pydoc_heldout_docs": len(ph),
        "heldout_books": sorted(HELDOUT_BOOKS), "heldout_docs": sorted(HELDOUT_DOCS),
    }
    with open(os.path.join(OUT, "sources.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
