#!/usr/bin/env python
"""Stage 4 of the default model's recipe: compile a key-matching retrieval circuit into the trained model.

    python scripts/default_model/compile_retrieval.py --from TRAINED_DIR --out pytest_kvbench/default_model

Why: the trained 3-layer model copies *a* needle's number but cannot tell needles apart by their
key (niah_multikey_2 scored 0 at 2,048 tokens), and it never saw a uuid. Gradient steps on a CPU hour did not find a
key match that survives RMSNorm (see the model card), so this stage sets one in closed form, the way
RASP/tracr-style constructions do, on top of the trained weights. Nothing here replaces a model
class's code: the result is a plain `LlamaForCausalLM` checkpoint with more heads' worth of weights.

The construction (every weight is set in closed form; nothing is fitted to evaluation data):
- The copy alphabet is every token a needle's value can hold (digits, uuids' hex pieces with and without a
  leading space, '-', the answer's punctuation): about a hundred tokens, read from the tokenizer.
- The residual gains a workspace beside the trained 128 dimensions: the current token's one-hot alphabet code
  and a random unit "key-word" code (zero for template words), the match codes of tokens t-1, t-2, t-3, the
  carried key, and flags. A match code is the one-hot of the three anchors the query side remaps (':', 'is',
  'text') or a dense 16-dim code of low mutual coherence, plus an in-alphabet flag.
- Layer 0: heads 0, 1, 2 read tokens t-1, t-2, t-3 by a positional kernel alone (their trained content scores
  point anywhere for tokens training never saw, such as hex pieces) and write those tokens' match codes.
  Head 3 (replacing the trained key-gathering head) writes the key bag, the mean key-word code of the
  non-template tokens in the last 8 positions, and a constant "ballast" that dominates the residual norm from
  then on, so that layers 1 and 2 normalise every position by the same constant (with per-position RMSNorm,
  template positions outscored the right digit).
- Layer 1, head 3: carries the key of the latest anchor to every later position: its bag plus, in the same
  dims, its last two key tokens in order (a bag alone cannot tell uuid keys apart: they share most of their few
  hex pieces). Anchors are 'is' after a key in a needle, 'mentioned' in the question, and 'for', which starts
  a key, so that the next needle's key (itself a copyable uuid) carries no bag. A flag says whether the anchor
  was the question. The anchors get the smallest key norm of the head, as the tokens that draw attention do in
  trained models.
- Layer 2, head 0, the copy head: score = bag * carried.carried' + token * now.(t-1)' +
  context * ((t-1).(t-2)' + (t-2).(t-3)'), on RoPE pairs that turn by less than 0.2 rad over 4,096 tokens: it
  outputs the token that follows the current context inside the needle whose key matches the question. A
  context token that differs costs `mismatch` times what a match earns; positions after the question (which
  carry the question's own key) cost `question_side`. The BOS position is a sink scored as a perfect context
  match plus `sink`, so only a matching key beats it; it outputs the end of the answer. The copied one-hot goes
  out through the tied embeddings' own alphabet dims (the final norm reads them with a per-token gain), so
  every alphabet token is output with the same margin and nothing outside the alphabet gains; the end-of-sequence
  token reads the full stop's dim. Head 1 cancels the ballast before the MLP and the final norm, and from the
  same constant votes for the end of the answer with a third of the copy head's weight, so that an answer ends
  rather than loops when the needle is gone from a compressed cache.
- The RoPE kernels (previous tokens, flat window, latest-anchor recency) are designed by linear programming over
  the available frequencies and hold out to 8,192 tokens.
- RoPE theta becomes 1e20 with head_dim 128: the trained heads' pairs map to the even pairs with
  the same frequencies exactly.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_retrieval as T  # noqa: E402
from rope_kernels import HEAD, THETA, _put_kernel, peak_kernel, recency_kernel, window_kernel  # noqa: E402

OLD_HIDDEN, OLD_HEAD = 128, 32
# The copy alphabet: every token of a needle's value (numbers, and uuids' hex pieces with or without a leading
# space), the answer's punctuation, and the anchors the query side remaps. Read from the tokenizer by alphabet().
PUNCT = [":", "Ġis", "Ġtext"]  # one-hot in the match code: the query side remaps them ("text is" plays "is:")
SEPARATORS = ["Ġ", ".", "-"]  # copied, but never part of a key bag
HEX = re.compile(r"Ġ?[0-9a-f]{1,4}")
NK, DU = 36, 16  # random key-word code dims; dense match-code dims of the value tokens
DM = len(PUNCT) + DU + 1  # match code: punctuation one-hot, dense code, "in the alphabet" flag
ANCHORS = ["Ġis", "Ġmentioned", "Ġfor"]  # "for" starts a key: positions inside a key carry no bag
CODE_SCALE = 0.02  # workspace codes in the embedding, relative to the token's embedding norm
KAPPA = 0.5  # layer 0's normalised value of the ONE flag
BALLAST = 1.0e4
ANCHOR_FLAG = 0.01
FAST = list(range(14))  # RoPE pairs that turn: the kernels' frequencies
LOW = list(range(16))  # the 16 fastest RoPE pairs: layer 0's previous-token kernels
ODD = [1, 3, 5, 7, 9, 11, 13, 15]  # the key bag's window kernel
STATIC = list(range(14, 64))  # pairs that turn less than 0.2 rad over 4,096 tokens
FLAG_PAIR = 33  # an odd static pair for the mask / anchor flags
DEFAULTS = dict(bag=80.0, token=12.0, context=12.0, beta=300.0, mask=8.0, anchor=1000.0, window=8, tail=1.0, sink=9.0, mismatch=2.0, eos=100.0, question_side=100.0, logit=12.0)


def alphabet(tok):
    """The tokens the copy head can match and output, in a fixed order: punctuation, separators, hex pieces."""
    pieces = sorted((t for t in tok.get_vocab() if HEX.fullmatch(t)), key=lambda t: (t.startswith("Ġ"), len(t), t))
    return PUNCT + SEPARATORS + pieces


def slots(n_alpha, old_hidden=OLD_HIDDEN):
    """Where each workspace slot sits after the trained dims, and the resulting hidden width."""
    out, at = {}, old_hidden
    for name, width in [("E", n_alpha + NK), ("A", DM), ("B", DM), ("C", DM), ("CARRY", NK), ("ONE", 1), ("TMPL", 1),
                        ("ANCHOR", 1), ("MENTIONED", 1), ("QUESTION_SIDE", 1), ("SINK", 1), ("BALLAST", 1)]:
        out[name] = slice(at, at + width)
        at += width
    # the bag is written onto the key-word codes: at the anchors the carry head reads ('is', 'mentioned', 'for') that
    # code is zero
    out["BAG"] = slice(out["E"].start + n_alpha, out["E"].stop)
    return out, -(-at // 4) * 4  # a round width; the rest is zero


# ---- what the construction reads from the tokenizer and the trained model

def template_tokens(tok, alpha):
    """Tokens of the RULER needle templates and the haystacks (never part of a key), from training seeds."""
    seen = set()
    for cfg in ("niah_single_1", "niah_multikey_2", "niah_multikey_3"):
        for seed in range(3):
            ex = T.generate_niah(T.NIAH_CONFIGS[cfg], tok, context_length=1024, rng=random.Random(seed), max_new_tokens=128)
            in_key = False
            for t in tok.convert_ids_to_tokens(tok(ex.input + ex.answer_prefix).input_ids):
                if t == "Ġfor":
                    in_key = True
                elif t in ANCHORS:
                    in_key = False
                if not in_key or t == "Ġfor":
                    seen.add(t)
    return sorted((seen | set(PUNCT + SEPARATORS)) - set(alpha[len(PUNCT + SEPARATORS):]))


@torch.enable_grad()
def match_codes(n, dim, weights, seed, steps=3000):
    """n unit vectors in `dim` dims with low pairwise coherence, lowest among the heavily weighted (frequent) ones.

    Random unit codes in 16 dims would put some pairs of the ~100 hex pieces at a cosine near 1, i.e. a mismatch
    scored as a match; a few thousand steps of gradient descent on a soft maximum of the weighted squared cosines
    bring the worst pair near the Welch bound."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(n, dim, generator=gen, dtype=torch.float64).requires_grad_(True)
    w = torch.as_tensor(weights, dtype=torch.float64)
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    pair_w = (w[:, None] * w[None, :])[off_diagonal]
    opt = torch.optim.Adam([u], lr=0.01)
    for _ in range(steps):
        v = F.normalize(u, dim=-1)
        cos2 = (v @ v.T).pow(2)[off_diagonal]
        loss = torch.logsumexp(40.0 * pair_w * cos2, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return F.normalize(u.detach(), dim=-1).float()


def training_prompt(tok):
    """The prompt the construction measures its scales on: niah_multikey_2, 1,024 tokens, training seed 7."""
    ex = T.generate_niah(T.NIAH_CONFIGS["niah_multikey_2"], tok, context_length=1024, rng=random.Random(7), max_new_tokens=128)
    return tok(ex.input + ex.answer_prefix, return_tensors="pt").input_ids


@torch.no_grad()
def median_rms(model, tok):
    """Median residual rms at each norm the ballast makes constant."""
    ids = training_prompt(tok)
    out, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        for name, norm in (("in", layer.input_layernorm), ("post", layer.post_attention_layernorm)):
            hooks.append(norm.register_forward_pre_hook(
                lambda m, a, key=f"{name}{i}": out.__setitem__(key, a[0].pow(2).mean(-1).sqrt().median().item())))
    model(ids)
    for h in hooks:
        h.remove()
    return out


# ---- the construction

def _old_rows(h):
    """The trained head's q/k rows inside the wider head: pair j goes to pair 2j (same frequency under theta 1e20)."""
    return [h * HEAD + (2 * d if d < OLD_HEAD // 2 else 2 * (d - OLD_HEAD // 2) + HEAD // 2) for d in range(OLD_HEAD)]


def compile_model(old, tok, seed=0, **overrides):
    p = {**DEFAULTS, **overrides}
    oc = old.config
    alpha = alphabet(tok)
    NR = len(alpha)
    SL, D = slots(NR)
    ix = {t: i for i, t in enumerate(alpha)}
    cfg = LlamaConfig(vocab_size=oc.vocab_size, hidden_size=D, intermediate_size=oc.intermediate_size,
                      num_hidden_layers=oc.num_hidden_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD,
                      max_position_embeddings=oc.max_position_embeddings, rms_norm_eps=oc.rms_norm_eps * OLD_HIDDEN / D,
                      rope_parameters={"rope_type": "default", "rope_theta": THETA}, tie_word_embeddings=True,
                      bos_token_id=oc.bos_token_id, eos_token_id=oc.eos_token_id, pad_token_id=oc.pad_token_id)
    new = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    rms = median_rms(old, tok)
    s2 = math.sqrt(OLD_HIDDEN / D)
    const_rms = BALLAST / math.sqrt(D)  # every position's rms wherever the ballast dominates
    V, OH = oc.vocab_size, OLD_HIDDEN
    with torch.no_grad():
        for prm in new.parameters():
            prm.zero_()
        Eo = old.model.embed_tokens.weight.detach()
        norm_e = Eo.norm(dim=-1, keepdim=True)
        alpha_ids = tok.convert_tokens_to_ids(alpha)
        code = torch.zeros(V, NR + NK)
        code[:, NR:] = F.normalize(torch.randn(V, NK, generator=gen), dim=-1)
        code[alpha_ids, :NR] = torch.eye(NR)
        code[tok.convert_tokens_to_ids(template_tokens(tok, alpha)), NR:] = 0
        code[[tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]] = 0
        tmpl = (code[:, NR:].abs().sum(-1) == 0).float()
        # match codes (DM x NR): the anchors' punctuation one-hot plus the in-alphabet flag ("text" has no flag: as a
        # candidate it never matches); every other alphabet token a dense unit code plus the flag
        frequent = set("0123456789abcdef") | set(SEPARATORS)
        dense = match_codes(NR - len(PUNCT), DU, [1.0 if t in frequent else 0.5 for t in alpha[len(PUNCT):]], seed)
        C = torch.zeros(DM, NR)
        C[:len(PUNCT), :len(PUNCT)] = torch.eye(len(PUNCT))
        C[len(PUNCT):len(PUNCT) + DU, len(PUNCT):] = dense.T
        C[-1, :] = 1.0
        C[-1, ix["Ġtext"]] = 0.0
        E = new.model.embed_tokens.weight
        E[:, :OH] = Eo
        E[:, SL["E"]] = code * (CODE_SCALE * norm_e)
        E[tok.convert_tokens_to_ids(ANCHORS), SL["ANCHOR"]] = ANCHOR_FLAG
        E[tok.bos_token_id, SL["SINK"]] = ANCHOR_FLAG
        E[tok.convert_tokens_to_ids("Ġmentioned"), SL["MENTIONED"]] = ANCHOR_FLAG
        # ONE and TMPL sized per token so that layer 0's normalised input reads exactly KAPPA and KAPPA*tmpl
        tok_rms = torch.sqrt(E.pow(2).sum(-1) / (D - KAPPA ** 2 * (1 + tmpl)))
        E[:, SL["ONE"]] = (KAPPA * tok_rms)[:, None]
        E[:, SL["TMPL"]] = (KAPPA * tok_rms * tmpl)[:, None]
        new.model.norm.weight[:OH] = old.model.norm.weight * s2
        for li, (lo, ln) in enumerate(zip(old.model.layers, new.model.layers)):
            if li == 0:
                ln.input_layernorm.weight[:OH] = lo.input_layernorm.weight * s2
                ln.input_layernorm.weight[OH:] = 1.0
            else:  # ballast: constant normalisation; the trained dims keep their median scale
                ln.input_layernorm.weight[:OH] = lo.input_layernorm.weight * const_rms / rms[f"in{li}"] / math.sqrt(OH)
                ln.input_layernorm.weight[OH:] = const_rms
            scale = const_rms / rms[f"post{li}"] / math.sqrt(OH) if li < 2 else s2
            ln.post_attention_layernorm.weight[:OH] = lo.post_attention_layernorm.weight * scale
            a_, b_ = lo.self_attn, ln.self_attn
            for h in range(4):
                b_.q_proj.weight[_old_rows(h), :OH] = a_.q_proj.weight[h * OLD_HEAD:(h + 1) * OLD_HEAD] * math.sqrt(HEAD / OLD_HEAD)
                b_.o_proj.weight[:OH, h * HEAD:h * HEAD + OLD_HEAD] = a_.o_proj.weight[:, h * OLD_HEAD:(h + 1) * OLD_HEAD]
            for h in range(2):
                b_.k_proj.weight[_old_rows(h), :OH] = a_.k_proj.weight[h * OLD_HEAD:(h + 1) * OLD_HEAD]
                b_.v_proj.weight[h * HEAD:h * HEAD + OLD_HEAD, :OH] = a_.v_proj.weight[h * OLD_HEAD:(h + 1) * OLD_HEAD]
            ln.mlp.gate_proj.weight[:, :OH] = lo.mlp.gate_proj.weight
            ln.mlp.up_proj.weight[:, :OH] = lo.mlp.up_proj.weight
            ln.mlp.down_proj.weight[:OH] = lo.mlp.down_proj.weight
        code0 = CODE_SCALE * math.sqrt(D)  # a code's size in layer 0's normalised input
        e0 = SL["E"].start
        one, bal = SL["ONE"].start, SL["BALLAST"].start

        # layer 0: heads 0, 1, 2 read t-1, t-2, t-3 by position alone (a kernel on the 16 fastest pairs, margin 130+
        # nats; their trained content scores pointed anywhere for hex pieces) and, beside their trained value maps,
        # write the match code of the token they read
        L0 = new.model.layers[0].self_attn
        L0.q_proj.weight.zero_()
        L0.k_proj.weight.zero_()
        for h in range(3):
            a, b, _ = peak_kernel(LOW, at=h + 1)
            _put_kernel(L0.q_proj.weight, L0.k_proj.weight, h, h // 2, a, b, one, KAPPA, LOW)
        for kv in range(2):
            L0.v_proj.weight[kv * HEAD + 32:kv * HEAD + 32 + DM, e0:e0 + NR] = C
        for h, name in enumerate("ABC"):
            L0.o_proj.weight[SL[name], h * HEAD + 32:h * HEAD + 32 + DM] = torch.eye(DM) / code0
        # layer 0, head 3: the key bag (replaces the trained key-gathering head) and the ballast
        a, b, _ = window_kernel(ODD, width=int(p["window"]))
        L0.o_proj.weight[:, 3 * HEAD:4 * HEAD] = 0
        _put_kernel(L0.q_proj.weight, L0.k_proj.weight, 3, 1, a, b, one, KAPPA, ODD)
        L0.q_proj.weight[3 * HEAD + FLAG_PAIR, one] = -p["mask"] * math.sqrt(HEAD) / KAPPA
        L0.k_proj.weight[HEAD + FLAG_PAIR, SL["TMPL"].start] = 1.0 / KAPPA
        v0 = HEAD + 32 + DM
        L0.v_proj.weight[v0:v0 + NK, SL["BAG"]] = torch.eye(NK)
        L0.v_proj.weight[v0 + NK, one] = 1.0
        L0.o_proj.weight[SL["BAG"], 3 * HEAD + 32 + DM:3 * HEAD + 32 + DM + NK] = torch.eye(NK) / code0
        L0.o_proj.weight[bal, 3 * HEAD + 32 + DM + NK] = BALLAST / KAPPA

        # layer 1, kv 1 / head 3: carry the bag of the latest anchor (replaces the trained heads 2 and 3)
        L1 = new.model.layers[1].self_attn
        L1.q_proj.weight[2 * HEAD:4 * HEAD] = 0
        L1.k_proj.weight[HEAD:2 * HEAD] = 0
        L1.v_proj.weight[HEAD:2 * HEAD] = 0
        L1.o_proj.weight[:, 2 * HEAD:4 * HEAD] = 0
        a, b, _ = recency_kernel(FAST)
        _put_kernel(L1.q_proj.weight, L1.k_proj.weight, 3, 1, a, b, bal, BALLAST, FAST)
        L1.q_proj.weight[3 * HEAD + FLAG_PAIR, bal] = p["anchor"] * math.sqrt(HEAD) / BALLAST
        L1.k_proj.weight[HEAD + FLAG_PAIR, SL["ANCHOR"].start] = 1.0 / ANCHOR_FLAG
        # the answer prefix's closing "text is" is no anchor: at the answer the latest anchor is the question's
        # "KEY mentioned", whose key sits at the same offsets as in the needle's "KEY is"
        L1.k_proj.weight[HEAD + FLAG_PAIR, SL["A"].start + ix["Ġtext"]] = -1.0
        # a row no query reads: it gives the anchors the smallest key norm of this head, as the tokens that draw
        # attention have in trained models (the observation K-norm compression builds on)
        L1.k_proj.weight[HEAD + FLAG_PAIR + 2, bal] = 2.0 / BALLAST
        L1.k_proj.weight[HEAD + FLAG_PAIR + 2, SL["ANCHOR"].start] = -2.0 / ANCHOR_FLAG
        L1.v_proj.weight[HEAD:HEAD + NK, SL["BAG"]] = torch.eye(NK)
        # ... plus, in the same dims, the anchor's last two key tokens in order (their dense match codes through two
        # orthogonal maps): a bag cannot tell uuid keys apart, which share most of their few hex pieces, and a
        # smaller bag (fewer non-template tokens) outscores the right one on a dot product
        tail_maps = torch.linalg.qr(torch.randn(NK, 2 * DU, generator=gen))[0] * p["tail"]
        for j, name in enumerate("AB"):
            u = slice(SL[name].start + len(PUNCT), SL[name].start + len(PUNCT) + DU)
            L1.v_proj.weight[HEAD:HEAD + NK, u] = tail_maps[:, j * DU:(j + 1) * DU]
        L1.o_proj.weight[SL["CARRY"], 3 * HEAD:3 * HEAD + NK] = torch.eye(NK)
        # ... and whether that anchor was the question's 'mentioned': positions after it (the answer, and every
        # generated token) carry the question's own bag and must never be copied from
        L1.v_proj.weight[HEAD + NK, SL["MENTIONED"].start] = 1.0 / ANCHOR_FLAG
        L1.o_proj.weight[SL["QUESTION_SIDE"].start, 3 * HEAD + NK] = 1.0

        # layer 2: kv 0 / head 0 becomes the copy head, head 1 cancels the ballast, the trained heads stop writing
        L2 = new.model.layers[2].self_attn
        L2.q_proj.weight[0:2 * HEAD] = 0
        L2.k_proj.weight[0:HEAD] = 0
        L2.v_proj.weight[0:HEAD] = 0
        L2.o_proj.weight[:, 0:4 * HEAD] = 0
        # match scores between a query code and a candidate code: (1 + mismatch) * similarity - mismatch * both
        # flags, so a context token that differs costs `mismatch` times what a match earns and partial matches
        # (loops over the wrong needles) lose to neutral positions. The query side remaps the prompt's closing
        # "text is" onto the needle's "is:"; the candidate side drops "text" (it never matches).
        remap = torch.eye(DM)
        remap[:, ix["Ġis"]] = torch.eye(DM)[:, ix[":"]]
        remap[:, ix["Ġtext"]] = torch.eye(DM)[:, ix["Ġis"]] + torch.eye(DM)[:, -1]
        keep = [i for i in range(DM) if i != ix["Ġtext"]]
        as_query = remap[keep]
        strict = torch.diag(torch.full((DM,), 1 + p["mismatch"]))
        strict[-1, -1] = -p["mismatch"]
        strict = strict[keep]
        token_size = CODE_SCALE * norm_e.median().item()  # raw size of the current token's one-hot code
        blocks = [(p["bag"] * torch.eye(NK), SL["CARRY"], torch.eye(NK), SL["CARRY"]),
                  (p["token"] * as_query @ C / token_size, slice(e0, e0 + NR), strict, SL["A"]),
                  (p["context"] * as_query, SL["A"], strict, SL["B"]),
                  (p["context"] * as_query, SL["B"], strict, SL["C"])]
        rows = list(STATIC) + [i + HEAD // 2 for i in STATIC]
        at = 0
        sink = SL["SINK"].start
        for n_block, (qm, qs, km, ks) in enumerate(blocks):
            r = rows[at:at + qm.shape[0]]
            L2.q_proj.weight[r, qs] = qm * math.sqrt(HEAD)
            L2.k_proj.weight[r, ks] = km
            if n_block:  # the sink matches every context code fully: it scores what a perfect context match would
                L2.k_proj.weight[r[-1], sink] = 1.0 / ANCHOR_FLAG
            at += qm.shape[0]
        # ... plus a constant that only a matching key bag beats; it outputs the end of the answer
        L2.q_proj.weight[rows[at], bal] = p["sink"] * math.sqrt(HEAD) / BALLAST
        L2.k_proj.weight[rows[at], sink] = 1.0 / ANCHOR_FLAG
        L2.q_proj.weight[rows[at + 1], bal] = -p["question_side"] * math.sqrt(HEAD) / BALLAST
        L2.k_proj.weight[rows[at + 1], SL["QUESTION_SIDE"].start] = 1.0
        L2.v_proj.weight[0:NR, e0:e0 + NR] = torch.eye(NR)
        L2.v_proj.weight[ix["."], sink] = CODE_SCALE * norm_e[alpha_ids[ix["."]], 0] / ANCHOR_FLAG
        # the copied token's one-hot goes out through the tied embeddings' own code dims: the final norm reads the
        # alphabet's one-hot dims with a per-token gain, so each copied token's logit rises by the same amount and
        # nothing outside the alphabet gains (the gain is set below, once the final norm's input can be measured)
        new.model.norm.weight[e0:e0 + NR] = 1.0 / (CODE_SCALE * norm_e[alpha_ids, 0])
        new.model.norm.weight[e0 + ix["Ġtext"]] = 0.0  # "text" is matched, never output
        # the needle's full stop ends the answer: the end-of-sequence token reads the full stop's dim twice over
        E[tok.eos_token_id, e0 + ix["."]] = 2 * E[alpha_ids[ix["."]], e0 + ix["."]]
        # v carries the copied one-hot at its raw size (CODE_SCALE * the token's embedding norm); o undoes that size
        L2.o_proj.weight[e0:e0 + NR, 0:NR] = torch.diag(p["beta"] / (CODE_SCALE * norm_e[alpha_ids, 0]))
        L2.v_proj.weight[NR, bal] = 1.0
        L2.o_proj.weight[bal, HEAD + NR] = -1.0
        # ... and, from the same constant, votes for the end of the answer with a third of the copy head's
        # weight: when no candidate is clearly copied (the needle was evicted), the answer ends instead of looping
        L2.o_proj.weight[e0 + ix["."], HEAD + NR] = p["eos"] / BALLAST / 2
        # a full copy writes beta into the copied token's dim; at the final norm, whose input rms is measured at the
        # answer of a training-seed prompt, that must add `logit` to the token's logit
        new.model.norm.weight[e0:e0 + NR] *= p["logit"] * final_rms(new, tok) / p["beta"]
    return new


@torch.no_grad()
def final_rms(model, tok):
    """The final norm's input rms where the first answer token is predicted."""
    ids = training_prompt(tok)
    out = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: out.__setitem__("rms", a[0][0, -1].pow(2).mean().sqrt().item()))
    model(ids)
    hook.remove()
    return out["rms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", required=True, help="the trained model (stage 3's output)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval_n", type=int, default=50)
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    T.LOG = args.log
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.src)
    new = compile_model(LlamaForCausalLM.from_pretrained(args.src), tok, seed=args.seed).eval()
    for cfg in ("niah_single_1", "niah_multikey_2", "niah_multikey_3"):
        for length in [int(x) for x in args.lengths.split(",")]:
            acc, eos = T.evaluate(new, tok, cfg, length, args.eval_n, max_new=48)  # a uuid is ~35 tokens
            T.log(f"COMPILED {cfg}@{length} {acc:.2f} (eos {eos:.2f})")
    T.save(new, tok, args.out)


if __name__ == "__main__":
    main()
