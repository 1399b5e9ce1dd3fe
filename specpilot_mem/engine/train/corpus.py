"""The training corpus: the Python standard library's own sources, pinned by a manifest.

Every machine with Python has the standard library, so nothing is downloaded. The manifest
(``models/corpus-manifest.json``) lists each file by its path relative to the stdlib folder with its
sha256 and its split; files are split train/dev/unseen by a hash of the path, so the split never
depends on which files a machine has. On another Python version a file whose bytes differ from the
pinned hash is skipped (and counted), so every machine builds the same corpus or a subset of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

SPLITS = ("train", "dev", "unseen")
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>"]


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str) -> str:
    """Deterministic split by file: 5% unseen, 5% dev, the rest train."""
    bucket = int(hashlib.sha256(rel_path.encode()).hexdigest()[:8], 16) % 20
    return "unseen" if bucket == 0 else "dev" if bucket == 1 else "train"


def scan_stdlib(root: Path | None = None) -> list[dict]:
    """Every .py file under the stdlib (site-packages excluded), sorted, with its sha256 and split."""
    root = root or stdlib_dir()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("site-packages/") or "/__pycache__/" in rel:
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a few test files are deliberately not UTF-8
        files.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "split": split_of(rel)})
    return files


def read_pinned(manifest: list[dict], root: Path | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """Texts per split of the manifest's files whose bytes match their pinned hash; and the skipped paths."""
    root = root or stdlib_dir()
    texts: dict[str, list[str]] = {s: [] for s in SPLITS}
    skipped = []
    for entry in manifest:
        path = root / entry["path"]
        data = path.read_bytes() if path.exists() else None
        if data is None or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            skipped.append(entry["path"])
            continue
        texts[entry["split"]].append(data.decode("utf-8"))
    return texts, skipped


def train_tokenizer(train_texts: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE on the train split (deterministic for a given input order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(train_texts, trainer=trainer)
    return tok


def encode_splits(tokenizer, texts: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """One uint16 token stream per split, files separated by <|endoftext|>."""
    eot = tokenizer.token_to_id(SPECIAL_TOKENS[0])
    out = {}
    for split, docs in texts.items():
        ids: list[int] = []
        for enc in tokenizer.encode_batch(docs):
            ids.extend(enc.ids)
            ids.append(eot)
        out[split] = np.asarray(ids, dtype=np.uint16)
    return out


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=1)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def prepare(model_dir: Path, tokens_path: Path, rescan: bool = False) -> dict:
    """Build (or reuse) the manifest and tokenizer in ``model_dir`` and write the token streams.

    ``rescan`` pins a fresh manifest from this machine's stdlib (done once, when the pair was made).
    Returns a summary: files and tokens per split, skipped files.
    """
    manifest_path = model_dir / "corpus-manifest.json"
    tokenizer_path = model_dir / "tokenizer.json"
    if rescan or not manifest_path.exists():
        import sys

        manifest = {"python": sys.version.split()[0], "files": scan_stdlib()}
        write_json(manifest_path, manifest)
    manifest = json.loads(manifest_path.read_text())
    texts, skipped = read_pinned(manifest["files"])
    if rescan or not tokenizer_path.exists():
        train_tokenizer(texts["train"]).save(str(tokenizer_path))
    tokenizer = load_tokenizer(model_dir)
    streams = encode_splits(tokenizer, texts)
    tokens_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(tokens_path, **streams)
    return {
        "manifest_python": manifest["python"],
        "files": {s: len(texts[s]) for s in SPLITS},
        "tokens": {s: int(streams[s].size) for s in SPLITS},
        "skipped_files": len(skipped),
    }


def file_prompts(stream: np.ndarray, count: int, length: int, eot_id: int = 0) -> list[list[int]]:
    """The first ``length`` tokens of the first ``count`` files (of at least ``length`` tokens) of a
    split's stream: prompts that start where a real file starts."""
    starts = np.concatenate([[0], np.flatnonzero(stream == eot_id) + 1])
    prompts = []
    for a, b in zip(starts[:-1], starts[1:]):
        if b - a > length and len(prompts) < count:
            prompts.append(stream[a : a + length].astype(np.int64).tolist())
    return prompts


def load_tokenizer(model_dir: Path):
    """The committed BPE tokenizer (``tokenizers``; not imported by the engine itself, which works on ids)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
