"""`polygraphy.backend.common`: BytesFromPath / bytes_from_path (a file's bytes, lazily or now)."""

from __future__ import annotations

import os

from polykit.backends.loaders import BaseLoader


class BytesFromPath(BaseLoader):
    """A loader of the bytes of the file at `path` (PolykitError when it is missing)."""

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def __call__(self) -> bytes:
        from polykit.errors import PolykitError
        from polykit.files import require_file

        return require_file(self.path, "file", PolykitError).read_bytes()


def bytes_from_path(path: str | os.PathLike) -> bytes:
    return BytesFromPath(path)()
