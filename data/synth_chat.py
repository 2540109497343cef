"""Synthetic K3 XTML conversations built from corpus documents (FORMATS.md §2.2), written as TEXT.

Markers are written with their special-token spellings and the training tokenizer maps exactly these
spellings to the special ids (training/tokenize_corpus.py, `MARKERS`); all other text is plain BPE:
  OPEN = <|open|>   CLOSE = <|close|>   SEP = <|sep|>   EOM = <|end_of_msg|>
  element(TAG, attrs, BODY) = OPEN TAG attrs SEP BODY CLOSE TAG SEP ;  message = element("message") EOM
Kinds of conversation (chosen by a seeded RNG, so the build is reproducible):
  continue  user gives a passage, assistant continues it with the next paragraph
  source    user asks which work a passage comes from
  chapter   tool declared (lookup_chapter), assistant calls it, tool answers, assistant quotes it
  docs      tool declared (search_python_docs), same three-step pattern on a Python documentation page
Thinking is on for ~70% (think channel present, short reasoning) and off for the rest (no think element),
matching the two generation prompts `OPEN message role="assistant" SEP OPEN think SEP` / `... OPEN response SEP`.
"""
import json
import random

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"

TOOLS = {
    "lookup_chapter": {"type": "function", "function": {
        "name": "lookup_chapter", "description": "Return the opening of a chapter of a book.",
        "parameters": {"type": "object", "properties": {
            "book": {"type": "string", "description": "title of the book"},
            "chapter": {"type": "number", "description": "chapter number, from 1"}},
            "required": ["book", "chapter"]}}},
    "search_python_docs": {"type": "function", "function": {
        "name": "search_python_docs", "description": "Search the Python documentation and return a passage.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what to look for"}},
            "required": ["query"]}}},
}


def escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def element(tag: str, body: str, **attrs) -> str:
    a = "".join(f' {k}="{escape(str(v))}"' for k, v in attrs.items())
    return f"{OPEN}{tag}{a}{SEP}{body}{CLOSE}{tag}{SEP}"


def message(body: str, **attrs) -> str:
    return element("message", body, **attrs) + EOM


def _sorted_json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def tool_declare(names) -> str:
    tools = _sorted_json([TOOLS[n] for n in names])
    body = ("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" + tools + "\n```")
    return message(body, role="system", type="tool-declare")


def argument(key: str, value) -> str:
    if isinstance(value, str):
        return element("argument", value, key=key, type="string")
    kind = "boolean" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else "object"
    return element("argument", _sorted_json(value), key=key, type=kind)


def assistant(content: str, reasoning=None, calls=()) -> str:
    body = ""
    if reasoning is not None:
        body += element("think", reasoning)
    body += element("response", content)
    if calls:
        body += element("tools", "".join(
            element("call", "".join(argument(k, v) for k, v in args.items()), tool=name, index=i + 1)
            for i, (name, args) in enumerate(calls)))
    return message(body, role="assistant")


def _sentences(text: str, n: int) -> str:
    out, rest = [], text
    for _ in range(n):
        cut = min((i for i in (rest.find(". "), rest.find("? "), rest.find("! ")) if i >= 0), default=-1)
        if cut < 0:
            out.append(rest)
            break
        out.append(rest[:cut + 1])
        rest = rest[cut + 2:]
    return " ".join(s for s in out if s).strip()


def _prose_paras(doc) -> list:
    return [p for p in doc["text"].split("\n\n")[1:] if 80 <= len(p) <= 900 and not p.startswith((" ", ">>>"))]


def conversation(doc, rng: random.Random) -> str:
    """One conversation from one document (a dict with src, title, author, text, chapter?)."""
    paras = _prose_paras(doc)
    if len(paras) < 2:
        return ""
    think = rng.random() < 0.7
    head = message("You are a helpful assistant.", role="system") if rng.random() < 0.3 else ""
    i = rng.randrange(len(paras) - 1)
    kind = rng.choice(["continue", "source", "tool"])
    where = doc.get("where") or doc["title"] + (f" by {doc['author']}" if doc.get("author") else "")
    if kind == "continue":
        user = message(f"Continue this passage from {doc['title']}:\n\n{paras[i]}", role="user")
        why = f"The passage comes from {where}. I will continue it in the same voice." if think else None
        return head + user + assistant(paras[i + 1], why)
    if kind == "source":
        user = message(f"Which work is this passage from?\n\n{paras[i]}", role="user")
        why = f"The names and the style point to {where}." if think else None
        return head + user + assistant(f"This passage is from {where}.", why)
    if doc["src"] == "python-docs":
        topic = doc["title"]
        user = message(f"What does the Python documentation say about {topic}?", role="user")
        call = ("search_python_docs", {"query": topic})
        first = tool_declare(["search_python_docs"])
    elif doc.get("chapter"):
        user = message(f"Quote the opening of chapter {doc['chapter']} of {doc['title']}.", role="user")
        call = ("lookup_chapter", {"book": doc["title"], "chapter": doc["chapter"]})
        first = tool_declare(["lookup_chapter"])
    else:
        return ""
    plan = f"I should call {call[0]} to get the text." if think else None
    result = message(paras[0], role="tool", tool=call[0], index=1)
    done = "The tool returned the passage; I will answer from it." if think else None
    answer = _sentences(paras[0], 2)
    return first + head + user + assistant("", plan, [call]) + result + assistant(answer, done)


def conversations(docs, target_bytes: int, seed: int):
    """Yields conversation strings built from random documents until target_bytes are produced."""
    rng = random.Random(seed)
    made, tries = 0, 0
    while made < target_bytes and docs and tries < 50 * len(docs):
        tries += 1
        text = conversation(rng.choice(docs), rng)
        if text:
            made += len(text.encode("utf-8"))
            yield text
