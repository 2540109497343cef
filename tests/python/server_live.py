"""A live `k3 serve` for the server tests and the serving benchmark: started on a free port of 127.0.0.1,
with the official `openai` client and raw HTTP helpers. Every wait is bounded; stop() always ends it."""
import http.client
import json
import re
import signal
import subprocess
import threading
import time


class Live:
    def __init__(self, k3_bin, root, model="tiny-k3", extra=(), parallel=4, ctx=2048, threads=1, block=64,
                 hash_block=16):
        import openai
        args = [k3_bin, "serve", "-m", str(root / "models" / model), "--port", "0", "-c", str(ctx), "-t",
                str(threads), "--parallel", str(parallel), "--cache-block", str(block), "--cache-hash",
                str(hash_block), *extra]
        self.hash_block = hash_block
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        self.log = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.stop()
            raise RuntimeError("server did not start: " + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()
        self.model = model
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0,
                                    timeout=120)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def terminate(self):
        self.proc.send_signal(signal.SIGTERM)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def raw(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type", ""), r.read()
        finally:
            conn.close()

    def post(self, path, body):
        status, _, data = self.raw("POST", path, body)
        return status, json.loads(data) if data else None

    def metrics(self):
        _, _, body = self.raw("GET", "/metrics")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#") and " " in line:
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metrics(self, pred, timeout=20.0):
        """Polls /metrics until pred(m) holds (bounded); returns the last reading."""
        deadline = time.time() + timeout
        m = self.metrics()
        while not pred(m) and time.time() < deadline:
            time.sleep(0.05)
            m = self.metrics()
        return m

    def tokenize_chat(self, messages):
        status, body = self.post("/tokenize", {"model": self.model, "messages": messages})
        assert status == 200, body
        return body["tokens"]
