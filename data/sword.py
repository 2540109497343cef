"""Reader for SWORD zText Bible modules (Debian sword-text-*), Python stdlib only.

A zText module keeps each testament (ot, nt) in three files:
  {t}.bzs   block index, 12 bytes per block: u32 offset into .bzz, u32 compressed size, u32 raw size (LE)
  {t}.bzv   verse index, 10 bytes per verse slot: u32 block number, u32 offset in the raw block, u16 size
  {t}.bzz   concatenated zlib streams (CompressType=ZIP), one per block (BlockType=BOOK: one per book)
Verse slots follow the module's versification; slots 0/1 are the testament and module headers, and
book and chapter intro slots hold the <div type="book"> / <chapter> milestones. We read every slot in
order, so no versification table is needed: chapter milestones give the structure.

OSIS markup -> prose: <note> (footnotes, cross references) is dropped with its content; <title> becomes a
heading line; <chapter sID> starts a new chapter document; paragraph milestones (type="x-p" sID, <p>,
<lb/>) become paragraph breaks; every other tag is removed (Strong's <w lemma> wrappers keep their word).
Yields documents (book name, chapter number, text), one per chapter.
"""
import html
import os
import re
import struct
import zlib

_NOTE = re.compile(r"<note\b[^>]*?(?<!/)>.*?</note>", re.S)
_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title>", re.S)
_BOOK = re.compile(r'<div\b[^>]*\btype="book"[^>]*\bsID=[^>]*>|<div\b[^>]*\bsID=[^>]*\btype="book"[^>]*>')
_OSIS_BOOK = re.compile(r'osisID="([^"]+)"')
_TOC1 = re.compile(r'<milestone\b[^>]*n="([^"]+)"[^>]*type="x-usfm-toc1"')
_CHAPTER = re.compile(r'<chapter\b[^>]*\bn="(\d+)"[^>]*\bsID=[^>]*/>|<chapter\b[^>]*\bsID=[^>]*\bn="(\d+)"[^>]*/>')
_PARA = re.compile(r'<div\b[^>]*type="x-p"[^>]*sID=[^>]*/>|<div\b[^>]*sID=[^>]*type="x-p"[^>]*/>|<p\b[^>]*>|<lb\b[^>]*/>')
_TAG = re.compile(r"<[^>]+>")
_SPACES = re.compile(r"[ \t\u00a0]+")


def read_testament(module_dir: str, testament: str):
    """Yields the raw OSIS text of every verse slot of one testament, in index order."""
    base = os.path.join(module_dir, testament)
    if not os.path.exists(base + ".bzs"):
        return
    with open(base + ".bzs", "rb") as f:
        bzs = f.read()
    with open(base + ".bzv", "rb") as f:
        bzv = f.read()
    with open(base + ".bzz", "rb") as f:
        bzz = f.read()
    blocks = {}
    for slot in range(len(bzv) // 10):
        block, offset, size = struct.unpack_from("<IIH", bzv, slot * 10)
        if size == 0:
            continue
        if block not in blocks:
            off, csize, rsize = struct.unpack_from("<III", bzs, block * 12)
            raw = zlib.decompress(bzz[off:off + csize])
            if len(raw) != rsize:
                raise ValueError(f"{base}.bzz block {block}: {len(raw)} bytes, index says {rsize}")
            blocks = {block: raw}  # books are read in order: keep only the current block
        yield blocks[block][offset:offset + size].decode("utf-8", errors="replace")


def _clean(osis: str) -> str:
    text = _NOTE.sub(" ", osis)
    text = _TITLE.sub(lambda m: "\n\n" + _TAG.sub("", m.group(1)).strip() + "\n\n", text)
    text = _PARA.sub("\n\n", text)
    text = html.unescape(_TAG.sub("", text))
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def chapters(module_dir: str):
    """Yields (book title, chapter number, prose) for every chapter of the module (OT then NT)."""
    book, chapter, parts = None, 0, []

    def flush():
        body = _clean(" ".join(parts))
        if book and chapter and len(body) > 0:
            return (book, chapter, f"{book}, chapter {chapter}\n\n{body}")
        return None

    for testament in ("ot", "nt"):
        for verse in read_testament(module_dir, testament):
            books = list(_BOOK.finditer(verse))
            m_book = books[-1] if books else None  # a slot may close one book and open the next
            m_chap = _CHAPTER.search(verse)
            if m_book or m_chap:
                doc = flush()
                if doc:
                    yield doc
                parts = []
            if m_book:
                toc = _TOC1.search(verse, m_book.start())
                osis_id = _OSIS_BOOK.search(m_book.group(0))
                book = toc.group(1) if toc else (osis_id.group(1) if osis_id else "Book")
                book = book.strip().title() if book.isupper() else book.strip()
                chapter = 0
            if m_chap:
                chapter = int(m_chap.group(1) or m_chap.group(2))
                verse = verse[m_chap.end():]
            if m_book and not m_chap:
                continue  # book header: titles and table-of-contents milestones only
            parts.append(verse)
    doc = flush()
    if doc:
        yield doc
