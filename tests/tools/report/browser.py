"""What the HTML report tests share: headless Chromium's rendering of a page (the tests skip
without it) and the check that a page fetches nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: marks a test that opens a page in headless Chromium
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


def dump_dom(page: Path, tmp_path: Path) -> str:
    """The DOM headless Chromium builds from `page`, with no network and a profile in `tmp_path`."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_self_contained(text: str) -> None:
    """No address, script, stylesheet link, import or url() that a browser would fetch."""
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text, re.I)
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text
