"""The Python client's side of bench/python-client.mjs: echo calls through a running mesh.

Usage: python client_bench.py NATS_URL SEQUENTIAL_CALLS IN_FLIGHT DURATION_S
Prints one JSON line: sequential p50/p90/p99 (ms) and calls/s, closed-loop calls/s and p50.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import toolmesh


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


async def main(url: str, sequential: int, in_flight: int, duration: float) -> None:
    mesh = await toolmesh.connect(url, default_timeout=30)
    sessions = [mesh.session(f"bench-py-{i}") for i in range(16)]
    counter = 0

    async def call() -> None:
        nonlocal counter
        counter += 1
        session = sessions[counter % len(sessions)]
        await session.call("echo", {"text": "x" * 1024}, call_id=f"py{counter}")

    for _ in range(20):  # warm up: subscriptions, JIT-free but caches and connections
        await call()
    seq: list[float] = []
    started = time.perf_counter()
    for _ in range(sequential):
        t0 = time.perf_counter()
        await call()
        seq.append((time.perf_counter() - t0) * 1000)
    seq_rate = sequential / (time.perf_counter() - started)

    closed: list[float] = []
    until = time.perf_counter() + duration

    async def worker() -> None:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            await call()
            closed.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    closed_rate = len(closed) / (time.perf_counter() - started)
    await mesh.close()
    print(
        json.dumps(
            {
                "sequential": {
                    "count": len(seq),
                    "p50_ms": round(statistics.median(seq), 3),
                    "p90_ms": round(percentile(seq, 90), 3),
                    "p99_ms": round(percentile(seq, 99), 3),
                    "calls_per_s": round(seq_rate),
                },
                "closed_loop": {
                    "in_flight": in_flight,
                    "calls": len(closed),
                    "calls_per_s": round(closed_rate),
                    "p50_ms": round(statistics.median(closed), 3),
                    "p99_ms": round(percentile(closed, 99), 3),
                },
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
