#!/usr/bin/env python3
"""PyTorch peer of bench/bench_inference.cc (issue 4: inference latency, batch 1 and 64,
mlp and cnn): reads a kiln model package's variables.safetensors with numpy, builds the
same model in torch.nn with those weights and times it under torch.inference_mode().

Input as kiln's: mlp x[N,784]; cnn x[N,28,28,1] NHWC. Variants timed, the fastest
reported (all reported in "variants_median_us"):
  eager          mlp: Linear/ReLU; cnn: NHWC -> contiguous NCHW, Conv2d (padding 1), the
                 first dense kernel's rows permuted to the (C,H,W) flatten order;
  channels_last  cnn only: the NHWC input viewed as a channels_last NCHW tensor (no copy),
                 flattened back in (H,W,C) order as kiln does (no weight permutation);
  jit:<variant>  torch.jit.trace + torch.jit.freeze of the variant;
  ofi:<variant>  torch.jit.trace + torch.jit.optimize_for_inference (freeze plus oneDNN
                 layout and fusion rewrites).
Outputs are checked against `kiln run` on the same package (max |diff| <= 1e-4).
Prints one JSON line per batch:
  {"runtime":"torch","model":"cnn","batch":1,"runs":200,"median_us":...,"variant":...}
Run with Debian's torch (system interpreter), without this machine's OpenBLAS throttles:
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
    /usr/bin/python3 bench/inference_torch.py DIR [--batches 1,64] [--runs N] [--kiln BIN]
"""
import sys

import numpy as np
import torch
from torch import nn

from inference_common import arguments, resolve_version, load_weights, input_shape, kiln_reference, report, time_calls


def linear(w, layer, kernel=None):
    k = w[f"{layer}/kernel"] if kernel is None else kernel
    m = nn.Linear(k.shape[0], k.shape[1])
    m.weight.data = torch.from_numpy(np.ascontiguousarray(k.T))
    m.bias.data = torch.from_numpy(w[f"{layer}/bias"])
    return m


def conv(w, layer):
    k = w[f"{layer}/kernel"]  # HWIO
    m = nn.Conv2d(k.shape[2], k.shape[3], 3, padding=1)
    m.weight.data = torch.from_numpy(np.ascontiguousarray(k.transpose(3, 2, 0, 1)))
    m.bias.data = torch.from_numpy(w[f"{layer}/bias"])
    return m


class Cnn(nn.Module):
    def __init__(self, w, channels_last):
        super().__init__()
        self.channels_last = channels_last
        self.features = nn.Sequential(conv(w, "conv2d"), nn.ReLU(), nn.MaxPool2d(2), conv(w, "conv2d_1"), nn.ReLU(),
                                      nn.MaxPool2d(2))
        k = w["dense/kernel"]
        if not channels_last:  # rows from kiln's (h, w, c) flatten order to (c, h, w)
            k = k.reshape(7, 7, 64, 128).transpose(2, 0, 1, 3).reshape(3136, 128)
        self.head = nn.Sequential(linear(w, "dense", k), nn.ReLU(), linear(w, "dense_1"), nn.Softmax(dim=-1))
        if channels_last:
            self.features = self.features.to(memory_format=torch.channels_last)

    def forward(self, x):  # x: [N, 28, 28, 1] NHWC
        x = x.permute(0, 3, 1, 2)  # NCHW view with channels_last strides
        if not self.channels_last:
            x = x.contiguous()
        h = self.features(x)
        if self.channels_last:
            h = h.permute(0, 2, 3, 1)  # (h, w, c), contiguous in channels_last memory
        return self.head(h.reshape(h.shape[0], -1))


def build(kind, w, variant):
    if kind == "mlp":
        return nn.Sequential(linear(w, "dense"), nn.ReLU(), linear(w, "dense_1"), nn.ReLU(), linear(w, "dense_2"),
                             nn.Softmax(dim=-1)).eval()
    return Cnn(w, variant == "channels_last").eval()


def main():
    a = arguments(("--no-jit",))
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)

    d = resolve_version(a.dir)
    w = load_weights(d)
    kind = "cnn" if "conv2d/kernel" in w else "mlp"
    rng = np.random.default_rng(0)
    xc = torch.from_numpy(rng.random(input_shape(kind, 8), dtype=np.float32))

    models = {}
    with torch.no_grad():  # not inference_mode: inference tensors break optimize_for_inference
        for v in (["eager"] if kind == "mlp" else ["eager", "channels_last"]):
            models[v] = build(kind, w, v)
    if not a.no_jit:
        with torch.no_grad():  # tracing under inference_mode is not supported in 1.13
            for v in [v for v in models if not v.startswith(("jit:", "ofi:"))]:
                traced = torch.jit.trace(models[v], xc)
                models["jit:" + v] = torch.jit.freeze(traced)
                # freeze + oneDNN rewrites (mkldnn convolution/linear layouts, fusions)
                models["ofi:" + v] = torch.jit.optimize_for_inference(torch.jit.trace(models[v], xc))

    check = {}
    if not a.no_check:
        ref = kiln_reference(a.kiln, d, xc.numpy())
        diffs = {}
        with torch.inference_mode():
            for v, m in models.items():
                diffs[v] = float(np.max(np.abs(m(xc).numpy() - ref)))
        worst = max(diffs.values())
        check = {"max_abs_diff_vs_kiln": worst}
        if not worst <= 1e-4:
            sys.exit(f"torch {kind}: output differs from kiln run: {diffs} (> 1e-4)")

    for batch in [int(b) for b in a.batches.split(",") if b]:
        runs = a.runs or (200 if batch <= 1 else 50)
        x = torch.from_numpy(rng.random(input_shape(kind, batch), dtype=np.float32))
        variants = {}
        with torch.inference_mode():
            for v, m in models.items():
                variants[v] = time_calls(lambda: m(x), runs)
        report("torch", kind, batch, runs, variants, {"torch": torch.__version__, **check})


if __name__ == "__main__":
    main()
