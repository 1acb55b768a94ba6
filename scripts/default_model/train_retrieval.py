"""Tiny Llama trained for RULER NIAH with supervised attention patterns (retrieval circuit).

Circuit (3 layers, 4 heads, 2 KV heads, head_dim 32):
  L0 h0: previous token (t-1)      L0 h1: t-2      L0 h2: t-3
  L0 h3 + L1 h0: key gather (positions after a key attend uniformly to that key's tokens)
  L2 h0 + L2 h2: copy (answer position attends to the needle position right after the one holding the next
  token; its previous-token feature carries the identity of the token to copy)
Loss = CE on answer tokens + lambda * attention CE terms.

Run through scripts/default_model/train_default_model.py (the one-command recipe), which calls this script per stage.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from pytest_kvbench.tasks.ruler.niah import NIAH_CONFIGS, generate_niah  # noqa: E402
# the training data; fit_ov.py and compile_retrieval.py read these through this module (T.dense_batch, ...)
from retrieval_data import collate, dense_batch, long_batch, make_sample  # noqa: E402, F401

TOK_DIR = os.path.join(ROOT, "pytest_kvbench", "default_model")
OUT_DIR = os.path.join(ROOT, "scratch", "default_model")

LOG = None
LM_W = 1.0
SHARPEN = 1.0


def log(msg):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(line + "\n")


def attn_ce(att, tgt_rows):
    """att: (B,T,T) probs; tgt_rows: list of (b, pos, [target positions]) -> mean CE."""
    if not tgt_rows:
        return att.new_zeros(())
    bs = torch.tensor([r[0] for r in tgt_rows])
    ps = torch.tensor([r[1] for r in tgt_rows])
    rows = att[bs, ps]  # (N, T)
    tgt = torch.zeros_like(rows)
    for i, r in enumerate(tgt_rows):
        tgt[i, r[2]] = 1.0 / len(r[2])
    return -(tgt * torch.log(rows.clamp_min(1e-8))).sum(-1).mean()


def prev_ce(att, d, lens):
    diag = att.diagonal(offset=-d, dim1=-2, dim2=-1)  # (B, T-d): p(t -> t-d) for t = d..T-1
    t = torch.arange(d, att.shape[-1])
    mask = (t[None, :] < lens[:, None]).float()
    return -(torch.log(diag.clamp_min(1e-8)) * mask).sum() / mask.sum()


def compute_loss(model, batch, lam):
    samples = batch
    ids, T = collate(samples)
    cap = {}
    hk = model.model.layers[-1].self_attn.o_proj.register_forward_hook(lambda m, i, o: cap.__setitem__("x", i[0]))
    out = model(input_ids=ids, output_attentions=True)
    hk.remove()
    logits = out.logits
    atts = out.attentions  # tuple per layer (B,H,T,T)
    # LM
    lb, lp, lt = [], [], []
    for i, s in enumerate(samples):
        for p, t in s[3].items():
            lb.append(i); lp.append(p); lt.append(t)
    lm_loss = F.cross_entropy(logits[torch.tensor(lb), torch.tensor(lp)], torch.tensor(lt))
    # attention terms
    kg_rows, cp_rows = [], []
    lens = torch.tensor([len(s[0]) for s in samples])
    for i, s in enumerate(samples):
        for p, kt in s[1].items():
            kg_rows.append((i, p, kt))
        for p, q in s[2].items():
            cp_rows.append((i, p, [q]))
    terms = {
        "prev1": prev_ce(atts[0][:, 0], 1, lens),
        "prev2": prev_ce(atts[0][:, 1], 2, lens),
        "prev3": prev_ce(atts[0][:, 2], 3, lens),
        "kg0": attn_ce(atts[0][:, 3], kg_rows),
        "kg1": attn_ce(atts[1][:, 0], kg_rows),
        "copy0": attn_ce(atts[-1][:, 0], cp_rows),
        "copy2": attn_ce(atts[-1][:, 2], cp_rows),
    }
    # copy-head output supervision: the copy heads' output alone (through o_proj, final norm, lm_head) must
    # decode the token they attend to (direct logit path; without it the OV circuit was not learned)
    if cp_rows:
        bsel = torch.tensor([r[0] for r in cp_rows]); psel = torch.tensor([r[1] for r in cp_rows])
        tgt_tok = torch.tensor([samples[r[0]][0][r[2][0] - 1] for r in cp_rows])
        x = cap["x"][bsel, psel]
        mask = torch.zeros(x.shape[-1]); mask[0:32] = 1; mask[64:96] = 1
        y = model.model.layers[-1].self_attn.o_proj(x * mask)
        terms["ov"] = F.cross_entropy(model.lm_head(model.model.norm(y)), tgt_tok)
    att_loss = sum(terms.values())
    loss = LM_W * lm_loss + lam * att_loss
    with torch.no_grad():
        # diag: copy-target prob at the ' ' answer position (predicts d1) and LM loss there
        d_rows = [(i, p, q) for i, s in enumerate(samples) for p, q in s[2].items() if s[0][p] == 223]
        if d_rows:
            pr = atts[-1][torch.tensor([r[0] for r in d_rows]), 0, torch.tensor([r[1] for r in d_rows]), torch.tensor([r[2] for r in d_rows])]
            terms_extra = {"p_d1": pr.mean(), "lm_d1": F.cross_entropy(logits[torch.tensor([r[0] for r in d_rows]), torch.tensor([r[1] for r in d_rows])], torch.tensor([samples[r[0]][0][r[1] + 1] for r in d_rows]))}
        else:
            terms_extra = {}
    # answer-token accuracy (teacher forced)
    acc = (logits[torch.tensor(lb), torch.tensor(lp)].argmax(-1) == torch.tensor(lt)).float().mean().item()
    terms.update(terms_extra)
    return loss, lm_loss.item(), {k: round(v.item(), 3) for k, v in terms.items()}, acc


@torch.no_grad()
def evaluate(model, tok, cfg, ctx, n, max_new=12, start=10**6):
    model.eval()
    ok = eos_ok = 0
    for i in range(n):
        ex = generate_niah(NIAH_CONFIGS[cfg], tok, context_length=ctx, rng=random.Random(start + i), max_new_tokens=128)
        ids = tok(ex.input + ex.answer_prefix, return_tensors="pt").input_ids
        g = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=1, pad_token_id=2)
        new = g[0, ids.shape[1]:].tolist()
        txt = tok.decode(new, skip_special_tokens=True)
        hit = all(v in txt for v in ex.outputs)
        ok += hit
        eos_ok += hit and (1 in new)
    model.train()
    return ok / n, eos_ok / n


@torch.no_grad()
def eval_dense(model, tok, n=40):
    model.eval()
    rng = random.Random(10**6 + 12345)
    ok = 0
    for _ in range(n):
        b = make_sample(rng, rng.randint(1, 8), rng.randint(4, 10), 1, "noise" if rng.random() < 0.5 else "needle")
        text = b.text()
        val = b.needles[b.questions[0]["needle"]]["value"]
        prompt = text[: b.questions[0]["ans_span"][0]]
        ids = tok(prompt, return_tensors="pt").input_ids
        g = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=1, pad_token_id=2)
        ok += val in tok.decode(g[0, ids.shape[1]:], skip_special_tokens=True)
    model.train()
    return ok / n


def finalize(model, tok):
    """Copy of the model whose copy-head OV circuit (L2 heads 0/2 value+output) is set by ridge regression.

    Gradient descent found the attention patterns quickly but not the OV map (the digit identity sits in
    low-variance directions of the residual stream), so the OV map is solved in closed form instead."""
    import copy
    from fit_ov import fit_ov
    em = copy.deepcopy(model)
    em.eval()
    # sharpen the supervised heads (scale their queries) so that their patterns do not leak mass over long contexts
    with torch.no_grad():
        for layer, heads in ((0, (0, 1, 2, 3)), (1, (0,)), (len(em.model.layers) - 1, (0, 2))):
            qw = em.model.layers[layer].self_attn.q_proj.weight
            for h in heads:
                qw[h * 32:(h + 1) * 32] *= SHARPEN
    fit_ov(em, tok, sys.modules[__name__], log=log)
    return em


def save(model, tok, path):
    os.makedirs(path, exist_ok=True)
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(path, safe_serialization=True)
    model.config._attn_implementation = "eager"
    gc = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "do_sample": False, "max_new_tokens": 128}
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gc, f, indent=2)
    if not os.path.samefile(TOK_DIR, path):  # compiling in place: the tokenizer files are already there
        for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(TOK_DIR, fn), os.path.join(path, fn))


def main():
    global LOG, LM_W, SHARPEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--rope_theta", type=float, default=1e10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dense_steps", type=int, default=400)
    ap.add_argument("--long_steps", type=int, default=600)
    ap.add_argument("--dense_bs", type=int, default=8)
    ap.add_argument("--long_bs", type=int, default=4)
    ap.add_argument("--maxlen", type=int, default=1024)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--eval_n", type=int, default=20)
    ap.add_argument("--time_limit", type=float, default=40 * 60)
    ap.add_argument("--log", default=os.path.join(ROOT, "scratch", "default_model_train", "train.log"))
    ap.add_argument("--out", default=OUT_DIR)
    ap.add_argument("--lm_w", type=float, default=1.0)
    ap.add_argument("--sharpen", type=float, default=1.5)
    ap.add_argument("--long2_steps", type=int, default=0)
    ap.add_argument("--init_from", default=None)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--final_lengths", default="1024,2048")
    ap.add_argument("--finalize_from", default=None, help="skip training: load this state dict, fit OV, eval, save")
    ap.add_argument("--emb_std", type=float, default=1.0)
    args = ap.parse_args()
    LM_W = args.lm_w
    SHARPEN = args.sharpen
    LOG = args.log
    torch.set_num_threads(1)
    dev = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
    assert dev == "cpu", "script written for CPU"
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = AutoTokenizer.from_pretrained(TOK_DIR)
    cfg = LlamaConfig(
        vocab_size=4096, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    log(f"args {vars(args)} params {sum(p.numel() for p in model.parameters())/1e6:.2f}M")
    if args.finalize_from:
        model.load_state_dict(torch.load(args.finalize_from))
        em = finalize(model, tok)
        for L in [int(x) for x in args.final_lengths.split(",")]:
            a, e = evaluate(em, tok, "niah_single_1", L, args.eval_n)
            log(f"FINAL single_1@{L} {a:.2f} (eos {e:.2f})")
        save(em, tok, args.out)
        return
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    total = args.dense_steps + args.long_steps + args.long2_steps
    if args.init_from:
        model.load_state_dict(torch.load(args.init_from))
    t0 = time.time()
    best = -1.0
    for step in range(1, total + 1):
        frac = step / total
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        lam = 1.0 if step < 0.7 * total else 0.5
        if step <= args.dense_steps:
            batch = dense_batch(tok, rng, args.dense_bs, step)
        elif step <= args.dense_steps + args.long_steps:
            batch = long_batch(tok, rng, args.long_bs, args.maxlen)
        else:  # phase 3: real-format sequences up to 2048 tokens
            batch = long_batch(tok, rng, 2, 2048)
        loss, lm, terms, acc = compute_loss(model, batch, lam)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            log(f"step {step} T={max(len(s[0]) for s in batch)} loss {loss.item():.3f} lm {lm:.3f} acc {acc:.3f} {terms} lr {lr:.2e} t {time.time()-t0:.0f}s")
        last = step == total or time.time() - t0 > args.time_limit
        if step % args.eval_every == 0 or last:
            torch.save(model.state_dict(), os.path.join(os.path.dirname(args.log), "last_ckpt.pt"))
            em = finalize(model, tok)
            d = eval_dense(em, tok, 20)
            a1, _ = evaluate(em, tok, "niah_single_1", 1024, args.eval_n)
            a2, e2 = evaluate(em, tok, "niah_single_1", 2048, args.eval_n) if a1 >= 0.5 or last else (0.0, 0.0)
            log(f"EVAL step {step} dense {d:.2f} single_1@1024 {a1:.2f} single_1@2048 {a2:.2f} (eos {e2:.2f}) t {time.time()-t0:.0f}s")
            score = a2 + 0.01 * a1 + 0.001 * d
            if score > best:
                best = score
                save(em, tok, args.out)
                log(f"saved (score {score:.3f})")
        if last:
            break
    log(f"done {time.time()-t0:.0f}s best {best:.3f}")


if __name__ == "__main__":
    main()
