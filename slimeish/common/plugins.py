"""Load user functions by import path and check their signature at start-up.

A plugin named `pkg.module.func` is imported once, before any process is started, and its
parameters are compared with the signature the hook expects, so a wrong plugin fails with an
error that states the expected signature instead of a TypeError deep inside a rollout.

Modules resolve against the working directory too, as under `python -m`: the `slimeish` console
script's sys.path starts at its own bin directory, so a user's `my_rollout.fn` would not import.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any


def load_function(
    path: str, *, expected: str, params: list[str], is_async: bool | None = None, keywords: Sequence[str] = ()
) -> Callable[..., Any]:
    """Import `path` ("module.attr" or "module:attr") and check it takes `params` positionally
    (then `keywords` by name: hooks that are called with keyword arguments).

    `expected` is the human-readable signature shown in errors, e.g.
    "async def reward(args, sample) -> float".
    """
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    if not module_name:
        raise ValueError(f"plugin path {path!r} must be 'package.module.function'; expected {expected}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # after site-packages: a local file never shadows an installed package
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for plugin {path!r}: {exc}") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise ValueError(f"plugin {path!r}: {module_name} has no function {attr!r}; expected {expected}")
    check_signature(func, path=path, expected=expected, params=params, is_async=is_async, keywords=keywords)
    return func


def check_signature(
    func: Callable[..., Any],
    *,
    path: str,
    expected: str,
    params: list[str],
    is_async: bool | None = None,
    keywords: Sequence[str] = (),
) -> None:
    """Raise ValueError unless `func` accepts `params` positionally and `keywords` by name (and is
    async iff `is_async`)."""
    if is_async is not None and inspect.iscoroutinefunction(func) != is_async:
        kind = "an async function" if is_async else "a plain (non-async) function"
        raise ValueError(f"plugin {path!r} must be {kind}; expected {expected}")
    try:
        inspect.signature(func).bind(*params, **dict.fromkeys(keywords))
    except TypeError as exc:
        raise ValueError(f"plugin {path!r} has the wrong signature ({exc}); expected {expected}") from exc
