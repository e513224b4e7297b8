"""What the kda.jax tests share: the two backends, the FFI library required or skipped, and the
``backend`` fixture that runs a test on each (import it into a test module to use it)."""

from __future__ import annotations

import os

import pytest

from kda.jax import ffi as kffi

BACKENDS = ("ffi", "naive")


def ffi_or_skip():
    """Skips the calling test when the XLA FFI library cannot load (fails it with KDA_REQUIRE_XLA_FFI=1)."""
    if not kffi.load():
        msg = f"kda XLA FFI library not available: {kffi.load_error()}"
        if os.environ.get("KDA_REQUIRE_XLA_FFI") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "ffi":
        ffi_or_skip()
    return request.param
