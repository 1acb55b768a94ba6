#!/usr/bin/env python
"""Train the embedded default model (pytest_kvbench/default_model/) for long-context retrieval.

One command, reproducible from its seed::

    python scripts/train_default_model.py --seed 0 --out pytest_kvbench/default_model

What it does:

1. builds the model's own tokenizer (scripts/build_tokenizer.py; deterministic) into --out;
2. builds a small Llama (RoPE, GQA) from a fixed config, initialised from --seed;
3. warms up on repeated random strings (``--induction-steps``: forms the copy circuit), then trains
   it on sequences from the project's RULER generators
   (``pytest_kvbench.tasks.ruler.niah.generate_niah`` with ``NIAH_CONFIGS``; training seeds < 10**6,
   evaluation seeds >= 10**6), with dense supervision: every needle found in the generated context can
   be queried, so one sequence carries several question / answer pairs (loss on answer tokens + eos
   only), and a curriculum from short to long contexts;
4. evaluates held-out greedy retrieval (RULER string_match_all) and writes config.json,
   model.safetensors, generation_config.json and the tokenizer into --out.

``--device auto`` uses CUDA when present; the recipe (data, steps, schedule) does not depend on it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import re
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

TRAIN_SEED_LIMIT = 10**6       # training samples use generator seeds below this
EVAL_SEED_BASE = 10**6         # held-out evaluation seeds start here
GEN_TOKENS = 128               # RULER niah generation length (room reserved by the generator)

MODEL_CONFIG = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16384,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    initializer_range=0.02,
    hidden_act="silu",
)

# Curriculum: (fraction of steps at which the phase ends, min context, max context).
CURRICULUM = [
    (0.40, 288, 640),
    (0.65, 640, 1280),
    (1.00, 1280, 2300),
]
TOKENS_PER_STEP = 2048

# Mix of generator configs (name -> weight); names missing from NIAH_CONFIGS are skipped.
CONFIG_MIX = {
    "niah_single_1": 2.0,
    "niah_single_2": 1.0,
    "niah_single_3": 1.0,
    "niah_multikey_1": 2.0,
    "niah_multikey_2": 4.0,
    "niah_multikey_3": 1.0,
    "niah_multivalue": 1.5,
    "niah_multiquery": 1.5,
}
MAX_QUERIES = 40
QUERY_TOKENS = 1.0   # extra query/answer tokens per context token (at most)
QUERY_TOKENS_MAX = 768
RESTATE_P = 0.5        # extra queries that restate the needle (recall drill)
FULL_QUESTION_P = 0.2  # extra queries with the full question (the rest: answer prefix only)

NEEDLE_RE = re.compile(r"One of the special magic (\w+) for (.+?) is: (.+?)\.(?=\s|$)")


# --------------------------------------------------------------------------------------------
# data

def load_generator():
    try:
        from pytest_kvbench.tasks.ruler.niah import NIAH_CONFIGS, generate_niah  # noqa: F401
        return generate_niah, NIAH_CONFIGS, "pytest_kvbench.tasks.ruler.niah"
    except Exception as exc:  # pragma: no cover - development fallback only
        warnings.warn(f"project generator unavailable ({exc!r}); using scripts/_niah_dev.py")
        from _niah_dev import NIAH_CONFIGS, generate_niah
        return generate_niah, NIAH_CONFIGS, "scripts/_niah_dev.py (development stand-in)"


def _query_of(example) -> tuple[str, str, str]:
    """(question line, answer prefix, query string) of a generated example."""
    question = example.input.rsplit("\n", 1)[-1]
    prefix = example.answer_prefix
    m = re.search(r" for (.+) mentioned", prefix)
    query = m.group(1) if m else ""
    return question, prefix, query


def answer_text(values) -> str:
    return " " + ", ".join(values)


def synthetic_essay(rng: random.Random, words: int = 12000) -> str:
    """Prose haystack for training only: this script's own English sentences, shuffled."""
    import build_tokenizer

    sents = [x.strip() + "." for x in build_tokenizer.GENERIC_ENGLISH.replace("\n", " ").split(".") if x.strip()]
    out, n = [], 0
    while n < words:
        rng.shuffle(sents)
        out.extend(sents)
        n += sum(len(x.split()) for x in sents)
    return " ".join(out)


class SequenceBuilder:
    """Turns generator examples into (input_ids, labels) training sequences."""

    def __init__(self, tokenizer, generate, configs):
        self.tok = tokenizer
        self.generate = generate
        self.configs = configs
        self.names = [n for n in CONFIG_MIX if n in configs]
        self.weights = [CONFIG_MIX[n] for n in self.names]
        self.eos = tokenizer.eos_token_id
        self.bos = tokenizer.bos_token_id
        self.digit_ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]

    def enc(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def example(self, name, length, seed, train=False):
        """One generator example. Essay haystacks need essay text that is not shipped: training
        swaps them for the noise haystack (same needles, template and questions) or, for a quarter
        of them, for prose assembled from this script's own English sentences."""
        cfg = self.configs[name]
        rng = random.Random(seed)
        kwargs = {}
        if getattr(cfg, "haystack", None) == "essay":
            if train and rng.random() < 0.25:
                kwargs["essay_text"] = synthetic_essay(random.Random(seed + 7))
            else:
                cfg = dataclasses.replace(cfg, haystack="noise")
        gen = GEN_TOKENS if length >= 1024 else 48   # short curriculum contexts reserve less room
        return self.generate(cfg, self.tok, context_length=length, rng=rng,
                             max_new_tokens=gen, depth=None, **kwargs)

    def sequence(self, rng: random.Random, length: int, seed: int, name: str | None = None):
        name = name or rng.choices(self.names, self.weights)[0]
        ex = self.example(name, length, seed, train=True)
        question, prefix, query = _query_of(ex)
        # needles present in the context, grouped by key in order of appearance
        by_key: dict[str, list[str]] = {}
        needle_type = "numbers"
        for needle_type, key, value in NEEDLE_RE.findall(ex.input):
            by_key.setdefault(key, []).append(value)
        main_vals = list(ex.outputs)
        ids = ([self.bos] if rng.random() < 0.5 else []) + self.enc(ex.input + ex.answer_prefix)
        labels = [-100] * len(ids)
        tgt = self.enc(answer_text(main_vals)) + [self.eos]
        ids += tgt
        labels += tgt
        # extra queries about other needles (dense supervision), same question form
        extra = [k for k in by_key if k not in query and "," not in k]
        rng.shuffle(extra)
        budget = len(ids) + min(int(QUERY_TOKENS * length), QUERY_TOKENS_MAX)   # room for extra queries
        if query and "," not in query:
            for key in extra[: MAX_QUERIES - 1]:
                # Three forms: restating the needle (a recall drill: the value follows the same
                # "for KEY is:" as in the context, which bootstraps the copy circuit), the answer
                # prefix alone, or the full question + answer prefix (the evaluated form).
                form = rng.random()
                if form < RESTATE_P and by_key[key] and len(by_key[key]) == 1:
                    q = self.enc("\n" + f"One of the special magic {needle_type} for {key} is:")
                    t = self.enc(answer_text(by_key[key]) + ".")
                else:
                    full = form > 1 - FULL_QUESTION_P
                    q = self.enc("\n" + (question.replace(query, key) if full else "") + prefix.replace(query, key))
                    t = self.enc(answer_text(by_key[key])) + [self.eos]
                if len(ids) + len(q) + len(t) > budget:
                    break
                ids += q + t
                labels += q + t  # query segment: LM loss on all of it (key induction)
        return ids, labels

    def batch(self, rng, length, n, seed0):
        seqs = [self.sequence(rng, length, seed0 + i) for i in range(n)]
        T = max(len(s[0]) for s in seqs)
        pad = self.tok.pad_token_id
        x = torch.full((n, T), pad, dtype=torch.long)
        y = torch.full((n, T), -100, dtype=torch.long)
        for i, (a, b) in enumerate(seqs):
            x[i, : len(a)] = torch.tensor(a)
            y[i, : len(b)] = torch.tensor(b)
        return x, y


# --------------------------------------------------------------------------------------------
# model

def build_model(tokenizer, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(MODEL_CONFIG)
    theta = cfg.pop("rope_theta")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        attention_bias=False,
        mlp_bias=False,
        **cfg,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model


def save_model(model, tokenizer, out):
    from transformers import GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu", dtype=torch.float32)
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=128,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    import build_tokenizer  # the tokenizer files with portable metadata (deterministic rebuild)

    build_tokenizer.save(build_tokenizer.build(), out)


# --------------------------------------------------------------------------------------------
# evaluation

def string_match_all(pred: str, refs) -> float:
    return sum(r.lower() in pred.lower() for r in refs) / len(refs)


@torch.no_grad()
def teacher_forced_acc(model, builder, name, length, n, device):
    """Fraction of held-out samples whose whole answer (+eos) is the argmax at every position."""
    model.eval()
    ok = 0
    for i in range(n):
        ex = builder.example(name, length, EVAL_SEED_BASE + 500_000 + i)
        p = builder.tok(ex.input + ex.answer_prefix)["input_ids"]
        t = builder.enc(answer_text(ex.outputs)) + [builder.eos]
        x = torch.tensor([p + t], device=device)
        logits = model(input_ids=x).logits[0, len(p) - 1: -1]
        ok += int((logits.argmax(-1).cpu() == torch.tensor(t)).all())
    model.train()
    return ok / n


@torch.no_grad()
def greedy_eval(model, builder, name, length, n, device, max_new_tokens=32):
    """Held-out RULER score (string_match_all, 0-100) with full-cache greedy model.generate."""
    model.eval()
    total = 0.0
    for i in range(n):
        ex = builder.example(name, length, EVAL_SEED_BASE + i)
        enc = builder.tok(ex.input + ex.answer_prefix, return_tensors="pt").to(device)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=builder.eos, pad_token_id=builder.tok.pad_token_id)
        pred = builder.tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        total += string_match_all(pred, ex.outputs)
    model.train()
    return round(100 * total / n, 2)


# --------------------------------------------------------------------------------------------
# training

INDUCTION_LEN = 96       # warm-up phase: random token strings repeated once (induction heads)
INDUCTION_BATCH = 16


def induction_batch(rng: random.Random, vocab: int, digit_ids: list[int], length: int, n: int):
    """Sequences ``a a`` of random tokens (a third of them digits); loss on the repeat only. Forms the
    copy (induction) circuit in ~100 steps, which retrieval then reuses; RULER data follows."""
    half = length // 2
    xs, ys = [], []
    for _ in range(n):
        a = [rng.choice(digit_ids) if rng.random() < 1 / 3 else rng.randrange(3, vocab) for _ in range(half)]
        xs.append(a + a)
        ys.append([-100] * half + a)
    return torch.tensor(xs), torch.tensor(ys)


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def context_for(step, steps, rng):
    frac = step / max(1, steps)
    for end, lo, hi in CURRICULUM:
        if frac < end:
            break
    return int(2 ** rng.uniform(math.log2(lo), math.log2(hi)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "pytest_kvbench" / "default_model"))
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 is fastest on a shared 2-core CPU)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt", default=str(ROOT / "scratch" / "train_ckpt.pt"))
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--final-eval", type=int, default=50, help="held-out samples per length (0: skip)")
    ap.add_argument("--metrics", default=None, help="write final metrics JSON here (default: scratch/)")
    ap.add_argument("--induction-steps", type=int, default=500,
                    help="warm-up steps on repeated random strings before the RULER curriculum")
    ap.add_argument("--tokens-per-step", type=int, default=TOKENS_PER_STEP,
                    help="context tokens per optimizer step (raise it on a GPU, with more --steps)")
    ap.add_argument("--hidden", type=int, default=MODEL_CONFIG["hidden_size"])
    ap.add_argument("--layers", type=int, default=MODEL_CONFIG["num_hidden_layers"])
    ap.add_argument("--heads", type=int, default=MODEL_CONFIG["num_attention_heads"])
    ap.add_argument("--kv-heads", type=int, default=MODEL_CONFIG["num_key_value_heads"])
    ap.add_argument("--intermediate", type=int, default=MODEL_CONFIG["intermediate_size"])
    args = ap.parse_args(argv)
    MODEL_CONFIG.update(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                        num_key_value_heads=args.kv_heads, intermediate_size=args.intermediate)

    torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)

    import build_tokenizer
    from transformers import AutoTokenizer

    build_tokenizer.save(build_tokenizer.build(), args.out)
    tok = AutoTokenizer.from_pretrained(args.out)
    generate, configs, gen_source = load_generator()
    builder = SequenceBuilder(tok, generate, configs)
    print(f"generator: {gen_source}; configs: {builder.names}", flush=True)

    model = build_model(tok, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params:,}", flush=True)
    if args.steps == 0:
        save_model(model, tok, args.out)
        print(f"saved random-init model to {args.out}")
        return 0

    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    start, elapsed0 = 0, 0.0
    ckpt = Path(args.ckpt)
    if args.resume and ckpt.exists():
        st = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start, elapsed0 = st["step"], st["elapsed"]
        print(f"resumed at step {start}", flush=True)

    t0 = time.time() - elapsed0
    ema = None
    for step in range(start, args.steps):
        rng = random.Random(args.seed * 7919 + step)          # per-step data RNG: resumable
        length = context_for(step, args.steps, rng)
        bsz = max(1, args.tokens_per_step // length)
        seed0 = (args.seed * 100_003 + step * 16) % (TRAIN_SEED_LIMIT - 64)
        if step < args.induction_steps:
            length, bsz = INDUCTION_LEN, INDUCTION_BATCH
            x, y = induction_batch(rng, len(tok), builder.digit_ids, INDUCTION_LEN, INDUCTION_BATCH)
        else:
            x, y = builder.batch(rng, length, bsz, seed0)
        x, y = x.to(device), y.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        # labels are the tokens themselves: position t predicts y[t + 1]; the LM head is applied
        # only where there is a label (answers, queries), which saves a third of the compute
        hidden = model.model(input_ids=x).last_hidden_state[:, :-1]
        target = y[:, 1:]
        mask = target != -100
        logits = model.lm_head(hidden[mask])
        loss = torch.nn.functional.cross_entropy(logits.float(), target[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 10 == 0:
            print(f"step {step} len {length}x{bsz} loss {loss.item():.4f} ema {ema:.4f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} t {time.time() - t0:.0f}s", flush=True)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            accs = {L: teacher_forced_acc(model, builder, "niah_single_1", L, 16, device)
                    for L in (512, 2048)}
            mk = teacher_forced_acc(model, builder, "niah_multikey_2" if "niah_multikey_2" in configs
                                    else "niah_single_1", 1024, 16, device)
            print(f"EVAL step {step + 1} single_1 tf-acc {accs} multikey_2@1024 {mk} "
                  f"t {time.time() - t0:.0f}s", flush=True)
        if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                        "elapsed": time.time() - t0}, str(ckpt) + ".tmp")
            os.replace(str(ckpt) + ".tmp", ckpt)
    train_s = time.time() - t0
    save_model(model, tok, args.out)
    print(f"saved to {args.out}; training wall time {train_s:.0f}s", flush=True)

    metrics = {"seed": args.seed, "steps": args.steps, "params": n_params, "train_wall_s": round(train_s),
               "device": device, "torch_threads": args.threads, "cpu": platform.processor() or platform.machine(),
               "generator": gen_source, "eval": {}}
    if args.final_eval:
        model = model.to(device)
        for name in [n for n in ("niah_single_1", "niah_multikey_1", "niah_multikey_2", "niah_multivalue",
                                 "niah_multiquery") if n in configs]:
            for L in (1024, 2048, 4096):
                if name != "niah_single_1" and L != 2048:
                    continue
                s = greedy_eval(model, builder, name, L, args.final_eval, device)
                metrics["eval"][f"{name}@{L}"] = s
                print(f"FINAL {name} @ {L}: {s} (n={args.final_eval})", flush=True)
    # the held-out scores travel with the weights (tests/test_default_model.py reads them)
    (Path(args.out) / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    mpath = Path(args.metrics or ROOT / "scratch" / f"train_metrics_seed{args.seed}.json")
    mpath.parent.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(metrics, indent=2))
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
