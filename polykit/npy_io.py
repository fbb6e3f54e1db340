"""Reading .npy data (alone, inside an .npz, inside Polygraphy's JSON) without trusting it:
the header's dtype and shape must account for exactly the bytes present, before anything
is allocated (a header claiming 2**40 elements is an error, not a 4 TiB allocation), and
object dtypes are refused (numpy would need pickle for them).

The ground layer's reader of .npz files: the toolkit's data files, the builder's INT8
calibration batches and the rank processes' feeds and outputs all go through `open_npz`."""

from __future__ import annotations

import os
import tokenize
import zipfile
import zlib
from typing import IO, Any

from polykit import limits
from polykit.errors import DataFileError

_READERS = {(1, 0): "read_array_header_1_0", (2, 0): "read_array_header_2_0"}
NPY_MAGIC = b"\x93NUMPY"
#: a zip archive starts with a local file header, or (empty) with the end of its central directory
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: what reading a damaged zip archive raises (bad structure, bad compressed data, encryption)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError)
NPZ_HINT = "expected an .npz written by polykit (--save-inputs/--save-outputs) or numpy.savez"
#: the most bytes deflate can expand one byte into (its theoretical ratio is 1032:1): a member
#: that declares more is damaged or built to exhaust memory
_DEFLATE_RATIO = 1100


def read_npy(fh: IO[bytes], size: int, where: str) -> Any:
    """The array in the .npy stream `fh` of `size` bytes; DataFileError naming `where` if the
    stream is not a well-formed, self-consistent .npy without Python objects."""
    import numpy as np
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(fh)
        reader = _READERS.get(version)
        if reader is None:
            raise DataFileError(f".npy format version {version} is not one polykit reads", where=where,
                                hint="save arrays with numpy.save / numpy.savez")
        shape, fortran_order, dtype = getattr(npy, reader)(fh)
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError) as exc:  # numpy parses the header as Python
        raise DataFileError(f"the .npy header is malformed: {exc}", where=where) from None
    if dtype.hasobject:
        raise DataFileError(f"the array holds Python objects ({dtype}), which polykit never unpickles", where=where,
                            hint="store numbers, booleans or strings")
    need = dtype.itemsize
    for d in shape:
        need *= d
    have = size - fh.tell()
    if need != have:
        raise DataFileError(f"the .npy header says {dtype}{list(shape)} ({need} bytes), the data has {have} bytes",
                            where=where, hint="the file is truncated or was edited")
    limits.check("data_bytes", need, f"the array {dtype}{list(shape)}", DataFileError, where)
    try:
        raw = bytearray(have)  # filled in place and wrapped without a copy: the array costs its size once
    except MemoryError:
        raise DataFileError(f"the array {dtype}{list(shape)} does not fit in memory", where=where,
                            hint="free memory, or lower the data_bytes limit to refuse such files early") from None
    got = _read_into(fh, raw, where)
    if got != have:
        raise DataFileError(f"the array data ends after {got} of {have} bytes", where=where)
    try:
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")
    except ValueError as exc:  # e.g. a zero-size dtype
        raise DataFileError(f"the array cannot be built from its header: {exc}", where=where) from None


def _read_into(fh: IO[bytes], buf: bytearray, where: str) -> int:
    """Bytes read from `fh` into `buf` (fewer if the stream ends first)."""
    view, got = memoryview(buf), 0
    try:
        while got < len(buf):
            chunk = fh.read(min(len(buf) - got, 1 << 24))
            if not chunk:
                break
            view[got:got + len(chunk)] = chunk
            got += len(chunk)
    except _ZIP_ERRORS as exc:
        raise DataFileError(f"the array data cannot be read: {exc}", where=where) from None
    return got


def read_npz(source: Any, where: str, hint: str = "save arrays with numpy.savez") -> dict[str, Any]:
    """name -> array of the .npz archive `source` (a path or a binary file object), each member
    read by read_npy; DataFileError naming `where` for a damaged archive."""
    arrays: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(source) as zf:
            _check_members(zf.infolist(), _archive_size(source), where)
            for info in zf.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with zf.open(info) as fh:
                    arrays[key] = read_npy(fh, info.file_size, f"{where}: array {key!r}")
    except DataFileError:
        raise
    except _ZIP_ERRORS as exc:
        raise DataFileError(f"the archive cannot be read: {exc}", where=where, hint=hint) from None
    return arrays


def _archive_size(source: Any) -> int:
    if isinstance(source, (str, bytes, os.PathLike)):
        return os.path.getsize(source)
    end = source.seek(0, os.SEEK_END)
    source.seek(0)
    return end


def _check_members(infos: list[zipfile.ZipInfo], archive: int, where: str) -> None:
    """DataFileError unless every member's declared sizes are possible for an archive of
    `archive` bytes (stored or deflated, inside the file, not overlapping) and their total is
    within the data_bytes limit, before anything is decompressed."""
    total, spans = 0, []
    for info in infos:
        name = f"{where}: member {info.filename!r}"
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise DataFileError(f"the member is compressed with method {info.compress_type}; polykit reads stored or "
                                "deflated members (numpy.savez / savez_compressed)", where=name, hint=NPZ_HINT)
        if info.header_offset + info.compress_size > archive:
            raise DataFileError(f"the member claims {info.compress_size} compressed bytes at offset "
                                f"{info.header_offset}, past the end of the {archive}-byte archive", where=name,
                                hint="the archive is truncated or damaged")
        most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else info.compress_size * _DEFLATE_RATIO
        if info.file_size > most:
            raise DataFileError(f"the member claims {info.file_size} bytes from {info.compress_size} compressed bytes, "
                                "more than its compression can produce", where=name,
                                hint="the archive is damaged or built to exhaust memory (a zip bomb)")
        spans.append((info.header_offset, info.header_offset + max(info.compress_size, 1)))
        total += info.file_size
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise DataFileError("two members of the archive overlap", where=where,
                                hint="the archive is damaged or built to exhaust memory (a zip bomb)")
    limits.check("data_bytes", total, "the archive's uncompressed size", DataFileError, where)


def open_npz(path: "str | os.PathLike[str]", hint: str = NPZ_HINT) -> dict[str, Any]:
    """name -> array of the .npz file `path` (each member read by read_npy); DataFileError naming
    the file for one that cannot be opened, a lone .npy, a file that is not a zip archive, a
    damaged archive or one that holds no arrays."""
    where = str(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(NPY_MAGIC))
    except OSError as exc:
        raise DataFileError(f"the file cannot be read: {exc.strerror or exc}", where=where, hint="check the path") from None
    if head.startswith(NPY_MAGIC):
        raise DataFileError("the file is a single .npy array, not an .npz archive of named arrays", where=where,
                            hint="save feeds with numpy.savez(path, **{'<input name>': array}) or --save-inputs")
    if not head.startswith(ZIP_MAGICS):
        raise DataFileError("the file is not an .npz (zip) archive", where=where, hint=hint)
    arrays = read_npz(path, where, hint)
    if not arrays:
        raise DataFileError("the archive holds no arrays", where=where, hint=hint)
    return arrays
