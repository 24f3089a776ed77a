"""Load generator for OpenAI-compatible completion servers (kiln serve, llama-server), as
vLLM's benchmark_serving measures: request/s, output tokens/s, time to first token and
inter-token latency (p50/p99), end-to-end latency.

  llm_load.py URL MODEL [--clients N | --rate R] [--requests K] [--min-prompt 32]
              [--max-prompt 512] [--output 128] [--shared-prefix 0] [--seed 1] [--json]

Prompts are token-id lists (the same for every server: no tokenizer differences), drawn
from a fixed pseudo-random set: lengths uniform in [min-prompt, max-prompt], or a shared
prefix of --shared-prefix tokens then 32 tokens of each request's own. Each request asks
for exactly --output tokens (ignore_eos, greedy) as a stream. Closed loop: N clients, each
sends its next request when the last one ends. Open loop: Poisson arrivals at R/s.
Only the standard library: the client costs the same for every server.
"""
import argparse
import json
import random
import statistics
import sys
import threading
import time

from sse import HttpError, post_events


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def make_prompts(args):
    rng = random.Random(args.seed)
    prefix = [rng.randrange(200, 20000) for _ in range(args.shared_prefix)]
    prompts = []
    for _ in range(args.requests):
        n = 32 if args.shared_prefix else rng.randint(args.min_prompt, args.max_prompt)
        prompts.append(prefix + [rng.randrange(200, 20000) for _ in range(n)])
    return prompts


def one_request(url, model, prompt, output, out):
    body = {"model": model, "prompt": prompt, "max_tokens": output, "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    times = []
    try:
        for ev in post_events(url, "/v1/completions", body):
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                times.append(time.perf_counter())
    except HttpError as e:
        out.append({"error": e.status, "body": e.body[:200]})
        return
    end = time.perf_counter()
    if not times:
        out.append({"error": "no tokens"})
        return
    out.append({"ttft": times[0] - t0, "itl": [b - a for a, b in zip(times, times[1:])], "e2e": end - t0,
                "tokens": output, "start": t0, "end": end})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    prompts = make_prompts(args)
    results = []
    lock = threading.Lock()
    t_start = time.perf_counter()
    if args.rate > 0:
        rng = random.Random(args.seed + 1)
        threads = []
        for p in prompts:
            t = threading.Thread(target=one_request, args=(args.url, args.model, p, args.output, results))
            t.start()
            threads.append(t)
            time.sleep(rng.expovariate(args.rate))
        for t in threads:
            t.join()
    else:
        queue = list(prompts)

        def client():
            while True:
                with lock:
                    if not queue:
                        return
                    p = queue.pop(0)
                one_request(args.url, args.model, p, args.output, results)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t_start
    ok = [r for r in results if "error" not in r]
    errors = [r for r in results if "error" in r]
    itl = [x for r in ok for x in r["itl"]]
    s = {
        "label": args.label, "clients": args.clients, "rate": args.rate, "requests": len(results), "errors": len(errors),
        "wall_s": wall, "req_per_s": len(ok) / wall, "out_tok_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_p50_ms": 1e3 * percentile([r["ttft"] for r in ok], 50), "ttft_p99_ms": 1e3 * percentile([r["ttft"] for r in ok], 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99),
        "e2e_p50_s": percentile([r["e2e"] for r in ok], 50),
        "mean_prompt": statistics.mean(len(p) for p in prompts),
    }
    if errors:
        print("errors:", errors[:3], file=sys.stderr)
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{args.label:12s} clients={args.clients} rate={args.rate} requests={s['requests']} errors={s['errors']} "
              f"req/s={s['req_per_s']:.3f} out_tok/s={s['out_tok_per_s']:.1f} ttft p50/p99={s['ttft_p50_ms']:.0f}/"
              f"{s['ttft_p99_ms']:.0f} ms itl p50/p99={s['itl_p50_ms']:.1f}/{s['itl_p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
