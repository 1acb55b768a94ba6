"""The built-in methods described as data: name, implementation, declared parameters, capabilities.

The plugin validates a grid at configure time and collects one item per case, and it is loaded in every
pytest run of its users: none of that may import torch. So the registry answers "which methods exist,
what parameters do they take, is this spec valid" from this table, and imports a method's module only
to build it (when an item runs, or when validating needs the method's own code: `checked_in_code`, a
cross-parameter check or a base method to build). tests/kvmethods/test_method_catalog.py compares every entry with
its class, so the table cannot drift from the implementations.

The spec vocabulary that the registry reads before any implementation (composition `+`, the
`per_turn` and `prefill_chunk` parameters any evicting method takes, the `kvpress:` prefix) and the
protocols that the grid checks are named here once; composition.py, per_turn.py, chunked.py and
generation.py take their names from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .capabilities import SCORER, Capability
from .params import ParamSpec

SEPARATOR = "+"  # snapkv+kivi: a composition (composition.py)
PER_TURN = "per_turn"  # snapkv:per_turn=true: re-compression after each turn (per_turn.py)
PREFILL_CHUNK = "prefill_chunk"  # snapkv:prefill_chunk=512: chunked prefill (chunked.py)
KVPRESS_PREFIX = "kvpress:"  # kvpress:SnapKVPress: a kvpress press (kvpress_adapter.py)
# How a prompt is compressed (generation.py); the group protocols serve several questions from one context.
PROTOCOLS = ("question_in_window", "query_agnostic", "shared_context", "multi_turn")
GROUP_PROTOCOLS = ("shared_context", "multi_turn")

@dataclass(frozen=True)
class MethodEntry:
    """One built-in method, described without importing it."""

    name: str
    target: str  # "module:Class", imported only to build the method
    params: tuple[ParamSpec, ...] = ()
    capabilities: Capability = SCORER  # the class takes them from here (declared_capabilities)
    checked_in_code: bool = False  # validation needs the class: a check() or from_params() of its own

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def class_name(self) -> str:
        return self.target.partition(":")[2]


def _entry(name: str, target: str, *params: ParamSpec, capabilities: Capability = SCORER,
           checked_in_code: bool = False) -> MethodEntry:
    return MethodEntry(name, "kvmethods." + target, params, capabilities, checked_in_code)


_SNAPKV_PARAMS = (
    ParamSpec("window", int, 32, "observation window: last prompt queries that vote, always kept", minimum=1),
    ParamSpec("kernel", int, 7, "pooling kernel size along positions (odd)", minimum=1, odd=True),
    ParamSpec("pooling", str, "avgpool", "pooling of the window's attention", choices=("avgpool", "maxpool", "none")),
)

BUILTINS: dict[str, MethodEntry] = {entry.name: entry for entry in (
    _entry("full", "core.full:Full", capabilities=Capability(0)),
    _entry("streamingllm", "scorers.streamingllm:StreamingLLM",
           ParamSpec("sinks", int, 4, "initial tokens always kept (attention sinks)", minimum=0),
           capabilities=Capability.COMPRESSES),
    _entry("h2o", "scorers.h2o:H2O",
           ParamSpec("recent_ratio", float, 0.5, "fraction of the budget given to the most recent tokens",
                     minimum=0.0, maximum=1.0),
           capabilities=SCORER | Capability.NEEDS_ALL_QUERIES),
    _entry("snapkv", "scorers.snapkv:SnapKV", *_SNAPKV_PARAMS),
    _entry("pyramidkv", "scorers.pyramidkv:PyramidKV", *_SNAPKV_PARAMS,
           ParamSpec("beta", float, 20.0, "ratio between the average and the top-layer budget (beyond the window)",
                     minimum=1.0)),
    _entry("tova", "scorers.tova:TOVA"),
    _entry("knorm", "scorers.knorm:KNorm"),
    _entry("random", "scorers.random:Random", ParamSpec("seed", int, 0, "seed of the per-layer generator", minimum=0)),
    _entry("adakv", "wrappers.adakv:AdaKV",
           ParamSpec("base", str, "snapkv", "scoring method whose scores the heads share (any method with score())"),
           ParamSpec("alpha", float, 0.2, "safeguard floor: each head keeps at least alpha x budget of its own top "
                                          "tokens", minimum=0.0),
           ParamSpec("across_layers", bool, False, "share the budget over all layers too (bases scoring the whole "
                                                   "prompt: kvzip; KVzipPress's default)"),
           capabilities=Capability.COMPRESSES | Capability.HEAD_ADAPTIVE | Capability.WRAPS, checked_in_code=True),
    _entry("criticalkv", "wrappers.criticalkv:CriticalKV",
           ParamSpec("base", str, "snapkv", "method whose scores are rescaled (any method with score())"),
           ParamSpec("epsilon", float, 1e-4, "added to the base score before rescaling", minimum=0.0),
           ParamSpec("first_stage_ratio", float, 0.5, "share of the budget chosen by the base score alone",
                     minimum=0.0),
           capabilities=SCORER | Capability.WRAPS, checked_in_code=True),
    _entry("expected_attention", "scorers.expected_attention:ExpectedAttention",
           ParamSpec("n_future_positions", int, 512, "future positions the RoPE rotation is averaged over", minimum=1),
           ParamSpec("n_sink", int, 4, "first tokens always kept and left out of the query statistics", minimum=0),
           ParamSpec("use_covariance", bool, True, "include the queries' covariance term"),
           ParamSpec("use_vnorm", bool, True, "multiply scores by the value norm"),
           ParamSpec("epsilon", float, 0.0, "added to the scores before the value-norm rescaling", minimum=0.0),
           capabilities=SCORER | Capability.PRE_ROPE_QUERIES),
    _entry("kvzip", "scorers.kvzip:KVzip",
           ParamSpec("chunk_size", int, 2048, "context tokens reconstructed per repeat forward", minimum=1),
           ParamSpec("n_sink", int, 4, "first tokens always kept (and in every chunk's softmax)", minimum=0),
           capabilities=Capability.COMPRESSES | Capability.SCORES_WHOLE_PROMPT),
    _entry("kivi", "storage.kivi:KIVI",
           ParamSpec("bits", int, 2, "bits per key and value (2 or 4)"),
           ParamSpec("group_size", int, 32, "values per quantization group (tokens for keys, channels for values)",
                     minimum=1),
           ParamSpec("residual", int, 32, "recent tokens kept in full precision; a multiple of group_size", minimum=1),
           capabilities=Capability.OWN_STORAGE | Capability.TAKES_CHANNELS, checked_in_code=True),
    _entry("hf_quantized", "storage.hf_quantized:HFQuantized",
           ParamSpec("backend", str, "quanto", "transformers' quantized cache backend", choices=("quanto", "hqq")),
           ParamSpec("bits", int, 4, "bits per key and value (quanto: 2 or 4; hqq: 1, 2, 3, 4 or 8)"),
           ParamSpec("group_size", int, 64, "values per quantization group", minimum=1),
           ParamSpec("residual", int, 128, "tokens gathered in full precision before the cache is re-quantized",
                     minimum=1),
           capabilities=Capability.OWN_STORAGE, checked_in_code=True),
    _entry("think", "storage.think:ThinK",
           ParamSpec("pruning_ratio", float, 0.4, "fraction of key channels pruned per KV head (reference: 0.4)"),
           ParamSpec("window", int, 32, "observation window: the last prompt queries that score the channels",
                     minimum=1),
           ParamSpec("recent", int, 32, "last prompt tokens whose keys keep every channel (reference: 32)", minimum=0),
           capabilities=Capability.OWN_STORAGE | Capability.PRUNES_CHANNELS | Capability.READS_LAST_QUERIES,
           checked_in_code=True),
    _entry("decoding", "decoding.decoding_compression:DecodingCompression",
           ParamSpec("base", str, "snapkv", "prefill-time scorer that also cuts the cache back while decoding"),
           ParamSpec("interval", int, 128, "new tokens between two compressions while decoding (R-KV's buffer)",
                     minimum=1),
           capabilities=SCORER | Capability.COMPRESSES_WHILE_DECODING | Capability.WRAPS, checked_in_code=True),
    _entry("rkv", "decoding.rkv:RKV",
           ParamSpec("window", int, 8, "recent queries that vote (and are always kept)", minimum=1),
           ParamSpec("kernel", int, 7, "max-pooling kernel along positions", minimum=1),
           ParamSpec("mix_lambda", float, 0.07, "weight of importance against redundancy", minimum=0.0),
           ParamSpec("threshold", float, 0.5, "cosine similarity above which two keys are near-copies"),
           ParamSpec("interval", int, 128, "new tokens between two compressions while decoding", minimum=1),
           capabilities=SCORER | Capability.COMPRESSES_WHILE_DECODING, checked_in_code=True),
)}


def declared_capabilities(name: str) -> Capability:
    """A built-in's capabilities, as its class declares them (`capabilities = declared_capabilities(name)`)."""
    return BUILTINS[name].capabilities
