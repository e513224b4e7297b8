"""A recording fla backend for the kda.fla tests: it sees the calls kda passes on."""

from __future__ import annotations

import contextlib
from inspect import unwrap


@contextlib.contextmanager
def spy_backend(backend_type, entries, targets):
    """A backend after kda's (priority 2) registered on ``targets`` (fla's dispatched functions and operation
    names), whose ``entries`` (name: True where the entry returns a pair) return zeros (``(zeros, None)`` for a
    pair) and record their names; yields the list of recorded calls, and removes the backend afterwards."""
    import torch
    from fla import backends as fb

    calls = []

    def entry(name, pair):
        def call(self, *args, **kwargs):
            calls.append(name)
            return (torch.zeros(1), None) if pair else torch.zeros(1)

        return call

    spy = type("Spy", (fb.BaseBackend,), {"backend_type": backend_type, "priority": 2,
                                           **{name: entry(name, pair) for name, pair in entries.items()}})
    for target in targets:
        fb.register(target)(spy)
    try:
        yield calls
    finally:
        for target in targets:
            registries = fb._operation_registries if isinstance(target, str) else fb._function_registries
            registries[target if isinstance(target, str) else unwrap(target)]._backends.pop(backend_type)
