"""Headless chromium for the browser's tests and benchmark: Debian's chromium and chromium-driver, through selenium
(both in the ``[test]`` extra's reach: ``scripts/install.sh`` installs the Debian packages)."""

from __future__ import annotations

from pathlib import Path

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


def missing_browser() -> str | None:
    """Why headless chromium cannot run here (what to install), or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.is_file():
            return f"needs Debian's {package} (apt-get install -y chromium chromium-driver; scripts/install.sh does it)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium==4.51.0 (pip; scripts/install.sh installs it)"
    return None


def chromium_driver(profile: Path):
    """A selenium driver of headless chromium with its own profile folder, keeping the console log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
