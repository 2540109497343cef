"""tokenizer_corpus.py: a deterministic mixed-script corpus for tokenizer parity and BPE training.

parity_lines(seed) -> list[str]: short texts that together hit every pat_str alternative (FORMATS.md §1.2):
English with contractions in every case ('S 'LL, ſ), Chinese / Japanese / Korean (incl. Han outside the BMP and
the pinned odd Han code points 々 〇 〡), code, emoji (ZWJ families, skin tones, flags, keycaps), digits of all
lengths and scripts, whitespace runs (\r\n, tabs, Unicode spaces, \x1c-\x1f which Python calls space),
accents and combining marks. Nothing here depends on files of the machine, so CI sees the same corpus.

invalid_utf8_samples() -> list[bytes]: byte strings with invalid UTF-8 (lone continuation bytes, truncated
sequences, overlongs, surrogates, > U+10FFFF), to be compared after bytes.decode("utf-8", "replace").

long_texts() -> list[str]: inputs that trip the long-input guard (> 25,000 same-class runs, > 400,000 chars).

`python3 tokenizer_corpus.py --train-text FILE` writes a larger generated text for tools/train_bpe.py.
"""
import random
import sys

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had "
         "by word but not what all were we when your can said there use an each which she do how their if will "
         "up other about out many then them these so some her would make like him into time has look two more "
         "write go see number no way could people my than first water been call who oil its now find long down "
         "day did get come made may part tokenizer model kernel tensor attention expert router cache").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'lL", "'D",
                "'ſ", "\u2019s", "'x", "'"]
CHINESE = ["我们今天去公园散步。", "人工智能正在改变世界", "这是一个测试句子，包含标点符号！", "北京欢迎你",
           "模型的参数量为一万亿", "中文分词没有空格", "𠀀𠀁𪚥𫝀", "々〇〡〢〩", "⺀⺁⼀⼁", "豈更車"]
JAPANESE = ["東京は日本の首都です。", "ひらがなとカタカナを混ぜる", "ｶﾀｶﾅ半角", "私はラーメンが好きです",
            "「こんにちは」と言った。", "ー〜ヽヾゝゞ", "今日は2024年12月1日です"]
KOREAN = ["안녕하세요 세계", "한국어 토크나이저 테스트입니다.", "ᄀᄁ ᅡᅢ", "서울특별시"]
OTHER = ["Привет, мир! Это тест.", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
         "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu", "café naïve résumé", "cafe\u0301 nai\u0308ve",
         "e\u0301\u0302\u0303 a\u20dd", "ǅungla ǈj ǋ", "ßtraße ΣΑΣ", "İstanbul ıi", "ⅫⅣ ⅰⅱ", "ʰʲ ᵃᵇ ˆ"]
EMOJI = ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "❤️", "🧑🏿‍💻", "😀😃😄", "✨", "🤖", "👩🏻‍🦰"]
DIGITS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "٣٤٥٦", "１２３４", "²³", "½",
          "०१२३", "۱۲۳", "𝟏𝟐𝟑𝟒"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", "\u00a0", "\u2003",
          "\u3000", "\u200b", "\u180e", "\u0085", "\u2028", "\x0b", "\x0c", "\x1c", "\x1f", " \t \n", "\r"]
PUNCT = [".", ",", "!", "?", "...", "--", "->", "=>", "::", "(", ")", "[]", "{}", "<|", "|>", "\"", "'", "`",
         "#", "@", "$", "%", "^&*", "~", "\\", "/", ";", "«»", "—", "…", "。", "、", "！", "？"]
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
        "if x != None and y >= 3:\r\n    pass\r\n", "#include <stdio.h>\nint main() { return 0; }\n",
        "const auto& [k, v] = *it;  // comment\n", "SELECT * FROM t WHERE id = 42;\n",
        "x = {'a': 1, \"b\": [1, 2, 3]}\n", "    \n\n    indented\n\t\tmore\n", "fn main() -> Result<(), E> {}\n",
        "<div class=\"x\">&amp;</div>\n", "$ ls -la | grep foo > /dev/null 2>&1\n", "a+=b**c//d%e\n"]
SPECIAL_LOOKALIKES = ["<|im_end|>", "<|open|>", "<|close|>", "<|sep|>", "[BOS]", "[EOS]", "<think>",
                      "</think>", "<|reserved_token_1|>", "<|end_of_msg|>", "<|im_user|>"]


def _word(rng):
    w = rng.choice(WORDS)
    r = rng.random()
    if r < 0.15:
        w = w.upper()
    elif r < 0.35:
        w = w.capitalize()
    elif r < 0.4:
        w = "".join(c.upper() if rng.random() < 0.5 else c for c in w)
    if rng.random() < 0.15:
        w += rng.choice(CONTRACTIONS)
    return w


def _atom(rng):
    k = rng.random()
    if k < 0.35:
        return _word(rng)
    pools = [CHINESE, JAPANESE, KOREAN, OTHER, EMOJI, DIGITS, PUNCT, CODE, SPACES]
    pool = pools[int((k - 0.35) / 0.65 * len(pools))]
    s = rng.choice(pool)
    if pool is DIGITS and rng.random() < 0.5:
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    return s


def _line(rng, n_atoms):
    out = []
    for _ in range(n_atoms):
        out.append(_atom(rng))
        r = rng.random()
        out.append(" " if r < 0.6 else ("" if r < 0.85 else rng.choice(SPACES)))
    return "".join(out)


def parity_lines(seed=0, n=2500):
    rng = random.Random(seed)
    lines = []
    for pool in (CHINESE, JAPANESE, KOREAN, OTHER, EMOJI, DIGITS, SPACES, PUNCT, CODE, SPECIAL_LOOKALIKES):
        lines += pool                                   # every fixed sample alone
    lines += [f"it{c} he{c} THEY{c.upper()}" for c in CONTRACTIONS]
    lines += ["", " ", "a", "\n", "Hello world", " Hello", "HELLO World", "helloWORLD", "x" * 100,
              " " * 17 + "x", "\t" * 9, "\n" * 5 + "x", "a \n\n b", "1" * 37, "中" * 50, "!!!???\n\n"]
    for _ in range(n):
        lines.append(_line(rng, rng.randint(1, 30)))
    return lines


def invalid_utf8_samples():
    return [b"abc\x80def", b"\xff\xfe plain", b"caf\xc3", b"\xe4\xb8", b"\xe4\xb8\xad\xe6", b"\xf0\x9f\x98",
            b"x\xf0\x9f\x98y", b"\xc0\xaf overlong", b"\xe0\x80\xaf", b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80",
            b"\xf8\x88\x80\x80\x80", b"ok \xe4\xb8\xad\xe6\x96\x87 \x80\x81\x82 end", b"\xc3\x28", b"\xa0\xa1",
            b"\xe2\x82\x28", b"\xf0\x28\x8c\xbc", b"\xe4\xb8\xad\xe6\x96" + "文".encode() + b"\xf0"]


def long_texts():
    rng = random.Random(7)
    no_space = "".join(rng.choice("abcXYZ01é中") for _ in range(26_000))
    return [
        "a" * 25_001,                                  # one run just over the limit
        no_space + " tail",
        "x " + " " * 30_000 + "y",                     # long whitespace run
        "\n" * 26_000,
        "中" * 25_100 + "文",
        (" ".join(_word(rng) for _ in range(80_000)))[:401_000],   # > one 400,000-char window
    ]


def train_text(seed=1, n=40000):
    rng = random.Random(seed)
    return "\n".join(_line(rng, rng.randint(5, 40)) for _ in range(n))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train-text":
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            f.write(train_text())
    else:
        sys.exit("usage: tokenizer_corpus.py --train-text FILE")
