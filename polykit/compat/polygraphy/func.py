"""`polygraphy.func.extend`: a decorator that builds a loader from another loader and a function."""

from __future__ import annotations

import functools
from typing import Any, Callable


def extend(outer: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[[], Any]]:
    """`@func.extend(loader)` on `fn`: calling the result calls `loader()`, passes its value(s)
    (a tuple is spread) to `fn`, and returns `fn`'s value, or the loader's when fn returns None."""
    def decorate(fn: Callable[..., Any]) -> Callable[[], Any]:
        @functools.wraps(fn)
        def extended() -> Any:
            values = outer() if callable(outer) else outer
            args = values if isinstance(values, tuple) else (values,)
            result = fn(*args)
            return values if result is None else result

        return extended

    return decorate
