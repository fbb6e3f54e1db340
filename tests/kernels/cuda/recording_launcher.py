"""A Launcher that records launches instead of running them: tests of a tactic's host side
(which kernels, grids and arguments it would launch) without a GPU."""

from __future__ import annotations


class RecordingLauncher:
    stream = None
    communicator = None

    def __init__(self, sm_count: int = 132, workspace_ptr: int = 0x1000):
        self.sm_count = sm_count
        self.launches: list[tuple[str, list]] = []  # (kernel name, args)
        self.workspaces: list[int] = []  # bytes asked for, in order
        self._ptr = workspace_ptr

    def launch(self, kernel, grid, block, args, shared_mem=0):
        self.launches.append((kernel.name, list(args)))

    def workspace(self, nbytes: int) -> int:
        self.workspaces.append(nbytes)
        return self._ptr
