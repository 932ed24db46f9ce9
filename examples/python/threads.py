"""Collector threads extend one replay buffer while learner threads sample it.

Each collector thread steps its own pendulums (``pendulum_sim.py``, Gymnasium's
Pendulum-v1 dynamics in numpy) and extends the buffer with a chunk of transitions at a
time; each learner thread samples batches and recomputes every sampled transition from
the simulator, counting any row that is not one whole transition (torn). The buffer is
small enough to wrap around many times, so learners read rows while collectors
overwrite the rows beside them. replaybuf releases the GIL while rows move, so the
threads' copies run at once.

    python examples/python/threads.py --seconds 10 --collectors 2 --learners 2

Prints the transitions written and rows sampled per second, and the torn rows (0).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import replaybuf
from pendulum_sim import SPEC, collect, learn


def parse_args(what: str, learners: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="how long to run")
    p.add_argument("--collectors", type=int, default=2, help=f"collector {what}")
    p.add_argument("--learners", type=int, default=learners, help="learner threads")
    p.add_argument("--capacity", type=int, default=100_000, help="rows the buffer holds")
    p.add_argument("--envs", type=int, default=50, help="pendulums per collector")
    p.add_argument("--steps", type=int, default=20, help="steps per chunk (envs * steps rows)")
    p.add_argument("--batch", type=int, default=256, help="rows per sample")
    p.add_argument(
        "--ratio",
        type=float,
        default=None,
        help="hold the learners to this many sampled rows per written row (a rate limit)",
    )
    return p.parse_args()


def rate_limit(args: argparse.Namespace):
    """The rate limit of `--ratio`: about `ratio` samples per written row, give or take
    a chunk's worth, once 4 batches are in; None without `--ratio`."""
    if args.ratio is None:
        return None
    chunk = args.envs * args.steps
    error = max(2.0 * max(1.0, args.ratio), args.ratio * chunk)
    return replaybuf.RateLimit.sample_to_insert_ratio(args.ratio, 4 * args.batch, error)


def stop_all(rb, stop) -> None:
    """Ends a run: `stop` for the loops, and a closed rate limit (if any) for the
    calls waiting on it."""
    stop.set()
    if rb.rate_limit_stats() is not None:
        rb.close_rate_limit()


def progress(rb, seconds, start, written, tallies, finished, check=lambda: None) -> None:
    """Prints the rows written and sampled per second, and the rows stored, about once
    a second from `start` until `seconds` pass or `finished` is set; `check` runs before
    each line (it may raise)."""
    last, last_written, last_sampled = start, 0, 0
    while not finished.is_set() and time.perf_counter() - start < seconds:
        time.sleep(min(1.0, max(0.0, seconds - (time.perf_counter() - start))))
        check()
        now = time.perf_counter()
        w, s = sum(c[0] for c in written), sum(t[0] for t in tallies)
        print(
            f"{now - start:5.1f}s  written {(w - last_written) / (now - last):12,.0f}/s  "
            f"sampled {(s - last_sampled) / (now - last):12,.0f}/s  stored {len(rb):,}",
            flush=True,
        )
        last, last_written, last_sampled = now, w, s


def report(args, written: int, sampled: int, torn: int, elapsed: float) -> int:
    """Prints the totals and the torn rows; the exit status (0: none torn)."""
    print(
        f"{args.collectors} collector(s), {args.learners} learner(s), {elapsed:.1f}s: "
        f"{written:,} transitions written ({written / elapsed:,.0f}/s), "
        f"{sampled:,} rows sampled and checked ({sampled / elapsed:,.0f}/s)"
    )
    print(f"torn rows: {torn} of {sampled:,} checked")
    if args.ratio is not None and written:
        print(f"sampled rows per written row: {sampled / written:.2f} (held to {args.ratio})")
    if sampled == 0:
        print("no row was sampled: nothing was checked")
        return 1
    return 1 if torn else 0


def main() -> int:
    args = parse_args("threads", learners=2)
    # A thread whose rows have moved gets the GIL back sooner (see the README's Python
    # section): the default 5 ms lets a waiter sleep while the other thread runs on.
    sys.setswitchinterval(1e-4)
    # One shard per collector: no two collectors share a write cursor.
    rb = replaybuf.ReplayBuffer(
        args.capacity, spec=SPEC, shards=args.collectors, seed=0, rate_limit=rate_limit(args)
    )
    stop = threading.Event()
    written = [[0] for _ in range(args.collectors)]
    tallies = [[0, 0] for _ in range(args.learners)]  # rows sampled, torn
    errors: list[BaseException] = []

    def guarded(loop, *loop_args) -> None:
        try:
            loop(*loop_args)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            stop.set()

    threads = [
        threading.Thread(
            target=guarded, args=(collect, rb, k, args.envs, args.steps, stop, written[k])
        )
        for k in range(args.collectors)
    ]
    threads += [
        threading.Thread(
            target=guarded, args=(learn, rb, args.batch, args.collectors, stop, tallies[k])
        )
        for k in range(args.learners)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    progress(rb, args.seconds, start, written, tallies, stop)
    stop_all(rb, stop)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - start
    return report(
        args,
        sum(c[0] for c in written),
        sum(t[0] for t in tallies),
        sum(t[1] for t in tallies),
        elapsed,
    )


if __name__ == "__main__":
    raise SystemExit(main())
