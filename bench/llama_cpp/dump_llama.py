#!/usr/bin/env python3
"""dump_llama.py: named intermediates of one llama.cpp prefill, through the eval callback (llama-cpp-python's
low-level API), for a layer-by-layer comparison with `k3 logits --trace-out DIR --dump NAME`.

    VENV/bin/python dump_llama.py MODEL.gguf IDS.npy OUT_DIR [NAME_REGEX]

Writes OUT_DIR/<ggml tensor name>.npy (f32 / i32, ggml's ne order reversed, size-1 dims squeezed), e.g.
l_out-2.npy, ffn_moe_topk-1.npy. llama.cpp numbers layers from 0 like k3's -L<layer> files.
compare_layers.py prints the per-layer NMSE of two k3 traces against such a dump.
"""
import ctypes, sys, os, re
import numpy as np
import llama_cpp as L

model_path, ids_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
want = re.compile(sys.argv[4] if len(sys.argv) > 4 else r"^(ffn_moe_logits|ffn_moe_topk|ffn_moe_weights_norm|l_out|ffn_moe_probs_biased|attn_norm|ffn_norm|ffn_out)-\d+$")
os.makedirs(out_dir, exist_ok=True)
ids = [int(i) for i in np.load(ids_path).reshape(-1)]

class T(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]

got = {}
def cb(tp, ask, ud):
    t = T.from_address(tp)
    name = t.name.decode()
    if ask:
        return bool(want.match(name))
    if not want.match(name):
        return True
    dt = {0: np.float32, 26: np.int32}.get(t.type)
    if dt is None:
        print("skip type", name, t.type); return True
    ne = list(t.ne); nb = list(t.nb)
    esz = np.dtype(dt).itemsize
    n_bytes = (ne[3]-1)*nb[3] + (ne[2]-1)*nb[2] + (ne[1]-1)*nb[1] + ne[0]*esz
    buf = (ctypes.c_char * n_bytes).from_address(t.data)
    a = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.uint8), shape=(ne[3], ne[2], ne[1], ne[0] * esz), strides=(nb[3], nb[2], nb[1], 1))
    a = np.ascontiguousarray(a).view(dt).reshape(ne[3], ne[2], ne[1], ne[0]).squeeze()
    got[name] = a.copy()
    return True

CB = L.ggml_backend_sched_eval_callback(cb)
L.llama_backend_init()
mp = L.llama_model_default_params(); mp.use_mmap = True
model = L.llama_model_load_from_file(model_path.encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx = len(ids) + 16; cp.n_batch = len(ids); cp.n_ubatch = len(ids); cp.n_threads = 2; cp.n_threads_batch = 2
cp.cb_eval = CB; cp.cb_eval_user_data = None
ctx = L.llama_init_from_model(model, cp)
batch = L.llama_batch_init(len(ids), 0, 1)
for i, tok in enumerate(ids):
    batch.token[i] = tok; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0; batch.logits[i] = 1
batch.n_tokens = len(ids)
assert L.llama_decode(ctx, batch) == 0
for k, v in got.items():
    np.save(os.path.join(out_dir, k + ".npy"), v)
print(sorted(got))
