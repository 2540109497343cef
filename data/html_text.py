"""Sphinx HTML (Debian python3.11-doc) -> plain text documents, Python stdlib html.parser only.

Per page: keep the content of <div role="main"> (the Sphinx body), drop navigation, scripts, styles, the
"¶" header links and the copy-button spans. Block elements (p, li, dt, dd, h1-h6, pre, div, tr, br) end a
paragraph; <pre> keeps its line breaks and indentation (code examples stay code); headings become their
own line. Index pages (genindex*, py-modindex, search) carry no prose and are skipped.
Output: (relative path, title, text) for every page with at least MIN_CHARS of text.
"""
import html.parser
import os
import re

BLOCK = {"p", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "div", "tr", "br", "table",
         "blockquote", "section", "dl", "ul", "ol"}
SKIP = {"script", "style", "nav"}
MIN_CHARS = 400
SKIP_PAGES = re.compile(r"(^|/)(genindex.*|py-modindex|search|contents|download|bugs|copyright)\.html$")


class _Extractor(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth_main = 0      # >0 while inside the main body div
        self.div_depth = 0
        self.skip = 0            # >0 inside script/style/headerlink
        self.pre = 0
        self.out = []
        self.title = ""
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "title":
            self.in_title = True
        if tag == "div":
            self.div_depth += 1
            if a.get("role") == "main" and not self.depth_main:
                self.depth_main = self.div_depth
        if not self.depth_main:
            return
        cls = a.get("class") or ""
        if tag in SKIP or (tag == "a" and "headerlink" in cls) or "copybutton" in cls:
            self.skip += 1 if tag in SKIP or tag == "a" or tag == "span" or tag == "button" else 0
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK:
            self.out.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        if self.depth_main and tag in BLOCK:
            self.out.append("\n\n")
        if tag == "pre" and self.pre:
            self.pre -= 1
        if self.skip and (tag in SKIP or tag in ("a", "span", "button")):
            self.skip -= 1
        if tag == "div":
            if self.depth_main == self.div_depth:
                self.depth_main = 0
            self.div_depth -= 1

    def handle_data(self, data):
        if self.in_title:
            self.title += data
        if not self.depth_main or self.skip:
            return
        if self.pre:
            self.out.append(data.replace("\n", "\x00"))  # protected line breaks
        else:
            self.out.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = "".join(self.out)
        paras = []
        for para in re.split(r"\n\s*\n", raw):
            lines = [ln.rstrip() for ln in para.replace("\x00", "\n").split("\n")]
            body = "\n".join(ln if "\x00" in para else ln.strip() for ln in lines).strip("\n")
            if body.strip():
                paras.append(body if "\x00" in para else " ".join(body.split()))
        return "\n\n".join(paras)


def html_pages(root: str):
    """Yields (relative path, page title, text) for the Sphinx pages under root, in sorted order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("_"))
        for name in sorted(filenames):
            if not name.endswith(".html"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if SKIP_PAGES.search(rel):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                parser = _Extractor()
                parser.feed(f.read())
            text = parser.text()
            title = parser.title.split("\u2014")[0].strip()
            if len(text) >= MIN_CHARS:
                yield rel, title, text
