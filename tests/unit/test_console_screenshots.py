"""Every screenshot docs/console.md shows is one a browser test takes (with
``KENNING_SCREENSHOTS_DIR=docs/console``), and is in the repository: a picture no test
takes goes stale with the page it shows, and one the docs name but nobody took is a
broken image."""

from __future__ import annotations

import re

from tests.support import REPO_ROOT

DOC = REPO_ROOT / "docs" / "console.md"
SHOWN = re.compile(r"""(?:\]\(|src=")console/([\w-]+)\.png""")
# the browser tests' screenshot calls: _shoot(page, "name") or _shoot(page, folder, "name")
TAKEN = re.compile(r"""_shoot\([^)]*?"([\w-]+)"\)""")


def test_every_screenshot_the_console_page_shows_is_taken_by_a_test() -> None:
    shown = set(SHOWN.findall(DOC.read_text()))
    taken = {
        name
        for path in (REPO_ROOT / "tests" / "system").glob("test_console_*browser.py")
        for name in TAKEN.findall(path.read_text())
    }
    assert shown, "docs/console.md shows no screenshot: the pattern no longer finds them"
    assert shown - taken == set(), f"shown in docs/console.md, taken by no test: {sorted(shown - taken)}"
    missing = sorted(name for name in shown if not (DOC.parent / "console" / f"{name}.png").is_file())
    assert missing == [], f"shown in docs/console.md, not in docs/console/: {missing}"
