"""Other DLPack producers: JAX (CPU arrays as inputs) and CuPy (GPU), where installed."""

import numpy as np
import pytest

import pagedattn
from _cases import check_out, make_case


def test_jax_cpu_arrays():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    c = make_case(np.random.default_rng(0), context_lens=[3, 50], q_dtype="f16", kv_dtype="f16")
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(jnp.asarray(a), cpu)
            for a in (c.q, c.k, c.v, c.block_table, c.context_lens)]
    out = pagedattn.decode(*args)  # JAX arrays are immutable: out is a NumPy array
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    check_out(out, "f16", c.reference()[0])


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    if not pagedattn.cuda_available()[0]:
        pytest.skip("pagedattn built without CUDA")
    c = make_case(np.random.default_rng(1), context_lens=[0, 17, 300])
    args = [cupy.asarray(a) for a in (c.q, c.k, c.v, c.block_table, c.context_lens)]
    out = pagedattn.decode(*args)
    assert isinstance(out, cupy.ndarray)
    check_out(cupy.asnumpy(out), "f32", c.reference()[0])
