"""llama.cpp behind the ServingBackend interface: its server in a child process (engine_process.py), fed token ids.

A completion request carries the prompt as token ids (the engine adds no BOS and re-tokenizes nothing), asks for
greedy decoding (temperature 0), the task's max_new_tokens, the top-n log-probs of each step (`n_probs`) and no
prompt cache between requests (every sample's prefill is timed whole). llama.cpp stops at its own end-of-generation
tokens; the answer is cut at the benchmark's first stop token as well, so both stop rules agree. Its timings
(`prompt_ms`, `predicted_per_token_ms`) are the engine's time to first token and per output token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from pytest_kvbench.serving.backend import CacheReport, Completion, EngineDied, EngineSettings, EngineStartError
from pytest_kvbench.serving.llamacpp.kv_report import cache_report

ENGINE_NAME = "llama.cpp"
LOG_TAIL = 600  # characters of the engine's log quoted when it fails


def completion_request(prompt_ids: Sequence[int], max_new_tokens: int, top_n: int) -> dict:
    """The request llama.cpp's server takes: token ids, greedy, no prompt cache, top-n log-probs per step."""
    return {"prompt": [int(token) for token in prompt_ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
            "top_k": 1, "cache_prompt": False, "n_probs": int(max(top_n, 1)), "ignore_eos": False}


def completion_of(response: dict, prompt_tokens: int, stop_ids: Sequence[int], wall_s: float) -> Completion:
    """The Completion of a server response; EngineDied when it is an error."""
    if "error" in response or not response.get("choices"):
        raise EngineDied(f"llama.cpp answered with an error: {json.dumps(response.get('error', response))[:300]}")
    choice = response["choices"][0]
    steps = ((choice.get("logprobs") or {}).get("content")) or []
    tokens = [int(step["id"]) for step in steps]
    stop_token = None
    stops = set(stop_ids)
    cut = next((i for i, token in enumerate(tokens) if token in stops), None)
    if cut is not None:
        stop_token, tokens, steps = tokens[cut], tokens[:cut], steps[:cut]
    elif choice.get("finish_reason") == "stop":  # one of llama.cpp's end-of-generation tokens, not in the output
        stop_token = -1
    timings = response.get("timings") or {}
    decoded = int(timings.get("predicted_n") or 0)
    usage = response.get("usage") or {}
    return Completion(
        tokens=tokens, stop_token=stop_token,
        top_logprobs=[{int(top["id"]): float(top["logprob"]) for top in step.get("top_logprobs") or ()}
                      for step in steps],
        prompt_tokens=int(usage.get("prompt_tokens", prompt_tokens)),  # as the engine counted them (no BOS added)
        ttft_ms=float(timings.get("prompt_ms") or 0.0),
        tpot_ms=float(timings["predicted_per_token_ms"]) if decoded > 1 else None,
        decode_ms=float(timings.get("predicted_ms") or 0.0), wall_s=wall_s, engine=dict(timings))


class LlamaCppBackend:
    """One llama.cpp engine (a child process) with fixed settings, answering prompts until closed."""

    name = ENGINE_NAME

    def __init__(self, settings: EngineSettings, start_timeout_s: float = 600.0) -> None:
        self.settings = settings
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._report: CacheReport | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace") if self._log_path else ""
        except OSError:
            return ""

    def _failure(self, what: str) -> str:
        code = self._process.poll() if self._process else None
        tail = " ".join(self.log()[-LOG_TAIL:].split())
        return f"{what} (exit status {code}); the end of its log: {tail or '(empty)'}"

    def start(self) -> None:
        handle, name = tempfile.mkstemp(prefix="kvbench-llamacpp-", suffix=".log")
        self._log_path = Path(name)
        with os.fdopen(handle, "w") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "pytest_kvbench.serving.llamacpp.engine_process", json.dumps(asdict(self.settings))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        if self._answer() is None:
            message = self._failure(f"llama.cpp did not start on {self.settings.model_file}")
            self.close()
            raise EngineStartError(message)

    def _answer(self) -> dict | None:
        """The engine's next JSON line; None when it ended instead."""
        line = self._process.stdout.readline() if self._process and self._process.stdout else ""
        return json.loads(line) if line.strip() else None

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int],
                 top_n: int) -> Completion:
        if not self.alive:
            raise EngineDied(self._failure("the llama.cpp engine is not running"))
        started = time.perf_counter()
        try:
            self._process.stdin.write(json.dumps(completion_request(prompt_ids, max_new_tokens, top_n)) + "\n")
            self._process.stdin.flush()
            answer = self._answer()
        except (OSError, ValueError) as exc:
            raise EngineDied(self._failure(f"the llama.cpp engine stopped answering ({exc})")) from None
        if answer is None:
            self._process.wait(timeout=30)
            raise EngineDied(self._failure("the llama.cpp engine died while answering"))
        completion = completion_of(answer["response"], len(prompt_ids), stop_ids, time.perf_counter() - started)
        completion.engine["call_s"] = answer.get("wall_s")  # the server call's own wall time, in the engine process
        return completion

    def cache_report(self) -> CacheReport | None:
        """The cache llama.cpp allocated, read from its log once the log holds it (llama.cpp logs from a thread of its
        own, so the lines may land after the engine said it is ready)."""
        if self._report is None:
            self._report = cache_report(self.log(), self.settings.cache_type_k, self.settings.cache_type_v)
        return self._report

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                if process.poll() is None:
                    process.stdin.write("\n")
                    process.stdin.flush()
                    process.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                if stream:
                    stream.close()
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
