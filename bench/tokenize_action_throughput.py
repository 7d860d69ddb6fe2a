"""CPU encode+decode throughput of lf-tokenize-action, in action dimensions per second.

Usage: python bench/tokenize_action_throughput.py [--chunks 4000 --horizon 10 --dim 7 --repeats 3]

Workload: random smooth chunks (n, H, D) (sums of two sinusoids per dimension).
BinningTokenizer (256 bins) encodes and decodes the (n * H, D) actions; FastTokenizer
(scale 10, vocab 1024, fitted on the same chunks beforehand, not timed) encodes the
chunks into token lists and decodes them back. Throughput = n * H * D / (best of
``repeats`` wall times of encode + decode). Targets (issue 8): binning >= 1e6/s,
FAST >= 1e5/s. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from lf_tokenize_action import BinningTokenizer, FastTokenizer, __version__


def smooth_chunks(n: int, horizon: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, horizon)[None, :, None]
    f, p, a = (rng.uniform(lo, hi, size=(n, 2, 1, dim)) for lo, hi in ((0.1, 2.0), (0, 6.3), (0.0, 0.5)))
    return (a * np.sin(2 * np.pi * f * t[:, None] + p)).sum(axis=1)


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4000)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--dim", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    chunks = smooth_chunks(args.chunks, args.horizon, args.dim)
    n_dims = chunks.size
    flat = chunks.reshape(-1, args.dim)
    binning = BinningTokenizer.from_actions(flat, n_bins=256)
    fast = FastTokenizer.fit(chunks, scale=10.0, vocab_size=1024)
    t_bin = best_time(lambda: binning.decode(binning.encode(flat)), args.repeats)
    t_fast = best_time(lambda: fast.decode(fast.encode(chunks)), args.repeats)
    tokens = fast.encode(chunks)
    print(json.dumps({
        "lf_tokenize_action": __version__,
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "workload": {"chunks": args.chunks, "horizon": args.horizon, "dim": args.dim, "action_dims": n_dims},
        "binning_dims_per_s": round(n_dims / t_bin),
        "fast_dims_per_s": round(n_dims / t_fast),
        "fast_tokens_per_chunk": round(float(np.mean([len(t) for t in tokens])), 2),
        "targets": {"binning_dims_per_s": 1_000_000, "fast_dims_per_s": 100_000},
    }, indent=2))


if __name__ == "__main__":
    main()
