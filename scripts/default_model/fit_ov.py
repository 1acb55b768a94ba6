"""Fit the copy heads' OV circuit (L2 heads 0 and 2) by ridge regression on top of the attention-trained model."""
import random

import torch


@torch.no_grad()
def collect(model, tok, T, rng, n_batches=12, bs=8):
    Z, Y, P = [], [], []
    L = model.model.layers[-1]
    for _ in range(n_batches):
        batch = T.dense_batch(tok, rng, bs) if _ % 2 == 0 else T.long_batch(tok, rng, bs // 2, 1024)
        ids, _ = T.collate(batch)
        out = model(input_ids=ids, output_hidden_states=True)
        h = out.hidden_states[-2]  # input of the last layer
        z = L.input_layernorm(h)
        for i, s in enumerate(batch):
            for p, q in s[2].items():
                Z.append(z[i, q]); Y.append(s[0][p + 1]); P.append(h[i, p])
    return torch.stack(Z), torch.tensor(Y)


@torch.no_grad()
def fit_ov(model, tok, T, seed=1, beta=300.0, lam=1e-6, log=print):
    rng = random.Random(seed)
    Z, Y = collect(model, tok, T, rng)
    E = model.lm_head.weight  # (V, H)
    w = model.model.norm.weight
    cand = sorted(set(Y.tolist()))
    m = E[cand].mean(0)
    R = (E[Y] - m) / w  # desired residual directions
    R = R / R.norm(dim=-1, keepdim=True)
    n = Z.shape[0]
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    tr, te = idx[: int(0.8 * n)], idx[int(0.8 * n):]
    Zt, Rt = Z[tr], R[tr]
    A = Zt.T @ Zt + lam * n * torch.eye(Z.shape[1])
    W = torch.linalg.solve(A, Zt.T @ Rt).T  # (H_out, H_in): r ~ W z
    # decodability check
    for name, sel in (("train", tr), ("test", te)):
        pred = (E @ (w[:, None] * (W @ Z[sel].T))).T.argmax(-1)
        log(f"OV fit {name} acc {(pred == Y[sel]).float().mean().item():.3f} (n={len(sel)})")
    U, S, Vh = torch.linalg.svd(W)
    Aq = U[:, :32] * S[:32].sqrt()
    Bq = S[:32].sqrt()[:, None] * Vh[:32]
    W32 = Aq @ Bq
    pred = (E @ (w[:, None] * (W32 @ Z[te].T))).T.argmax(-1)
    log(f"OV rank-32 test acc {(pred == Y[te]).float().mean().item():.3f}")
    att = model.model.layers[-1].self_attn
    half = beta / 2
    att.v_proj.weight[0:32] = Bq
    att.v_proj.weight[32:64] = Bq
    att.o_proj.weight[:, 0:32] = Aq * half
    att.o_proj.weight[:, 64:96] = Aq * half
    att.o_proj.weight[:, 32:64] = 0
    att.o_proj.weight[:, 96:128] = 0
