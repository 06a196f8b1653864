"""The Chromium that the browser tests drive through Playwright (tests/sim/test_report_html.py, the dashboard's
tests/live/test_dashboard_browser.py), or a skip that says what is missing: never a silent pass."""

from __future__ import annotations

import shutil
from importlib.util import find_spec

import pytest


def chromium() -> str:
    """The Chromium executable on PATH (Debian's ``chromium``; .ci/run installs it), or ``pytest.skip``."""
    if find_spec("playwright") is None:
        pytest.skip("the browser check needs Playwright: pip install playwright (in the test extra)")
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("the browser check needs a Chromium executable on PATH (apt-get install chromium; .ci/run does)")
