#!/usr/bin/env python3
"""build_corpus.py: the English training corpus of the embedded default model (issue 4), reproducibly.

Steps (Python stdlib + Debian packages; nothing else is downloaded):
  1. `apt-get download` the source packages (PACKAGES) into SCRATCH/deb, `dpkg -x` them into SCRATCH/root.
  2. Decode each source into documents {src, id, title, author, chapter, text} (one chapter or page each):
       janeaustenr (R lazy-load data, data/rdata.py)      6 Austen novels, split at CHAPTER lines
       tokenizers  (R lazy-load data)                      Moby Dick, Gutenberg header/footer removed
       sword-text-web, sword-text-kjv (data/sword.py)      World English Bible, King James Version
       python3.11-doc (data/html_text.py)                  Python 3.11 documentation pages
  3. Deduplicate paragraphs (exact match after whitespace/case folding, paragraphs >= 60 chars): the
     first occurrence in source order is kept.
  4. Split by document: val if crc32(src + id) % 50 == 0 (about 2%), else train.
  5. Synthetic XTML conversations (data/synth_chat.py) from each split's documents, CHAT_FRACTION of its
     prose bytes, written with marker spellings that training/tokenize_corpus.py maps to special ids.
Output (OUT, default .carry/corpus, git-ignored):
  train.jsonl, val.jsonl          one document per line: {"src","id","title","text"} (prose and chat)
  bpe_train.txt                   train prose only, documents separated by blank lines (BPE input)
  manifest.json                   per-source document/byte counts, dedup counts, package versions
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import html_text  # noqa: E402
import rdata  # noqa: E402
import sword  # noqa: E402
import synth_chat  # noqa: E402

PACKAGES = ["r-cran-janeaustenr", "r-cran-tokenizers", "sword-text-web", "sword-text-kjv", "python3.11-doc"]
AUSTEN = {"emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
          "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice",
          "sensesensibility": "Sense and Sensibility"}
CHAT_FRACTION = 0.04
R_LIB = "usr/lib/R/site-library"


def fetch(scratch: str) -> dict:
    """Downloads and unpacks PACKAGES; returns {package: version}."""
    deb, root = os.path.join(scratch, "deb"), os.path.join(scratch, "root")
    os.makedirs(deb, exist_ok=True)
    missing = [p for p in PACKAGES if not glob.glob(os.path.join(deb, p + "_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=deb, check=True)
    versions = {}
    for p in PACKAGES:
        path = sorted(glob.glob(os.path.join(deb, p + "_*.deb")))[-1]
        versions[p] = os.path.basename(path).split("_")[1]
        subprocess.run(["dpkg", "-x", path, root], check=True)
    return versions


def _paragraphs(lines) -> str:
    """Gutenberg-style hard-wrapped lines -> paragraphs separated by blank lines."""
    paras, cur = [], []
    for line in lines:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return "\n\n".join(paras)


def _split_chapters(lines, pattern):
    """Splits a list of lines at lines matching pattern; yields (chapter number, lines incl. heading)."""
    chap, cur = 0, []
    for line in lines:
        if re.match(pattern, (line or "").strip()):
            if chap and cur:
                yield chap, cur
            chap, cur = chap + 1, []
        if chap:
            cur.append(line)
    if chap and cur:
        yield chap, cur


def austen_docs(root: str):
    data = rdata.read_lazyload_db(os.path.join(root, R_LIB, "janeaustenr/data/Rdata"))
    for key, title in AUSTEN.items():
        lines = rdata.as_columns(data[key])[""]
        for n, chunk in _split_chapters(lines, r"^(CHAPTER|Chapter) [0-9IVXLC]+\.?$"):
            text = f"{title}, chapter {n}\n\n" + _paragraphs(chunk[1:])
            yield {"src": "austen", "id": f"{key}/{n}", "title": title, "author": "Jane Austen",
                   "chapter": n, "text": text}


def moby_docs(root: str):
    data = rdata.read_lazyload_db(os.path.join(root, R_LIB, "tokenizers/data/Rdata"))
    raw = "".join(rdata.as_columns(data["mobydick"])[""]).replace("\ufeff", "").replace("\r\n", "\n")
    start, end = raw.find("*** START OF"), raw.find("*** END OF")
    body = raw[raw.find("\n", start) + 1:end if end > 0 else len(raw)]
    lines = body.split("\n")
    for n, chunk in _split_chapters(lines, r"^CHAPTER \d+\.? "):
        text = f"Moby Dick, {chunk[0].strip().title()}\n\n" + _paragraphs(chunk[1:])
        yield {"src": "moby-dick", "id": str(n), "title": "Moby Dick", "author": "Herman Melville",
               "chapter": n, "text": text}


def bible_docs(root: str, module: str, src: str, name: str):
    for book, chap, text in sword.chapters(os.path.join(root, "usr/share/sword/modules/texts/ztext", module)):
        yield {"src": src, "id": f"{book}/{chap}", "title": book, "author": "", "chapter": chap, "text": text,
               "where": f"{book} in the {name}"}


def python_docs(root: str):
    for rel, title, text in html_text.html_pages(os.path.join(root, "usr/share/doc/python3.11/html")):
        yield {"src": "python-docs", "id": rel, "title": title, "author": "", "text": text}


def dedup(docs, stats):
    """Drops repeated paragraphs (>= 60 chars) across all documents, first occurrence wins."""
    seen = set()
    for doc in docs:
        keep = []
        for para in doc["text"].split("\n\n"):
            key = " ".join(para.lower().split())
            if len(key) >= 60:
                h = zlib.crc32(key.encode()) ^ (len(key) << 32)
                if h in seen:
                    stats["dup_paragraphs"] += 1
                    continue
                seen.add(h)
            keep.append(para)
        doc["text"] = "\n\n".join(keep)
        if len(doc["text"]) >= 200:
            yield doc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".carry/corpus")
    ap.add_argument("--scratch", default="/tmp/k3-corpus-scratch")
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args(argv)
    versions = fetch(args.scratch)
    root = os.path.join(args.scratch, "root")
    sources = [austen_docs(root), moby_docs(root),
               bible_docs(root, "engWEB2015eb", "bible-web", "World English Bible"),
               bible_docs(root, "engKJV2006eb", "bible-kjv", "King James Version"), python_docs(root)]
    stats = {"dup_paragraphs": 0, "sources": {}}
    split = {"train": [], "val": []}
    for source in sources:
        for doc in dedup(source, stats):
            part = "val" if zlib.crc32((doc["src"] + doc["id"]).encode()) % 50 == 0 else "train"
            split[part].append(doc)
            s = stats["sources"].setdefault(doc["src"], {"docs": 0, "bytes": 0, "val_docs": 0})
            s["docs"] += 1
            s["bytes"] += len(doc["text"].encode())
            s["val_docs"] += part == "val"
    os.makedirs(args.out, exist_ok=True)
    for part, docs in split.items():
        prose = sum(len(d["text"].encode()) for d in docs)
        chats = list(synth_chat.conversations(docs, int(prose * CHAT_FRACTION), args.seed + (part == "val")))
        with open(os.path.join(args.out, part + ".jsonl"), "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({k: d[k] for k in ("src", "id", "title", "text")}, ensure_ascii=False) + "\n")
            for i, text in enumerate(chats):
                f.write(json.dumps({"src": "chat", "id": f"{part}/{i}", "title": "", "text": text},
                                   ensure_ascii=False) + "\n")
        stats[part] = {"docs": len(docs), "prose_bytes": prose, "chats": len(chats),
                       "chat_bytes": sum(len(c.encode()) for c in chats)}
    with open(os.path.join(args.out, "bpe_train.txt"), "w", encoding="utf-8") as f:
        for d in split["train"]:
            f.write(d["text"] + "\n\n")
    stats["packages"] = versions
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps({k: stats[k] for k in ("train", "val", "dup_paragraphs")}))


if __name__ == "__main__":
    main()
