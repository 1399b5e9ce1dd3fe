"""Other SGLang releases as bases: a release's wheel imported into the fork beside stock.

``--onto sglang==0.5.20`` (a pinned release) or ``--onto PATH.whl`` (any SGLang wheel) imports that
release exactly as stock is imported (every file checked against the wheel's RECORD, ``* -text``, modes
from the zip's ``external_attr``, fixed identity and date) with its own message, as the branch
``release/<version>``: the same wheel gives the same commit id on every machine. ``PINS`` holds each
pinned release's wheel sha256 and the tree and commit its import must give; a wheel that fails its hash
is refused before anything is written, and so is a wheel that is not SGLang or whose package has no
``sglang/srt/`` (the layout every entry's paths assume).
"""

from __future__ import annotations

import email.parser
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specpilot_mem.errors import ForkError, SpecPilotError
from specpilot_mem.store import stock
from specpilot_mem.store.fork import Fork

RELEASE_REF_PREFIX = "refs/heads/release/"
SCRATCH_REF = "refs/specpilot/release-import"
SPEC_PREFIX = "sglang=="
LAYOUT = "sglang/srt/"


class ReleaseError(SpecPilotError):
    """An unknown release, or a wheel that is not SGLang, fails its hash or has another package layout."""


@dataclass(frozen=True)
class ReleasePin:
    version: str
    wheel: str  # the file name on PyPI (CPython 3.11, manylinux_2_34 x86_64, as stock)
    sha256: str
    tree: str  # what the import must give
    commit: str


PINS: dict[str, ReleasePin] = {
    pin.version: pin
    for pin in (
        ReleasePin(
            "0.5.15",
            "sglang-0.5.15-cp311-cp311-manylinux_2_34_x86_64.whl",
            "21492759b4b99e117bd81610f633422f3fdae2896c2cde6931eab886deccc44f",
            "eac162d1f5f2bebd7007eec9f4a5c56fc6d545d9",
            "4b96ae1662d2ab7626621237f2ff0153350d1e29",
        ),
        ReleasePin(
            "0.5.16",
            "sglang-0.5.16-cp311-cp311-manylinux_2_34_x86_64.whl",
            "d5f345a18953dd35df568ac56bdcb7f5ee910ab39efea4469b714556d1070713",
            "a236a6d12619720f6cd31b700ceb8ee8d0e7d52d",
            "53d0bf9369bb228e03ba17942b9b9f9fd26d9a92",
        ),
        ReleasePin(
            "0.5.17",
            "sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl",
            "575e38f5683624ded3b4bb267f637a098e5ed37d13a1d1ff5ea09bd781a04d16",
            "3152945311da3033fc20e134d4265746542da651",
            "6ac88d88577f0609a21b4ce134f7e8f21323338b",
        ),
        ReleasePin(
            "0.5.18",
            "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl",
            "e97b585dd2d5db2802599feba47c84cce972f5e1231a6816fef996200207b5cf",
            "91d30261b23fcd91e28bd0ea3c07932913255415",
            "5fbff66285e776a129cb4ba99632f7beb0dccc72",
        ),
        ReleasePin(
            "0.5.19",
            "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl",
            "425e87377e725d03db8262382008f3fd9561a6cf5d82f485f8b9929f02ffe12b",
            "b670925d60dff3bde90cf9e71fbe74f87215ae75",
            "4082fb16d58678433f2a666f8a3d39473108f986",
        ),
        ReleasePin(
            "0.5.20",
            "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
            "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c",
            "770235a733ea61ac77aefe34915783a6ad9c9d28",
            "c1c2fb526b493cbddd8dc13ea93a5436672a133c",
        ),
        ReleasePin(
            "0.5.21",
            "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl",
            "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20",
            "ef9eb19b0b9814e69f8e35f9c2908113d9135800",
            "43d1ac9c03af66262897bef8c9da544ad973312d",
        ),
        ReleasePin(
            "0.5.22",
            "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl",
            "cc9a0f15bd8f877a0584fdb7a1702240177a1f1cc8d17c978715161717b9037b",
            "08d73c4904ebe59bcaf8db6577ce28693039bfcf",
            "6532bba14a894793633854a5b7fd39f844891301",
        ),
        ReleasePin(stock.SGLANG_VERSION, stock.WHEEL_NAME, stock.WHEEL_SHA256, stock.STOCK_TREE, stock.STOCK_COMMIT),
    )
}


@dataclass(frozen=True)
class ReleaseBase:
    """A release as a base in the fork: its branch, commit and tree, and the wheel it came from."""

    version: str
    ref: str
    commit: str
    tree: str
    wheel: str
    sha256: str
    pinned: bool
    stock: bool  # the release is the fork's own stock

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "ref": self.ref,
            "commit": self.commit,
            "tree": self.tree,
            "wheel": self.wheel,
            "sha256": self.sha256,
            "pinned": self.pinned,
            "stock": self.stock,
        }


def is_release_spec(text: str) -> bool:
    """``sglang==X`` or a path to a wheel (as opposed to ``stock`` or a fork revision)."""
    return text.startswith(SPEC_PREFIX) or text.endswith(".whl")


def _unknown(version: str) -> ReleaseError:
    return ReleaseError(
        f"sglang=={version} is not a pinned release",
        where="--onto",
        fix=f"pinned releases: {', '.join(sorted(PINS, key=version_key))}; for another one pass the "
        "path of its wheel (pip download --no-deps sglang==X)",
    )


def version_key(version: str) -> tuple:
    """Sort key for release versions (numeric parts numerically)."""
    return tuple(int(part) if part.isdigit() else part for part in version.replace("rc", ".rc.").split("."))


def _wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(distribution name, version, member names) of a wheel; a clear error if it is not a wheel."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            metadata = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(metadata) != 1:
                raise ReleaseError(
                    f"{path.name} has no single *.dist-info/METADATA, so it is not a wheel",
                    where=str(path),
                    fix="pass an SGLang wheel (.whl) from the package index",
                )
            fields = email.parser.BytesHeaderParser().parsebytes(wheel.read(metadata[0]))
    except (zipfile.BadZipFile, OSError) as err:
        raise ReleaseError(
            f"{path.name} is not a readable wheel ({err})",
            where=str(path),
            fix="pass an SGLang wheel (.whl); download it again if it is damaged",
        ) from None
    return (fields.get("Name") or "").strip(), (fields.get("Version") or "").strip(), names


@dataclass(frozen=True)
class _Wheel:
    path: Path
    version: str
    sha256: str
    pin: ReleasePin | None


def locate_wheel(spec: str) -> _Wheel:
    """The checked wheel of ``sglang==X`` (cache, else downloaded) or of a wheel path; nothing is written."""
    if spec.startswith(SPEC_PREFIX):
        version = spec[len(SPEC_PREFIX) :].strip()
        if version not in PINS:
            raise _unknown(version)
        path = stock.download_wheel(version, PINS[version].wheel)
    else:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise ReleaseError(
                f"no wheel at {path}", where="--onto", fix="pass sglang==X or the path of an SGLang wheel"
            )
    name, version, names = _wheel_metadata(path)
    if name.lower().replace("_", "-") != "sglang":
        raise ReleaseError(
            f"{path.name} is the wheel of {name or 'an unnamed package'!r}, not of SGLang",
            where=str(path),
            fix="pass an SGLang wheel (pip download --no-deps sglang==X)",
        )
    if spec.startswith(SPEC_PREFIX) and version != spec[len(SPEC_PREFIX) :].strip():
        raise ReleaseError(
            f"{path.name} holds SGLang {version}, not {spec}",
            where=str(path),
            fix="delete it from the wheel cache; it is downloaded again",
        )
    pin = PINS.get(version)
    digest = stock.sha256_file(path)
    if pin is not None and digest != pin.sha256:
        raise ReleaseError(
            f"{path.name} has sha256 {digest}, not the pinned {pin.sha256} of SGLang {version}",
            where=str(path),
            fix=f"delete it and pass sglang=={version} (it is downloaded again), or the real {pin.wheel}",
        )
    if not any(n.startswith(LAYOUT) for n in names):
        raise ReleaseError(
            f"SGLang {version}'s wheel has no {LAYOUT} package, the layout every entry's paths assume",
            where=str(path),
            fix="this release's package layout differs: its entries must be recorded against it, not ported",
        )
    return _Wheel(path, version, digest, pin)


def release_message(wheel: _Wheel) -> str:
    if wheel.pin is not None and wheel.version == stock.SGLANG_VERSION:
        return stock.STOCK_MESSAGE  # the same commit as stock, also in a user's fork that imports it
    origin = "PyPI" if wheel.pin else "a wheel"
    return f"release: SGLang {wheel.version} from {origin} ({wheel.path.name}, sha256 {wheel.sha256})\n"


def release_ref(version: str) -> str:
    return RELEASE_REF_PREFIX + version


def known_release(fork: Fork, version: str) -> ReleaseBase | None:
    """The release's base if the fork already holds its pinned import (no wheel needed)."""
    pin = PINS.get(version)
    if pin is None:
        return None
    if fork.pinned and version == stock.SGLANG_VERSION:
        return ReleaseBase(
            version, "refs/heads/stock", fork.stock_commit, fork.stock_tree, pin.wheel, pin.sha256, True, True
        )
    commit = fork.repo.rev_parse(release_ref(version))
    if commit != pin.commit:
        return None
    return ReleaseBase(version, release_ref(version), commit, pin.tree, pin.wheel, pin.sha256, True, False)


_IMPORT_MESSAGE = re.compile(r"^release: SGLang \S+ from \S+ \((?P<wheel>[^,]+), sha256 (?P<sha256>[0-9a-f]{64})\)")


def available_release(fork: Fork, version: str) -> ReleaseBase | None:
    """SGLang ``version`` as a base: a pinned release imported as ``import_release`` does (from the wheel cache,
    else downloaded), another one from the branch an earlier import of its wheel left (None without one).
    The caller holds the fork's lock."""
    if version in PINS:
        return import_release(fork, SPEC_PREFIX + version)
    ref = release_ref(version)
    commit = fork.repo.rev_parse(ref)
    if commit is None:
        return None
    found = _IMPORT_MESSAGE.match(fork.repo.out("log", "-1", "--format=%B", commit))
    return ReleaseBase(
        version,
        ref,
        commit,
        fork.repo.rev_parse(f"{commit}^{{tree}}"),
        found["wheel"] if found else "",
        found["sha256"] if found else "",
        False,
        False,
    )


def import_release(fork: Fork, spec: str, progress: Callable[[int, int], None] | None = None) -> ReleaseBase:
    """The release named by ``spec`` as a base in ``fork``, imported as ``release/<version>`` when not there yet.

    The caller holds the fork's lock. Every check (release known, wheel hash, SGLang, layout, the pins of the
    import) passes before the branch is written; a failed import leaves the refs as they were.
    """
    if spec.startswith(SPEC_PREFIX):
        version = spec[len(SPEC_PREFIX) :].strip()
        if version not in PINS:
            raise _unknown(version)
        found = known_release(fork, version)
        if found is not None:
            return found
    wheel = locate_wheel(spec)
    found = known_release(fork, wheel.version)
    if found is not None:
        return found
    ref = release_ref(wheel.version)
    existing = fork.repo.rev_parse(ref)
    fork.repo.fast_import(stock.import_stream(wheel.path, progress, release_message(wheel), SCRATCH_REF))
    commit = fork.repo.rev_parse(SCRATCH_REF)
    tree = fork.repo.rev_parse(f"{SCRATCH_REF}^{{tree}}")
    fork.repo.update_refs({SCRATCH_REF: (commit, None)}, "specpilot: drop the release import scratch ref")
    if wheel.pin is not None and (tree, commit) != (wheel.pin.tree, wheel.pin.commit):
        raise ForkError(
            f"the import of SGLang {wheel.version} gave tree {tree} / commit {commit}, not the pinned "
            f"{wheel.pin.tree} / {wheel.pin.commit}",
            where=str(wheel.path),
            fix="the import is no longer deterministic (different wheel, git or code): report it; nothing was kept",
        )
    if existing is not None and existing != commit:
        raise ForkError(
            f"the fork's {ref} holds another import of SGLang {wheel.version} ({existing[:12]})",
            where=f"{fork.repo.path} ({ref})",
            fix=f"delete it (git -C {fork.repo.path} update-ref -d {ref}) to import this wheel instead",
        )
    if existing != commit:
        fork.repo.update_refs({ref: (existing, commit)}, f"specpilot: SGLang {wheel.version} beside stock")
    return ReleaseBase(wheel.version, ref, commit, tree, wheel.path.name, wheel.sha256, wheel.pin is not None, False)


def release_of(spec: str) -> str:
    """The version a ``sglang==X`` spec names (for messages before anything is imported)."""
    return spec[len(SPEC_PREFIX) :].strip() if spec.startswith(SPEC_PREFIX) else os.path.basename(spec)
