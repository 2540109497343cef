"""k3 serve against real clients: the official `openai` package and raw HTTP, on a live server bound to
127.0.0.1 with a free port and a tiny checkpoint. Every loop is bounded; the server is always killed."""
import concurrent.futures
import json
import socket
import time

import pytest

openai = pytest.importorskip("openai")

from server_live import Live  # noqa: E402

MODEL = "tiny-k3"


@pytest.fixture(scope="module")
def live(k3_bin, root):
    s = Live(k3_bin, root)
    yield s
    s.stop()


def conversation(n_turns=3):
    msgs = [{"role": "system", "content": "You are a terse assistant. " * 4}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"Question number {i}: what is {i} plus {i}? Explain briefly."})
        if i + 1 < n_turns:
            msgs.append({"role": "assistant", "content": f"It is {2 * i}."})
    return msgs


def test_health_and_models(live):
    status, _, body = live.raw("GET", "/health")
    assert status == 200
    models = live.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert live.client.models.retrieve(MODEL).id == MODEL
    status, _, body = live.raw("GET", "/v1/models/nope")
    assert status == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_chat_non_stream(live):
    r = live.client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_stream(live):
    kw = dict(model=MODEL, messages=conversation(1) + [{"role": "user", "content": "stream please"}],
              max_tokens=10, temperature=0)
    whole = live.client.chat.completions.create(**kw)
    chunks = list(live.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    assert reasoning == (getattr(whole.choices[0].message, "reasoning_content", None) or "")


def test_raw_sse_shape(live):
    body = {"model": MODEL, "messages": conversation(1), "max_tokens": 4, "temperature": 0, "stream": True}
    status, ctype, data = live.raw("POST", "/v1/chat/completions", body)
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [e for e in data.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in first  # only with include_usage


def test_completions(live):
    r = live.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 6
    streamed = live.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text
    echoed = live.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                            echo=True)
    assert echoed.choices[0].text == "Once upon a time" + r.choices[0].text


def test_tools_round_trip(live):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}]
    r = live.client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for call in r.choices[0].message.tool_calls or []:
        json.loads(call.function.arguments)
    status, _, body = live.raw("POST", "/v1/chat/completions",
                               {"model": MODEL, "messages": msgs, "tools": tools, "max_tokens": 2,
                                "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"


def test_client_errors_are_4xx(live):
    status, _, body = live.raw("POST", "/v1/chat/completions", b"{not json")
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "invalid_json" and "parse" in err["message"]
    status, _, body = live.raw("POST", "/v1/chat/completions",
                               {"model": MODEL, "messages": conversation(1), "temperature": "hot"})
    assert status == 400 and json.loads(body)["error"]["param"] == "temperature"
    status, _, body = live.raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": []})
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"
    status, _, body = live.raw("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "y"})
    assert status == 400
    status, _, body = live.raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard"}]})
    assert status == 400
    with pytest.raises(openai.NotFoundError) as e:
        live.client.chat.completions.create(model="gpt-9", messages=conversation(1), max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        live.client.completions.create(model=MODEL, prompt="word " * 2500, max_tokens=2)
    assert e.value.body["code"] == "context_length_exceeded"
    status, _, _ = live.raw("GET", "/v1/nothing-here")
    assert status == 404
    # unknown fields are ignored
    r = live.client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=2,
                                            extra_body={"frobnicate": 3, "top_k": 5, "min_p": 0.1})
    assert r.choices


def test_disconnect_mid_stream_frees_pages(live):
    body = json.dumps({"model": MODEL, "messages": conversation(2), "max_tokens": 400, "temperature": 1.0,
                       "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data:" not in got or got.count(b"data:") < 3:
        got += sock.recv(4096)
    sock.close()
    for _ in range(200):  # bounded: the cancellation lands within a few steps
        m = live.metrics()
        if m["k3_requests_running"] == 0 and m["k3_pool_pages_used"] == 0:
            break
        time.sleep(0.05)
    assert m["k3_requests_running"] == 0
    assert m["k3_pool_pages_used"] == 0  # held pages returned; only evictable cached ones remain
    r = live.client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def greedy(client, msgs, n=8):
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=n, temperature=0,
                                       extra_body={"ignore_eos": True})
    return r.choices[0].message.content, getattr(r.choices[0].message, "reasoning_content", None), r.usage


def test_prefix_cache_reuse_is_exact(live, k3_bin, root):
    msgs = conversation(3)
    first = greedy(live.client, msgs)
    again = greedy(live.client, msgs)
    assert again[2].prompt_tokens_details.cached_tokens > 0
    assert again[2].prompt_tokens_details.cached_tokens <= again[2].prompt_tokens - 1
    assert again[:2] == first[:2]
    grown = msgs + [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "And 3 plus 3?"}]
    warm = greedy(live.client, grown)
    assert warm[2].prompt_tokens_details.cached_tokens > 0
    cold_server = Live(k3_bin, root, extra=("--no-cache",))
    try:
        cold = greedy(cold_server.client, grown)
        assert cold[2].prompt_tokens_details.cached_tokens == 0
        assert cold[:2] == warm[:2]
    finally:
        cold_server.stop()


def test_parallel_streams_equal_serial(live):
    prompts = [conversation(1) + [{"role": "user", "content": f"variant {i}"}] for i in range(8)]
    serial = [greedy(live.client, p, 6)[:2] for p in prompts]

    def stream(p):
        chunks = live.client.chat.completions.create(model=MODEL, messages=p, max_tokens=6, temperature=0,
                                                     stream=True, extra_body={"ignore_eos": True})
        content, reasoning = "", ""
        for c in chunks:
            if c.choices:
                content += c.choices[0].delta.content or ""
                reasoning += getattr(c.choices[0].delta, "reasoning_content", None) or ""
        return content, reasoning or None

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        par = list(ex.map(stream, prompts))
    assert [(c or "", r or "") for c, r in par] == [(c or "", r or "") for c, r in serial]


def test_api_key(k3_bin, root):
    s = Live(k3_bin, root, extra=("--api-key", "sekret"))
    try:
        status, _, body = s.raw("GET", "/v1/models")
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
        status, _, _ = s.raw("GET", "/v1/models", headers={"Authorization": "Bearer sekret"})
        assert status == 200
        assert s.raw("GET", "/health")[0] == 200
    finally:
        s.stop()


def test_full_queue_is_429_and_server_keeps_serving(k3_bin, root):
    s = Live(k3_bin, root, extra=("--max-queue", "1"), parallel=1)
    try:
        body = {"model": MODEL, "messages": conversation(1), "max_tokens": 300, "temperature": 1.0,
                "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            statuses = list(ex.map(lambda _: s.raw("POST", "/v1/chat/completions", body)[0], range(6)))
        assert 429 in statuses and 200 in statuses
        assert set(statuses) <= {200, 429}
        r = s.client.chat.completions.create(model=MODEL, messages=conversation(1), max_tokens=2)
        assert r.choices
    finally:
        s.stop()
