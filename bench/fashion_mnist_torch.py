#!/usr/bin/env python3
"""PyTorch peer of `kiln train`: the same models, optimizer, batch size and input
scaling on Fashion-MNIST, timed per epoch. Writes the same JSON fields as
`kiln train --metrics-json`. Run with Debian's python3-torch: /usr/bin/python3."""
import argparse
import gzip
import json
import time

import numpy as np
import torch
from torch import nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--metrics-json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data_dir
    x = torch.from_numpy(read_idx(f"{d}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(read_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int64))
    tx = torch.from_numpy(read_idx(f"{d}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0).unsqueeze(1)
    ty = torch.from_numpy(read_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    model = build(a.model)
    opt = torch.optim.Adam(model.parameters(), lr=a.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(x.shape[0])
        t0 = time.perf_counter()
        total, correct, n = 0.0, 0, 0
        for i in range(0, x.shape[0], a.batch_size):
            idx = perm[i:i + a.batch_size]
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            out = model(xb)
            loss = loss_fn(out, yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            correct += (out.argmax(1) == yb).sum().item()
            n += len(idx)
        times.append(time.perf_counter() - t0)
        print(f"Epoch {epoch + 1}/{a.epochs} - {times[-1]:.1f}s - loss: {total / n:.4f} - accuracy: {correct / n:.4f}",
              flush=True)
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(tx[i:i + 256]) for i in range(0, tx.shape[0], 256)])
        test_loss = loss_fn(out, ty).item()
        test_acc = (out.argmax(1) == ty).float().mean().item()
    print(f"test loss: {test_loss:.4f} - test accuracy: {test_acc:.4f}")
    res = {"model": a.model, "epochs": a.epochs, "batch_size": a.batch_size, "threads": a.threads,
           "train_loss": total / n, "train_accuracy": correct / n, "test_loss": test_loss,
           "test_accuracy": test_acc, "mean_epoch_seconds": sum(times) / len(times),
           "epoch_seconds": times, "torch": torch.__version__}
    if a.metrics_json:
        with open(a.metrics_json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
