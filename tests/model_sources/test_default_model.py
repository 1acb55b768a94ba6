"""The embedded default model shipped in pytest_kvbench/default_model/.

Checks the files (size, Llama + GQA + RoPE config, own tokenizer) and that the shipped weights
really retrieve needles: a damaged or untrained weight file fails here. Full cache, plain greedy
``model.generate``; no timing assertions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pytest_kvbench

MODEL_DIR = Path(pytest_kvbench.__file__).resolve().parent / "default_model"
MAX_BYTES = 20 * 1024 * 1024
FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tokenizer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR))


@pytest.fixture(scope="module")
def model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32)
    m.eval()
    return m


def test_files_present_and_small():
    for name in FILES:
        assert (MODEL_DIR / name).is_file(), f"missing {name} in {MODEL_DIR}"
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total <= MAX_BYTES, f"default model files take {total} bytes (> 20 MB)"
    assert (MODEL_DIR / "MODEL_CARD.md").is_file()


def test_config_is_llama_with_gqa_and_rope():
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] >= 2
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert config["max_position_embeddings"] >= 8192
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta")}
    assert rope.get("rope_theta")
    assert not (MODEL_DIR / "pytorch_model.bin").exists()


def test_tokenizer_is_small_byte_level_with_single_digits(tokenizer):
    assert 1000 <= len(tokenizer) <= 4096
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>" and tokenizer.pad_token == "<pad>"
    assert not getattr(tokenizer, "chat_template", None)
    for text in ("汉字也可以：长上下文。", "One of the special magic numbers for wry-flame is: 4471234."):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text
    digits = tokenizer.convert_ids_to_tokens(tokenizer("4471234", add_special_tokens=False)["input_ids"])
    assert digits == list("4471234")


def test_config_matches_weights(model, tokenizer):
    assert model.config.vocab_size == len(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


@pytest.mark.parametrize(("task_name", "context_length"), [
    ("niah_single_1", 1024), ("niah_single_1", 2048), ("niah_multikey_2", 2048), ("niah_multikey_3", 2048)])
def test_retrieves_needles_with_full_cache(model, tokenizer, task_name, context_length):
    """RULER needle tasks through the harness's own task code: most of 5 held-out samples right.

    niah_multikey_2 has about 70 needles at 2,048 tokens, so a right answer needs the key match,
    not just the copy of some number; niah_multikey_3's keys and values are uuids of ~34 tokens,
    all hex pieces that training never saw."""
    import torch

    from pytest_kvbench.tasks import get_task

    task = get_task(task_name)
    samples = task.load_samples(tokenizer, n=5, seed=0, context_length=context_length)
    scores, predictions = [], []
    for sample in samples:
        prompt = task.build_prompt(sample, tokenizer, None)
        assert len(prompt.input_ids) + task.max_new_tokens <= context_length
        ids = torch.tensor([prompt.input_ids])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                                 do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        prediction = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        predictions.append(prediction)
        scores.append(task.score(prediction, sample))
    assert sum(scores) >= 4, list(zip(predictions, [s.answers for s in samples]))
