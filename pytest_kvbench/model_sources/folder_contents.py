"""Whether a Hugging Face model folder holds what ``from_pretrained`` loads: weights and a tokenizer.

A folder with a ``config.json`` but no weights (a partial download, a copy of the config only)
used to pass the startup check and then fail every item, one model load at a time. The file
names are transformers' own (``SAFE_WEIGHTS_NAME``, ``WEIGHTS_NAME`` and their ``.index.json``
for sharded checkpoints, whose shards must all be there, inside the folder) and the vocabulary files its
tokenizers read; the folder is listed, and its safetensors files' headers say whether every tensor's bytes are
there (a truncated copy); nothing is loaded or imported.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath

from pytest_kvbench.model_sources.safetensors_header import missing_bytes

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# tokenizer.json (fast tokenizers); sentencepiece, BPE, WordPiece and tiktoken vocabularies (the others)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt", "tekken.json")


def _not_whole(folder: Path, names: list[str]) -> str | None:
    """The first safetensors file among ``names`` whose tensors' bytes are not all there, and why."""
    for name in names:
        if name.endswith(".safetensors"):
            problem = missing_bytes(folder / name)
            if problem is not None:
                return f"{name} is {problem}; download or copy it again"
    return None


def _outside(shard: str) -> bool:
    """A shard name that leaves the folder: absolute, or with a ``..`` part (a hub snapshot's links to its blobs
    are fine: the name in the index is what must stay inside)."""
    path = PurePosixPath(shard.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts or bool(PureWindowsPath(shard).drive)


def _weights_problem(folder: Path) -> str | None:
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if present:
        return _not_whole(folder, present)
    for index in WEIGHT_INDEXES:
        if not (folder / index).is_file():
            continue
        try:
            shards = sorted({str(shard) for shard in json.loads(
                (folder / index).read_text(encoding="utf-8"))["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{index} cannot be read (no 'weight_map')"
        outside = [shard for shard in shards if _outside(shard)]
        if outside:
            return f"{index} names a shard outside the model folder ({outside[0]}); shards are files in the folder"
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            return f"{len(missing)} of the {len(shards)} shards {index} names are missing ({missing[0]}, ...)"
        return _not_whole(folder, shards)
    return f"no weights ({', '.join(WEIGHT_FILES + WEIGHT_INDEXES)})"


def _tokenizer_problem(folder: Path) -> str | None:
    if any((folder / name).is_file() for name in TOKENIZER_FILES) or any(folder.glob("*.tiktoken")):
        return None
    return f"no tokenizer ({', '.join(TOKENIZER_FILES)} or *.tiktoken)"


def missing_parts(folder: Path) -> list[str]:
    """What of a loadable model the folder lacks, one phrase each (empty: weights and tokenizer are there)."""
    return [problem for problem in (_weights_problem(folder), _tokenizer_problem(folder)) if problem]
