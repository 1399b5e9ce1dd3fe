#!/usr/bin/env bash
# Installs SpecPilot and what its tests need on a fresh machine (CPU, Python 3.11).
# torch comes first and pinned: a looser requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's chromium and its driver: the memory browser's tests drive the pages in headless chromium
# (selenium, pinned in the test extra). Installed as root where apt-get exists and they are missing.
if ! { command -v chromium && command -v chromedriver; } > /dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver > /dev/null
    else
        echo "install.sh: chromium and chromium-driver are missing (apt-get install -y chromium chromium-driver);" \
             "the browser tests will be skipped" >&2
    fi
fi
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,ray]"
# SGLang 0.5.23's pure-Python import dependencies, so its sources import on a CPU-only machine (tests of
# the entries and exports). Pinned, and none pulls torch or torchvision; compressed-tensors lists torch
# among its requirements, so it (and loguru, its one other missing dependency) comes in with --no-deps.
python3 -m pip install --quiet --disable-pip-version-check "msgspec==0.23.0" "psutil==7.2.2" \
    "pyzmq==27.3.0" "pybase64==1.5.1" "setproctitle==1.3.8" "fastapi==0.165.0" "aiohttp==3.14.5" \
    "apache-tvm-ffi==0.1.11" "dill==0.4.1" "sentencepiece==0.2.1" "einops==0.8.2" "gguf==0.19.0" "openai==2.8.0" \
    "partial-json-parser==0.2.1.1.post7" "uvicorn==0.54.0" "orjson==3.8.3" "ipython==8.12.3" "requests==2.34.2" \
    "pillow==13.0.0"
python3 -m pip install --quiet --disable-pip-version-check --no-deps "compressed-tensors==0.18.0" "loguru==0.7.3"
