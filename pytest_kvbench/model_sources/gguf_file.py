"""A GGUF file read from its header: architecture, quantization, length, and whether it is whole.

A GGUF file (llama.cpp's format) can only be loaded through transformers after the ``gguf`` and
``accelerate`` packages are installed and only for the architectures transformers maps; a broken
download is truncated. All of that is found here from the header and the package metadata, so a
bad file is one line at configure time instead of a traceback in every item. Only the ``gguf``
package (numpy) is imported; transformers' list of GGUF architectures is read from its source.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from pytest_kvbench.user_paths import read_prefix

GGUF_SUFFIX = ".gguf"
MIN_GGUF_BYTES = 24  # magic, version, tensor count and metadata count: the smallest header there is
REQUIRED_PACKAGES = ("gguf", "accelerate")  # transformers' GGUF loader needs both
INSTALL_HINT = "pip install 'pytest-kvbench[gguf]'"
# transformers' table of GGUF metadata per architecture; its other top-level keys are not architectures
_MAPPING_FILE, _MAPPING_NAME, _NOT_ARCHITECTURES = "transformers/integrations/ggml.py", "GGUF_CONFIG_MAPPING", {
    "general", "tokenizer"}


class GgufError(ValueError):
    """A GGUF file that cannot be used; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class GgufInfo:
    """What a record says of a GGUF model: which file, which bytes, how it was quantized."""

    file: str  # the file name
    sha256: str
    size_bytes: int
    architecture: str  # general.architecture: llama, qwen2, ...
    quantization: str  # Q4_1, Q8_0, F16, ... (general.file_type, else the most common weight type)
    model_name: str | None  # general.name
    context_length: int | None  # <architecture>.context_length
    parameters: int | None = None  # the tensors' elements: the float conversion's size (float_bytes)

    def as_record(self) -> dict:
        return asdict(self)


def gguf_label(file: str, quantization: str) -> str:
    """``SmolLM2-135M-Instruct (GGUF Q4_1)``: the file's stem without its quantization suffix (after ``.``, ``-``
    or ``_``: ``gemma-3-270m-q4_k_m.gguf`` is ``gemma-3-270m (GGUF Q4_K_M)``)."""
    stem = file[: -len(GGUF_SUFFIX)] if file.lower().endswith(GGUF_SUFFIX) else file
    if any(stem.lower().endswith(separator + quantization.lower()) for separator in ".-_"):
        stem = stem[: -len(quantization) - 1]
    return f"{stem} (GGUF {quantization})"


def looks_like_gguf(reference: str) -> bool:
    return reference.strip().lower().endswith(GGUF_SUFFIX)


def missing_packages() -> list[str]:
    """The packages transformers needs for GGUF files that cannot be imported here."""
    missing = []
    for name in REQUIRED_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def file_digest(path: Path, digest) -> str:
    """The hex digest of a whole file, read in 4 MiB chunks; ``digest`` is a fresh hashlib/xxhash object."""
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    return file_digest(path, hashlib.sha256())


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _quantization(reader) -> str:
    # lazy for startup time: gguf imports numpy; only when a GGUF file is read
    from gguf import GGMLQuantizationType, LlamaFileType

    file_type = _field(reader, "general.file_type")
    try:
        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        weights = Counter(t.tensor_type for t in reader.tensors if len(t.shape) > 1)
        return GGMLQuantizationType(weights.most_common(1)[0][0]).name if weights else "unknown"


def undequantizable_types(reader) -> dict[str, list[str]]:
    """The file's tensor types that the installed ``gguf`` cannot dequantize (transformers' GGUF loader calls its
    ``dequantize`` on every tensor), each with the tensors of that type; asked of ``gguf`` itself on one zero block,
    so a newer gguf that learns a type is believed."""
    # lazy for startup time: gguf and numpy; only when a GGUF file is read
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    by_type: dict[int, list[str]] = {}
    for tensor in reader.tensors:
        by_type.setdefault(int(tensor.tensor_type), []).append(tensor.name)
    refused = {}
    for code, names in by_type.items():
        qtype = GGMLQuantizationType(code)
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
        except Exception:  # noqa: BLE001 - NotImplementedError for an unknown type; anything else is as fatal
            refused[qtype.name] = names
    return refused


def check_tensor_types(reader, path: Path) -> None:
    """GgufError naming the first tensor type the loader cannot dequantize, its tensors and the fix."""
    refused = undequantizable_types(reader)
    if refused:
        version = importlib.metadata.version("gguf")
        name, tensors = next(iter(sorted(refused.items())))
        others = f" (also {', '.join(sorted(refused)[1:])})" if len(refused) > 1 else ""
        raise GgufError(f"{path}: GGUF tensor type {name}{others} cannot be dequantized by gguf {version}, which "
                        f"transformers' GGUF loader uses ({len(tensors)} tensors, e.g. {tensors[0]}); use a file "
                        f"of other quantization types (Q4_K, Q5_0, Q6_K, Q8_0, F16, ...) or a newer gguf")


def read_info(path: Path, sha256: str) -> GgufInfo:
    """The file's header, checked whole (every tensor's bytes lie inside the file) and loadable (every tensor type
    can be dequantized)."""
    # lazy for startup time: gguf imports numpy
    from gguf import GGUFReader

    fix = "download or copy it again"
    if read_prefix(path, 4, "model file") != b"GGUF":  # bounded: GGUFReader maps the file without a timeout
        raise GgufError(f"{path}: not a readable GGUF file (no GGUF magic at its start); {fix}")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 - gguf raises ValueError, KeyError, IndexError ... on a bad file
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GgufError(f"{path}: not a readable GGUF file, truncated or corrupt ({text}); {fix}") from None
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise GgufError(f"{path}: truncated GGUF file ({size} bytes, its tensors need {end}); {fix}")
    check_tensor_types(reader, path)
    architecture = str(_field(reader, "general.architecture") or "")
    if not architecture:
        raise GgufError(f"{path}: GGUF file without general.architecture; {fix}")
    _check_heads(reader, architecture, path)
    context = _field(reader, f"{architecture}.context_length")
    name = _field(reader, "general.name")
    return GgufInfo(file=path.name, sha256=sha256, size_bytes=size, architecture=architecture,
                    quantization=_quantization(reader), model_name=str(name) if name is not None else None,
                    context_length=int(context) if isinstance(context, int) and context > 0 else None,
                    parameters=sum(int(t.n_elements) for t in reader.tensors))


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_heads(reader, architecture: str, path: Path) -> None:
    """The attention shapes the header states can be built: without ``attention.key_length`` a head is
    ``embedding_length / head_count`` wide, and the query heads are a whole number of KV heads' groups
    (transformers' config takes any value, then every forward fails on a reshape)."""
    hidden = _positive_int(_field(reader, f"{architecture}.embedding_length"))
    heads = _positive_int(_field(reader, f"{architecture}.attention.head_count"))
    kv_heads = _positive_int(_field(reader, f"{architecture}.attention.head_count_kv"))
    key_length = _positive_int(_field(reader, f"{architecture}.attention.key_length"))
    if hidden and heads and key_length is None and hidden % heads:
        raise GgufError(f"{path}: GGUF header says {architecture}.embedding_length {hidden}, which is not a multiple "
                        f"of its {heads} attention heads (and no attention.key_length): the model cannot be built; "
                        f"use a GGUF written by llama.cpp's converter")
    if heads and kv_heads and heads % kv_heads:
        raise GgufError(f"{path}: GGUF header says {heads} attention heads and {kv_heads} KV heads, which do not "
                        f"divide them: the model cannot be built; use a GGUF written by llama.cpp's converter")


FLOAT_BYTES = 4  # the conversion dequantizes to float32 (engine/gguf_conversion.py)
CONVERSION_EXTRA_BYTES = 64 * 2**20  # tokenizer, config and the manifest beside the weights


def float_bytes(info: GgufInfo) -> int:
    """About what the float conversion of the file takes on disk: every weight in float32, plus its tokenizer."""
    parameters = info.parameters if info.parameters is not None else info.size_bytes * 2  # at most ~2 weights a byte
    return parameters * FLOAT_BYTES + CONVERSION_EXTRA_BYTES


@functools.lru_cache(maxsize=1)
def transformers_architectures() -> frozenset[str] | None:
    """The GGUF architectures the installed transformers maps, read from its source (no import);
    None when that table is not where this version expects it (the load then says it)."""
    try:
        source = Path(importlib.metadata.distribution("transformers").locate_file(_MAPPING_FILE))
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (importlib.metadata.PackageNotFoundError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == _MAPPING_NAME for t in node.targets)):
            keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            return frozenset(keys - _NOT_ARCHITECTURES)
    return None


# Architectures transformers maps that the benchmark still cannot run, and why: checked before the table above
NOT_BENCHMARKABLE = {
    "mamba": "a state-space model: it keeps no key/value cache, so there is nothing for a KV-cache method to "
             "compress",
    "mamba2": "a state-space model: it keeps no key/value cache, so there is nothing for a KV-cache method to "
              "compress",
    "t5": "an encoder-decoder model: the benchmark runs decoder-only causal LMs (AutoModelForCausalLM)",
    "umt5": "an encoder-decoder model: the benchmark runs decoder-only causal LMs (AutoModelForCausalLM)",
}


def model_types(info: GgufInfo) -> set[str]:
    """The transformers names the file's architecture may stand for (``qwen2moe`` is ``qwen2_moe``,
    ``t5encoder`` is t5)."""
    arch = info.architecture.lower().replace("-", "_")
    return {arch, arch.replace("moe", "_moe"), "t5" if "t5" in arch else arch}


def check_architecture(info: GgufInfo, path: Path) -> None:
    """transformers can map the file's architecture, and it is a model the benchmark can run at all."""
    candidates = model_types(info)
    refused = next((NOT_BENCHMARKABLE[name] for name in sorted(candidates) if name in NOT_BENCHMARKABLE), None)
    if refused is not None:
        raise GgufError(f"{path}: GGUF architecture {info.architecture!r} cannot be benchmarked: it is {refused}; "
                        f"use a GGUF of a decoder-only transformer (llama, mistral, qwen2, qwen3, ...)")
    known = transformers_architectures()
    if known is None:
        return
    if not candidates & known:
        version = importlib.metadata.version("transformers")
        raise GgufError(f"{path}: GGUF architecture {info.architecture!r} cannot be loaded by transformers {version} "
                        f"(it loads {', '.join(sorted(known))}); use a GGUF of one of those, or the model's "
                        f"Hugging Face folder")


def check_family(info: GgufInfo, path: Path, compressing: list[str], families: tuple[str, ...]) -> None:
    """The grid's compressing methods (``compressing``: their names) can hook the file's architecture
    (``families``: kvmethods' verified families); ``full`` alone runs any causal LM."""
    if compressing and not model_types(info) & set(families):
        shown = ", ".join(compressing[:4]) + (", ..." if len(compressing) > 4 else "")
        raise GgufError(f"{path}: GGUF architecture {info.architecture!r} cannot be compressed by {shown}: "
                        f"kvmethods compresses {', '.join(families)} models only; run method full alone, or "
                        f"use a GGUF of one of those families")
