"""kvpress's side of scripts/measure/compare_kvpress.py: its own pipeline over given prompts and presses.

Runs in kvpress's environment (its own transformers pin) and imports nothing of this project, so what
compare_kvpress.py times is what a kvpress user pays: interpreter start, imports, model load, then for each
(press, compression ratio) and sample KVPressTextGenerationPipeline's prefill under the press (context only)
and greedy decoding of the question and answer. The prompts come as token ids already split into context
and question (made by compare_kvpress.py with this project's RULER generator), so both sides decode the
same tokens; they go straight to the pipeline's forward, skipping only its tokenizer. The model loads once.

    python kvpress_pipeline_run.py JOB.json ANSWERS.json
JOB.json: {model_dir, threads, max_new_tokens, prompts: [{id, context_ids, question_ids}],
           runs: [{key, press, arguments, ratio}]} (an argument naming a press
builds it with its defaults);  ANSWERS.json: {answers: {key: {sample id: answer}}, seconds: {key: pipeline
wall seconds of its samples}}.
"""

from __future__ import annotations

import json
import sys
import time


def main(job_path: str, answers_path: str) -> None:
    job = json.loads(open(job_path).read())
    import torch

    torch.set_num_threads(job["threads"])
    import kvpress
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    answers: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    for run in job["runs"]:
        start = time.perf_counter()
        press = getattr(kvpress, run["press"])(**{
            name: getattr(kvpress, value)() if str(value).endswith("Press") else value
            for name, value in run["arguments"].items()})
        press.compression_ratio = run["ratio"]
        answers[run["key"]] = {
            prompt["id"]: pipe.forward({"context_ids": torch.tensor([prompt["context_ids"]]),
                                        "questions_ids": [torch.tensor([prompt["question_ids"]])]},
                                       press=press, max_new_tokens=job["max_new_tokens"])[0]
            for prompt in job["prompts"]}
        seconds[run["key"]] = time.perf_counter() - start
    open(answers_path, "w").write(json.dumps({"answers": answers, "seconds": seconds}))


if __name__ == "__main__":
    main(*sys.argv[1:])
