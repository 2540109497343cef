"""Minimal reader for R lazy-load data bases (data/Rdata.rdx + Rdata.rdb), Python stdlib only.

CRAN packages installed by Debian keep their data sets in a lazy-load data base:
  Rdata.rdx   4-byte big-endian length + zlib stream of a serialized list
              list(variables = list(name = c(offset, length)), references, compressed)
  Rdata.rdb   at [offset, offset+length): 4-byte big-endian uncompressed length, then
              compressed == TRUE: zlib;  2: b'Z' + bzip2;  3: b'X' + xz;  then an R serialization.
R serialization (XDR, "X\\n"): version 2 or 3 header, then items. Each item starts with an int of flags:
  type = flags & 0xff, is_obj = bit 8, has_attr = bit 9, has_tag = bit 10.
We decode the subset that text data sets use (character/integer/double/logical vectors, lists,
pairlists, symbols, data frames, ALTREP compact and wrapped vectors) into plain Python values:
  STRSXP -> list[str | None], VECSXP -> RList (a list with .attrs), INTSXP -> list[int], ...
Anything else raises ValueError naming the type, so a new package layout fails loudly.
"""
import bz2
import gzip
import lzma
import struct
import zlib

NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP = 9, 10, 13, 14, 15, 16, 19, 20, 24
ALTREP_SXP, ATTRLISTSXP, ATTRLANGSXP, BASEENV_SXP, EMPTYENV_SXP = 238, 239, 240, 241, 242
GLOBALENV_SXP, NILVALUE_SXP, REFSXP, BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP = 253, 254, 255, 247, 249, 248
NA_INT = -(2**31)


class RList(list):
    """A VECSXP: list of values plus its attributes (names, class, row.names, ...)."""
    attrs: dict = {}


class RSym(str):
    """A symbol (SYMSXP)."""


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos, self.refs = buf, 0, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.buf, self.pos)
        self.pos += 4
        return v

    def raw(self, n: int) -> bytes:
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def length(self) -> int:
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def header(self):
        if self.raw(2) != b"X\n":
            raise ValueError("rdata: only XDR serialization is supported")
        version = self.int()
        self.int(), self.int()  # writer and minimal reader R versions
        if version == 3:
            self.raw(self.int())  # native encoding name
        elif version != 2:
            raise ValueError(f"rdata: serialization version {version}")

    def pairlist_attrs(self, item) -> dict:
        out = {}
        while isinstance(item, tuple) and item and item[0] == "pairlist":
            for tag, val in item[1]:
                out[str(tag)] = val
            break
        return out

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t in (NILVALUE_SXP, EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP, BASENAMESPACE_SXP):
            return None
        if t == REFSXP:
            idx = flags >> 8
            return self.refs[(idx if idx else self.int()) - 1]
        if t == SYMSXP:
            sym = RSym(self.item() or "")
            self.refs.append(sym)
            return sym
        if t in (NAMESPACESXP, PACKAGESXP):
            self.int()  # a STRSXP-like info vector without its own flags header
            n = self.int()
            info = [self.charsxp() for _ in range(n)]
            self.refs.append(("env", info))
            return self.refs[-1]
        if t == ENVSXP:
            env = {"locked": self.int()}
            self.refs.append(env)
            env["enclos"], env["frame"], env["hashtab"], env["attrs"] = (self.item() for _ in range(4))
            return env
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, ATTRLISTSXP, ATTRLANGSXP):
            cells = []
            while True:
                attr = self.item() if has_attr else None
                tag = self.item() if has_tag else None
                cells.append((tag, self.item()))
                del attr
                nxt = self.int()
                nt = nxt & 0xFF
                if nt == NILVALUE_SXP:
                    break
                if nt not in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
                    self.pos -= 4
                    cells.append((None, self.item()))
                    break
                has_attr, has_tag = bool(nxt & (1 << 9)), bool(nxt & (1 << 10))
            return ("pairlist", cells)
        if t == CHARSXP:
            self.pos -= 4
            return self.charsxp()
        if t == ALTREP_SXP:
            info, state, attr = self.item(), self.item(), self.item()
            return self.altrep(info, state)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            val = list(struct.unpack_from(f">{n}i", self.buf, self.pos))
            self.pos += 4 * n
        elif t == REALSXP:
            n = self.length()
            val = list(struct.unpack_from(f">{n}d", self.buf, self.pos))
            self.pos += 8 * n
        elif t == STRSXP:
            val = [self.charsxp() for _ in range(self.length())]
        elif t in (VECSXP, EXPRSXP):
            val = RList(self.item() for _ in range(self.length()))
        elif t == RAWSXP:
            val = self.raw(self.length())
        else:
            raise ValueError(f"rdata: unsupported SEXP type {t} at byte {self.pos - 4}")
        if has_attr:
            attrs = self.pairlist_attrs(self.item())
            if isinstance(val, RList):
                val.attrs = attrs
        return val

    def charsxp(self):
        flags = self.int()
        if flags & 0xFF != CHARSXP:
            raise ValueError(f"rdata: expected CHARSXP, got type {flags & 0xFF}")
        n = self.int()
        return None if n == -1 else self.raw(n).decode("utf-8", errors="replace")

    def altrep(self, info, state):
        cls = str(info[1][0][1]) if isinstance(info, tuple) else ""
        if cls in ("wrap_string", "wrap_integer", "wrap_real", "wrap_logical", "wrap_list"):
            return state[0]
        if cls == "compact_intseq":
            n, start, step = (int(x) for x in state)
            return list(range(start, start + n * step, step))
        if cls == "compact_realseq":
            n, start, step = state
            return [start + i * step for i in range(int(n))]
        if cls == "deferred_string":
            arg = state[1][0][1] if isinstance(state, tuple) else state
            return [str(x) for x in arg]
        raise ValueError(f"rdata: unsupported ALTREP class {cls!r}")


def unserialize(buf: bytes):
    r = _Reader(buf)
    r.header()
    return r.item()


def _decompress(blob: bytes, mode: int) -> bytes:
    (n,) = struct.unpack_from(">I", blob, 0)
    body = blob[4:]
    if mode == 2 and body[:1] == b"Z":
        out = bz2.decompress(body[1:])
    elif mode == 3 and body[:1] == b"X":
        out = lzma.decompress(body[1:])
    elif body[:1] == b"0":
        out = body[1:]
    else:
        out = zlib.decompress(body)
    if len(out) != n:
        raise ValueError(f"rdata: decompressed {len(out)} bytes, header says {n}")
    return out


def read_lazyload_db(stem: str) -> dict:
    """Reads STEM.rdx / STEM.rdb; returns {variable name: decoded value}."""
    with open(stem + ".rdx", "rb") as f:
        blob = f.read()
    # saveRDS writes the index gzip-compressed; older makeLazyLoadDB wrote a length-prefixed zlib stream
    index = unserialize(gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else _decompress(blob, 1))
    names = index.attrs.get("names", [])
    fields = dict(zip(names, index))
    variables = fields["variables"]
    mode = fields.get("compressed", [1])[0]
    mode = 1 if mode is True else int(mode)
    with open(stem + ".rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for name, (offset, length) in zip(variables.attrs.get("names", []), variables):
        out[name] = unserialize(_decompress(rdb[offset:offset + length], mode))
    return out


def as_columns(value) -> dict:
    """A data frame (RList with names) -> {column name: column list}; a vector -> {'': vector}."""
    if isinstance(value, RList) and "names" in value.attrs:
        return dict(zip(value.attrs["names"], value))
    return {"": value}
