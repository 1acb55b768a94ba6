"""The columns of the three tables that ``kvbench query`` and ``kvbench export --format parquet`` show.

Questions across runs ("snapkv's score at m0.125 on every commit since October") are SQL over one row per run,
one per item and one per sample; Parquet files of the same tables feed pandas, polars and ``datasets``. The
schema is written once, here: its Arrow types make the DuckDB views and the Parquet files, its descriptions
make docs/query.md's column lists (tests/cli/test_cli_query.py keeps the page in step).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


def _columns(*rows: tuple[str, pa.DataType, str]) -> tuple[Column, ...]:
    return tuple(Column(*row) for row in rows)


TEXT, INT, FLOAT, FLAG = pa.string(), pa.int64(), pa.float64(), pa.bool_()
TIME = pa.timestamp("us", tz="UTC")

RUNS = _columns(
    ("run_id", TEXT, "the run's id, `bench_<8 hex>_<YYYYmmdd_HHMMSS>`"),
    ("start", TIME, "when the run started (UTC)"),
    ("end", TIME, "when it ended; null for a run killed or still running"),
    ("duration_s", FLOAT, "seconds from start to end"),
    ("commit", TEXT, "git commit of the checkout that ran it"),
    ("dirty", FLAG, "the checkout had uncommitted changes"),
    ("command", TEXT, "the command line that made the run"),
    ("versions", TEXT, "JSON object of the main package versions (`versions->>'torch'`)"),
    ("device", TEXT, "what the items ran on: GPU name and driver, or CPU model and threads"),
    ("state", TEXT, "complete, incomplete (stopped or crashed before every item finished), started (no item "
                    "finished), damaged (records recovered from a damaged file) or unreadable (nothing recovered)"),
    ("state_detail", TEXT, "the state in one line, as `kvbench list` prints it (what is unfinished, what is damaged)"),
    ("items", INT, "records the run holds (the newest per item)"),
    ("unfinished", INT, "selected items with no record, or whose newest record is a crash"),
    ("path", TEXT, "the run directory"),
)

ITEMS = _columns(
    ("run_id", TEXT, "the run (joins `runs.run_id`)"),
    ("key", TEXT, "the item's key `model|method|budget|task[@ctx]|seedN[|protocol=P]`: the same item in every run"),
    ("item_id", TEXT, "the pytest id, for people"),
    ("status", TEXT, "passed, failed, skipped or error"),
    ("message", TEXT, "why it failed, errored or was skipped"),
    ("crashed", FLAG, "the error record of an item whose xdist worker died"),
    ("model", TEXT, "the model as the grid named it"),
    ("method", TEXT, "the method's name"),
    ("params", TEXT, "JSON object of the method's parameters, defaults included (`params->>'window'`)"),
    ("budget", TEXT, "the budget as given: `128`, `r0.5`, `m0.125`, `full`"),
    ("budget_kind", TEXT, "tokens, ratio, memory or none (full)"),
    ("budget_value", FLOAT, "the budget's number: tokens, fraction removed, or fraction of the bytes kept"),
    ("protocol", TEXT, "how the cache met the prompt (question_in_window, query_agnostic, ...)"),
    ("task", TEXT, "the task's name"),
    ("suite", TEXT, "longbench, ruler, longbench_v2, infinitebench, reasoning or scbench"),
    ("context_length", INT, "RULER's context length; null elsewhere"),
    ("seed", INT, "the sampling seed"),
    ("metric", TEXT, "the task's metric"),
    ("score", FLOAT, "the task's score x 100"),
    ("score_low", FLOAT, "low end of the score's 95% bootstrap interval over the item's samples (x 100)"),
    ("score_high", FLOAT, "high end of that interval; both null with fewer than two scored samples"),
    ("n_samples", INT, "samples scored"),
    ("kl", FLOAT, "mean KL divergence from the full cache's next-token distributions (nats)"),
    ("agreement", FLOAT, "mean greedy agreement with the full cache"),
    ("decode_kl", FLOAT, "mean KL along the item's own greedy decode, up to its first token off the reference"),
    ("prefill_ms", FLOAT, "mean prefill time per sample (ms)"),
    ("decode_tokens_per_s", FLOAT, "decoded tokens per second"),
    ("decode_tokens_per_s_alone", FLOAT, "the same over samples decoded alone (batch 1): the method's own speed"),
    ("total_s", FLOAT, "the item's wall time (s)"),
    ("peak_bytes", INT, "peak memory while the item ran"),
    ("memory_kind", TEXT, "what peak_bytes measured: cuda_allocated, cpu_rss, ..."),
    ("peak_reserved_bytes", INT, "CUDA memory reserved at the peak"),
    ("kv_bytes_before", FLOAT, "mean KV-cache bytes of a prompt before compression"),
    ("kv_bytes_after", FLOAT, "mean KV-cache bytes kept after compression"),
    ("compression_ratio", FLOAT, "kv_bytes_after / kv_bytes_before"),
    ("energy_j", FLOAT, "energy the item used (J), where measured"),
    ("stops_eos", INT, "samples whose decode ended at an end-of-sequence token"),
    ("stops_max_new_tokens", INT, "samples whose decode ran to the generation limit"),
    ("device", TEXT, "the GPU or CPU model the item ran on"),
)

SAMPLES = _columns(
    ("run_id", TEXT, "the run (joins `runs.run_id`)"),
    ("key", TEXT, "the item (joins `items.run_id, items.key`)"),
    ("sample_id", TEXT, "the sample's stable id: the same sample in every run"),
    ("score", FLOAT, "the sample's score in [0, 1] (items.score is their mean x 100)"),
    ("prompt_tokens", INT, "prompt length in tokens"),
    ("kept_tokens", FLOAT, "KV tokens kept per layer and head after compression"),
    ("prefill_ms", FLOAT, "prefill time (ms)"),
    ("decode_ms", FLOAT, "decode time (ms)"),
    ("new_tokens", INT, "tokens generated"),
    ("kv_bytes_after", FLOAT, "KV-cache bytes kept"),
    ("kl", FLOAT, "KL divergence from the full cache (nats)"),
    ("agreement", FLOAT, "greedy agreement with the full cache"),
    ("decode_kl", FLOAT, "KL along the sample's own greedy decode"),
    ("stop", TEXT, "why the decode ended: eos or max_new_tokens"),
    ("prediction", TEXT, "the generated answer"),
)

TABLES: dict[str, tuple[Column, ...]] = {"runs": RUNS, "items": ITEMS, "samples": SAMPLES}


def schema(table: str) -> pa.Schema:
    """The Arrow schema of one table, each field's description in its metadata (Parquet keeps it)."""
    return pa.schema([pa.field(c.name, c.type, metadata={"description": c.doc}) for c in TABLES[table]])
