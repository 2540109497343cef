#!/usr/bin/env python3
"""convert.py: runs llama.cpp's own converter (convert_hf_to_gguf.py of the llama.cpp that the PyPI
llama-cpp-python sdist vendors) on a width checkpoint, with ONE step replaced: the vocabulary.

    python3 bench/llama_cpp/convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf [--outtype bf16]

Why: the converter's Kimi vocabulary step (KimiLinearModel.set_vocab, which K3 reuses) loads the real
Kimi tokenizer through transformers with trust_remote_code (the model repository's tokenization_kimi.py)
and recognises it by a hash of its output. The random-weight width checkpoints (scripts/
make_width_checkpoints.py) have no tokenizer, and the benchmark feeds token ids, so a placeholder
vocabulary of the same size is written instead, in the same "gpt2" (byte-level BPE) form with the
"kimi-k2" pre-tokenizer the real step writes: 256 byte tokens, 1024 two-byte merges, unused fillers,
and 256 control tokens at vocab_size - 256 .. vocab_size - 1 (BOS / EOS / PAD from config.json).
Every tensor and hyper-parameter goes through the converter unchanged.
"""
import pathlib
import sys


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def placeholder_vocab(self):
    import gguf

    hp = self.hparams
    t = hp.get("text_config", hp)
    n_vocab = t["vocab_size"]
    enc = bytes_to_unicode()
    tokens = [enc[b] for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    merges = []
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    for a in " " + letters:
        for b in letters + " ,.":
            if len(merges) == 768 or a + b == "  ":
                continue
            merges.append(f"{enc[ord(a)]} {enc[ord(b)]}")
            tokens.append(enc[ord(a)] + enc[ord(b)])
            types.append(gguf.TokenType.NORMAL)
    n_special = 256
    while len(tokens) < n_vocab - n_special:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(gguf.TokenType.UNUSED)
    for i in range(n_vocab - n_special, n_vocab):
        tokens.append(f"<|reserved_token_{i}|>")
        types.append(gguf.TokenType.CONTROL)
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        v = hp.get(key, t.get(key))
        if v is not None:
            add(int(v))


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama_dir, model, out = (pathlib.Path(a) for a in sys.argv[1:4])
    sys.path.insert(0, str(llama_dir))
    import convert_hf_to_gguf as converter  # the vendored converter (its gguf-py first on sys.path)
    from conversion.kimi_linear import KimiLinearModel

    KimiLinearModel.set_vocab = placeholder_vocab  # kimi_k3.KimiK3Model.set_vocab calls this one too
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outfile", str(out)] + (sys.argv[4:] or ["--outtype", "bf16"])
    converter.main()


if __name__ == "__main__":
    main()
