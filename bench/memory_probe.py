"""memory_probe.py: the resident memory of a k3 command over its run (bench/bench_memory.py and
tests/python/test_memory.py share it).

run_sampled(cmd) starts the command, reads /proc/<pid>/status every `period` seconds (VmHWM, VmRSS,
RssAnon, RssFile, in bytes) until it exits, and returns the samples with the peak RSS: the last VmHWM
seen (wait4's ru_maxrss is no use: it counts the forking Python's pages from before the exec).
info_sizes(k3_bin, model) parses `k3 info`: the MLA/DSA cache bytes per token, the fixed KDA state per
sequence and the weight bytes. Linux only.
"""
import os
import re
import subprocess
import threading
import time

FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def read_status(pid):
    """{field: bytes} for FIELDS, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0]) * 1024  # kB
    return out if len(out) == len(FIELDS) else None


def run_sampled(cmd, period=0.002, timeout=300):
    """Runs cmd (stdout/stderr captured); returns (returncode, stdout, stderr, samples, peak_rss_bytes).
    peak_rss_bytes: the largest VmHWM sampled (the peak up to the last sample before the exit).
    samples: [(t_seconds, {field: bytes})]."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    samples = []
    chunks = {"out": b"", "err": b""}

    def drain(stream, key):
        chunks[key] = stream.read()

    th = [threading.Thread(target=drain, args=(p.stdout, "out")),
          threading.Thread(target=drain, args=(p.stderr, "err"))]
    for t in th:
        t.start()
    while True:
        pid, status = os.waitpid(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            break
        s = read_status(p.pid)
        if s is not None:  # an exited, unreaped process has no Vm*/Rss* lines
            samples.append((time.monotonic() - t0, s))
        if time.monotonic() - t0 > timeout:
            p.kill()
        time.sleep(period)
    for t in th:
        t.join()
    out, err = chunks["out"].decode(errors="replace"), chunks["err"].decode(errors="replace")
    peak = max((s["VmHWM"] for _, s in samples), default=0)
    return p.returncode, out, err, samples, peak


def info_sizes(k3_bin, model):
    """(cache bytes per token, KDA state bytes per sequence, weight bytes) from `k3 info`."""
    r = subprocess.run([k3_bin, "info", "-m", str(model)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    per_tok = int(re.search(r"cache per token: (\d+) B", r.stdout).group(1))
    kda = int(re.search(r"KDA state per sequence: (\d+) B", r.stdout).group(1))
    weights = sum(int(b) for b in re.findall(r" (\d+) B \(\d+ tensors\)", r.stdout))
    return per_tok, kda, weights
