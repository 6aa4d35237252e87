"""The CPU backend's worker pool (core/src/runtime/parallel.cpp) under
concurrent callers: ops issued from several Python threads at once (the pool
runs one job at a time; the others run on their own thread) give the bytes a
lone call gives."""

import threading

import numpy as np
import pytest

import transformer_engine.core as tc

pytestmark = pytest.mark.runtime


def test_concurrent_callers_get_the_same_results(rng):
    a = rng.standard_normal((257, 300)).astype(np.float32)
    b = rng.standard_normal((300, 129)).astype(np.float32)
    x = (rng.standard_normal((96, 512)) * 40).astype(np.float32)
    expected_gemm = tc.gemm(a, b).out
    expected_q = tc.quantize_fp8_current_scaling(x)
    errors = []

    def worker():
        try:
            for _ in range(20):
                assert np.array_equal(tc.gemm(a, b).out, expected_gemm)
                got = tc.quantize_fp8_current_scaling(x)
                assert np.array_equal(got.rowwise.view(np.uint8), expected_q.rowwise.view(np.uint8))
        except Exception as e:  # (reported from the main thread)
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
