"""The bad-input campaign over te-core (issue 15): seeded, reproducible cases over
the NumPy API (fuzz_targets.py) and the raw bindings (fuzz_raw.py), each of which
must succeed with a correct result or raise a clear exception, never crash or hang.

Case i of a campaign with seed S is fully determined by (S, i). The cases run in
worker subprocesses, in batches; a worker reports each case as it starts, so a
crash (a signal) or a hang (a timeout) is pinned on its case, and the campaign
resumes with the next one in a fresh worker.

    python packages/te-core/tests/fuzz_runner.py --cases 10000 --seed 1   (nox -s fuzz)
    python packages/te-core/tests/fuzz_runner.py --replay 1:1234           (one case, in-process)

Outcomes: "ok" (verified against an oracle), "accepted" (succeeded where no
oracle judges the arguments), "error" (a clear exception: TypeError, ValueError
or NotImplementedError naming an argument); failures: "unclear" (any other
exception or one without a name in it), "wrong" (an oracle rejected the result),
"crash", "hang".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CLEAR = (TypeError, ValueError, NotImplementedError)
FAILURES = ("unclear", "wrong", "crash", "hang")


class _Opaque:
    def __repr__(self):
        return "<opaque object>"


def bad_values(kind: str, rng) -> list:
    """Values a careless caller might pass for an argument of `kind`."""
    common = [None, "x", _Opaque(), [1, 2], {"a": 1}]
    table = {
        "flag": ["False", "True", 0, 1, 1.0, 2, np.float32(1.0), np.int64(0)],
        "int": [1.5, True, False, "1", -1, 2**70, np.float64(2.0), 10**6, -(2**70)],
        "real": ["1e-5", 1j, [1.0], float("nan"), float("inf"), -1.0, True, 1e39],
        "scalar": [
            "1",
            1 + 2j,
            [1.0, 2.0],
            np.array([]),
            np.array([[1.0]]),
            float("nan"),
            float("inf"),
            -1.0,
            0.0,
            3e38,
            True,
            np.float16(2),
            np.array(1.0, np.complex64),
        ],
        "fmt": ["e4m4", 7, np.float32, "E4M3", np.int8, ""],
        "dtype": [np.float64, np.int32, "bfloat17", 7, np.complex64, np.bool_],
        "choice": ["", "MAX", 1, "gemm-ready", "maxx"],
        "list": [[], [np.zeros((2, 2), np.float64)], [np.zeros((0, 1), np.float32)], np.zeros((2, 2), np.float32)],
        "array": _bad_arrays(rng),
    }
    return common + table[kind]


def _bad_arrays(rng) -> list:
    x = rng.standard_normal((6, 32)).astype(np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False
    return [
        np.float32(3.0),
        np.array(3.0, np.float32),
        np.zeros((0, 32), np.float32),
        np.zeros((6, 0), np.float32),
        np.zeros(0, np.float32),
        x[:, ::2],
        x.T,
        frozen,
        x.astype(np.float64),
        x.astype(np.int32),
        x.astype(np.complex64),
        x > 0,
        np.array(["a", "b"]),
        np.array([object()]),
        x.reshape(2, 3, 2, 2, 2, 2, 2),
        x.reshape(1, 1, 1, 1, 1, 1, 1, 1, 1, 192),
        np.full((3, 5), np.nan, np.float32),
        np.full((4, 16), 3e38, np.float32),
        np.full((4, 16), np.inf, np.float16),
        np.full((2, 64), 1e-45, np.float32),
        np.broadcast_to(x[:1], (6, 32)),
        x.tolist(),
        np.frombuffer(bytes(256), np.float32).reshape(2, 32),  # read-only memory, like a read-only map
    ]


def make_case(seed: int, index: int):
    """(target name, call, kwargs, oracle, mutated argument or None) of case `index`."""
    import fuzz_raw
    import fuzz_targets

    rng = np.random.default_rng([seed, index])
    if rng.random() < 0.3:
        return fuzz_raw.make_case(rng)
    table = fuzz_targets.targets()
    t = table[int(rng.integers(len(table)))]
    kwargs = t.make(rng)
    mutated = None
    if rng.random() < 0.75:
        mutated = str(rng.choice(list(t.kinds)))
        pool = bad_values(t.kinds[mutated], rng)
        kwargs[mutated] = pool[int(rng.integers(len(pool)))]
    return t.name, t.call, kwargs, t.oracle, mutated


def names_an_argument(message: str, names) -> bool:
    """A clear message names what was wrong: an argument (quoted or not), or nanobind's signature list."""
    if "'" in message or "incompatible function arguments" in message or "argument" in message:
        return True
    words = set(message.replace("(", " ").replace(")", " ").replace(",", " ").split())
    return any(name in words for name in names)


def run_case(seed: int, index: int) -> tuple[str, str]:
    """Runs one case in this process; returns (outcome, detail)."""
    try:
        name, call, kwargs, oracle, mutated = make_case(seed, index)
    except Exception as e:  # noqa: BLE001  (a bug of the campaign itself)
        return "unclear", f"harness: making the case failed: {type(e).__name__}: {e}"
    label = f"{name}({mutated or 'valid'})"
    names = list(kwargs) + ([str(mutated).split(":")[0]] if mutated else [])
    try:
        with np.errstate(all="ignore"):
            result = call(**kwargs)
    except CLEAR as e:
        if names_an_argument(str(e), names):
            return "error", label
        return "unclear", f"{label}: {type(e).__name__} without an argument name: {e}"
    except Exception as e:  # noqa: BLE001  (classifying is the point)
        return "unclear", f"{label}: {type(e).__name__}: {e}"
    if oracle is None:
        return "accepted", label
    try:
        with np.errstate(all="ignore"):
            verdict = oracle(kwargs, result)
    except AssertionError as e:
        return "wrong", f"{label}: {e}"
    except Exception:  # noqa: BLE001  (the oracle cannot judge these arguments)
        verdict = None
    return ("ok" if verdict else "accepted"), label


def worker(seed: int, start: int, stop: int) -> None:
    """Runs cases [start, stop), one JSON line before and after each (the parent reads them)."""
    sys.path.insert(0, HERE)
    # The runner's own test (test_fuzz_smoke.py) makes one case crash or hang.
    crash_at = int(os.environ.get("TE_FUZZ_CRASH_AT", "-1"))
    hang_at = int(os.environ.get("TE_FUZZ_HANG_AT", "-1"))
    for i in range(start, stop):
        print(json.dumps({"start": i}), flush=True)
        if i == crash_at:
            os.abort()
        if i == hang_at:
            time.sleep(3600)
        outcome, detail = run_case(seed, i)
        print(json.dumps({"done": i, "outcome": outcome, "detail": detail}), flush=True)


def _crash_line(stderr: str, status: int) -> str:
    """The telling line of a dead worker's stderr: a sanitizer's report, else the last line."""
    lines = stderr.strip().splitlines()
    for marker in ("runtime error:", "ERROR: AddressSanitizer", "SUMMARY:", "Fatal Python error"):
        for line in lines:
            if marker in line:
                return line.strip()
    return lines[-1].strip() if lines else f"exit status {status}"


def _run_batch(seed, start, stop, timeout, results, failures):
    """One worker over [start, stop); returns the first case not run (stop when all ran)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{seed}:{start}:{stop}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    current, deadline = None, time.monotonic() + timeout
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        deadline = None
    for line in out.splitlines():
        record = json.loads(line)
        if "start" in record:
            current = record["start"]
        else:
            results[record["outcome"]] += 1
            if record["outcome"] in FAILURES:
                failures.append(f"case {seed}:{record['done']} {record['outcome']}: {record['detail']}")
            current = None
    if current is None:
        return stop
    kind = "hang" if deadline is None else "crash"
    results[kind] += 1
    failures.append(f"case {seed}:{current} {kind}: {_crash_line(err, proc.returncode)}")
    return current + 1


def campaign(cases: int, seed: int, batch: int = 500, timeout: float = 300.0) -> tuple[dict, list]:
    """Runs cases [0, cases) of `seed` in worker subprocesses; returns (counts, failures)."""
    results, failures = collections.Counter(), []
    start = 0
    while start < cases:
        start = _run_batch(seed, start, min(start + batch, cases), timeout, results, failures)
    return dict(results), failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--replay", help="SEED:INDEX: run one case in this process and print its outcome")
    args = parser.parse_args()
    if args.worker:
        worker(*(int(v) for v in args.worker.split(":")))
        return 0
    sys.path.insert(0, HERE)
    if args.replay:
        seed, index = (int(v) for v in args.replay.split(":"))
        print(run_case(seed, index))
        return 0
    began = time.monotonic()
    results, failures = campaign(args.cases, args.seed, args.batch)
    print(f"fuzz: {args.cases} cases, seed {args.seed}, {time.monotonic() - began:.0f} s: " + json.dumps(results))
    for line in failures:
        print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
