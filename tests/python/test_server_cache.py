"""k3 serve's prefix cache seen from clients: many parallel streams equal serial runs (cache on and off), a
follow-up turn resumes at the longest kept boundary (usage.prompt_tokens_details.cached_tokens equals it)
and computes what a cold server computes. Fresh servers per test, so the cache holds only what the test
put there."""
import concurrent.futures

import pytest

openai = pytest.importorskip("openai")

from server_live import Live  # noqa: E402

MODEL = "tiny-k3"
T_H = 16  # --cache-hash of Live


def system_prompt():
    return {"role": "system", "content": "You are a careful assistant that answers in one short line. " * 6}


def greedy_chat(client, msgs, n=6, **extra):
    return client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=n, temperature=0,
                                          extra_body={"ignore_eos": True, **extra})


def streamed(client, msgs, n=6):
    chunks = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=n, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    content, reasoning = "", ""
    for c in chunks:
        if c.choices:
            content += c.choices[0].delta.content or ""
            reasoning += getattr(c.choices[0].delta, "reasoning_content", None) or ""
    return content, reasoning


def test_32_parallel_streams_equal_serial_with_cache_on_and_off(k3_bin, root):
    prompts = [[system_prompt(), {"role": "user", "content": f"Request {i}: name a colour."}] for i in range(32)]
    cold = Live(k3_bin, root, extra=("--no-cache",), parallel=1)
    try:
        serial = []
        for p in prompts:
            r = greedy_chat(cold.client, p)
            serial.append((r.choices[0].message.content or "",
                           getattr(r.choices[0].message, "reasoning_content", None) or ""))
    finally:
        cold.stop()
    for extra in ((), ("--no-cache",)):
        s = Live(k3_bin, root, extra=extra, parallel=8)
        try:
            with concurrent.futures.ThreadPoolExecutor(32) as ex:
                par = list(ex.map(lambda p: streamed(s.client, p), prompts))
            assert par == serial, f"cache {'off' if extra else 'on'}"
            m = s.wait_metrics(lambda m: m["k3_requests_running"] == 0)
            assert m["k3_pool_pages_used"] == 0
            if not extra:  # the shared system prompt was reused by the later streams
                assert m["k3_cache_hit_tokens_total"] > 0
        finally:
            s.stop()


def kept_boundaries(n_prompt, n_generated, finish):
    """The turn boundaries a finished sequence leaves: the last hash-aligned position of its prompt and of
    what it fed (a sequence that ends on `length` never fed its last sampled id)."""
    fed = n_prompt + n_generated - (1 if finish == "length" else 0)
    return {n_prompt // T_H * T_H, fed // T_H * T_H} - {0}


def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def expected_hit(boundaries, seq, prompt2):
    usable = min(lcp(seq, prompt2) // T_H * T_H, len(prompt2) - 1)
    return max([b for b in boundaries if b <= usable], default=0)


def test_followup_completion_resumes_at_the_longest_boundary_and_equals_cold(k3_bin, root):
    warm_srv = Live(k3_bin, root)
    cold_srv = Live(k3_bin, root, extra=("--no-cache",))
    try:
        p1 = [(i * 37 + 11) % 1000 for i in range(75)]
        r1 = warm_srv.client.completions.create(model=MODEL, prompt=p1, max_tokens=30, temperature=0,
                                                extra_body={"ignore_eos": True, "return_token_ids": True})
        g1 = r1.choices[0].token_ids
        assert len(g1) == 30 and r1.choices[0].finish_reason == "length"
        # the next turn sends back everything: prompt, output, new ids
        p2 = p1 + g1 + [(i * 53 + 7) % 1000 for i in range(9)]
        kw = dict(model=MODEL, prompt=p2, max_tokens=8, temperature=0, logprobs=5,
                  extra_body={"ignore_eos": True, "return_token_ids": True})
        warm = warm_srv.client.completions.create(**kw)
        boundaries = kept_boundaries(len(p1), len(g1), "length")
        assert warm.usage.prompt_tokens_details.cached_tokens == max(boundaries) == (75 + 30 - 1) // T_H * T_H
        cold = cold_srv.client.completions.create(**kw)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert warm.choices[0].token_ids == cold.choices[0].token_ids
        lw, lc = warm.choices[0].logprobs, cold.choices[0].logprobs
        assert lw.tokens == lc.tokens
        assert lw.token_logprobs == pytest.approx(lc.token_logprobs, abs=1e-4)
        for a, b in zip(lw.top_logprobs, lc.top_logprobs):
            assert a.keys() == b.keys()
            assert [a[k] for k in a] == pytest.approx([b[k] for k in a], abs=1e-4)
        # a divergence at position d reuses at most the aligned prefix before it
        d = 40
        p3 = list(p2)
        p3[d] = (p3[d] + 1) % 1000
        r3 = warm_srv.client.completions.create(model=MODEL, prompt=p3, max_tokens=1, temperature=0)
        assert r3.usage.prompt_tokens_details.cached_tokens <= d // T_H * T_H
    finally:
        warm_srv.stop()
        cold_srv.stop()


def test_followup_chat_turn_reuses_the_longest_boundary_and_equals_cold(k3_bin, root):
    warm_srv = Live(k3_bin, root)
    cold_srv = Live(k3_bin, root, extra=("--no-cache",))
    try:
        msgs = [system_prompt(), {"role": "user", "content": "What is two plus two? Answer briefly."}]
        p1 = warm_srv.tokenize_chat(msgs)
        r1 = greedy_chat(warm_srv.client, msgs, n=24, return_token_ids=True)
        assert r1.prompt_token_ids == p1
        g1 = r1.choices[0].token_ids
        m1 = r1.choices[0].message
        turn = {"role": "assistant", "content": m1.content or ""}
        if getattr(m1, "reasoning_content", None):
            turn["reasoning_content"] = m1.reasoning_content
        msgs2 = msgs + [turn, {"role": "user", "content": "And three plus three?"}]
        p2 = warm_srv.tokenize_chat(msgs2)
        warm = greedy_chat(warm_srv.client, msgs2, n=8, logprobs=True, top_logprobs=3)
        want = expected_hit(kept_boundaries(len(p1), len(g1), r1.choices[0].finish_reason), p1 + g1, p2)
        assert want > 0
        assert warm.usage.prompt_tokens_details.cached_tokens == want
        cold = greedy_chat(cold_srv.client, msgs2, n=8, logprobs=True, top_logprobs=3)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert warm.choices[0].message.content == cold.choices[0].message.content
        assert getattr(warm.choices[0].message, "reasoning_content", None) == \
            getattr(cold.choices[0].message, "reasoning_content", None)
        wl, cl = warm.choices[0].logprobs.content, cold.choices[0].logprobs.content
        assert [e.token for e in wl] == [e.token for e in cl]
        assert [e.logprob for e in wl] == pytest.approx([e.logprob for e in cl], abs=1e-4)
        assert [[t.token for t in e.top_logprobs] for e in wl] == [[t.token for t in e.top_logprobs] for e in cl]
    finally:
        warm_srv.stop()
        cold_srv.stop()


@pytest.mark.parametrize("dense", [False, True])
def test_divergence_reprocesses_at_most_one_hash_block_with_dense_checkpoints(k3_bin, root, dense):
    s = Live(k3_bin, root, extra=("--cache-dense-checkpoints",) if dense else ())
    try:
        base = [(i * 29 + 5) % 1000 for i in range(150)]
        s.client.completions.create(model=MODEL, prompt=base, max_tokens=1, temperature=0)
        for p in (21, 70, 133):
            q = list(base)
            q[p] = (q[p] + 1) % 1000
            r = s.client.completions.create(model=MODEL, prompt=q, max_tokens=1, temperature=0)
            cached = r.usage.prompt_tokens_details.cached_tokens
            if dense:
                assert cached == p // T_H * T_H, p  # re-processed before p: p mod T_h < one hash block
            else:
                assert cached == 0, p  # only the turn boundary (144) has a KDA checkpoint
    finally:
        s.stop()
