"""End to end with a drafter that can only predict from the captured target features.

Both models are built here in closed form (no fitting), so the acceptance is known in advance:

Target (tiny qwen3, 4 layers, untied): attention off (every o_proj = 0), so position t's output
depends on token t alone. Layers 0-2 have random MLPs, layer 3 is the identity (down_proj = 0),
so the output of layer 2, F[x], is the final hidden state of token x. Embedding columns 0 and 1
are the constant 5 and no MLP writes them. The lm_head row of perm[x] is F[x] / rms(F[x]) (with
columns 0 and 1 cleared), so greedy decoding follows ``next = perm[current]``, where perm is a
product of cycles of length P = 9: the text is periodic, t[n] = t[n - P].

Drafter (z-lab layout, 1 layer, reads layer 2): block row j at position s + j must draft
t[s + j] = perm[t[s + j - 1]] = perm[t[s + j - 1 - P]], i.e. the token predicted by the context
feature at offset D = P + 1 behind it. Its one layer is a copy head:

- fc = I, so the context rows are c = F / rms(F); v_proj = I, o_proj = 30 I: the attention output
  is 30x the selected context row, and the target's lm_head turns it into perm[that token];
- keys read only channel 0 (constant over context rows; zeroed for noise rows by their input
  norm weight 0 there), queries only channel 1 (constant over noise rows), and both are fixed
  unit patterns, the query turned back by D positions: after RoPE (base 2, so every channel
  pair turns 0.5-1 rad per position) the score of a key at offset n is
  ``4 g^2 mean_i cos((n - D) theta_i)`` with q/k norm gain g = 6: 144 at n = D and at most
  ~104 at any other offset, a softmax weight of e^-40 for every other key;
- MLP 0, final norm = the target's (1): logits = lm_head(rms_norm(h)).

So with the right features every draft is accepted (tau = B = 8 but for the last step), and the
features are the drafter's only source: zeroed features, features one row off, or features of
another layer leave it guessing (tau about 1). The expected behaviour (periodic text, which
token each row drafts) is derived above by hand; the weights come from that derivation, not
from the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

V, H, P, B = 256, 64, 9, 8
D = P + 1  # context offset the copy head reads
GAIN = 6.0  # q_norm / k_norm weight
COPY = 30.0  # o_proj scale
N_NEW = 40
# Output scale of each target MLP: layer 2 rewrites most of the residual (so layer 1's
# output is no stand-in for it), layer 3 is the identity.
MLP_SCALE = (2.0, 2.0, 6.0, 0.0)


def _rms_rows(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _build_target(path, rng):
    write_tiny_target(path, "qwen3", seed=3)
    w = load_file(path / "model.safetensors")
    E = rng.normal(0.0, 1.0, (V, H))
    E[:, :2] = 5.0
    w["model.embed_tokens.weight"] = E
    F = E.copy()  # float64 closed form of the residual stream (attention is off)
    for i in range(4):
        L = f"model.layers.{i}."
        w[L + "self_attn.o_proj.weight"] = np.zeros((H, H))
        w[L + "post_attention_layernorm.weight"] = np.ones(H)
        gate, up = rng.normal(0, H ** -0.5, (128, H)), rng.normal(0, H ** -0.5, (128, H))
        down = rng.normal(0.0, MLP_SCALE[i] * 128 ** -0.5, (H, 128))
        down[:2] = 0.0  # the constant channels stay constant
        w[L + "mlp.gate_proj.weight"], w[L + "mlp.up_proj.weight"] = gate, up
        w[L + "mlp.down_proj.weight"] = down
        u = _rms_rows(F)
        g = u @ gate.T
        F = F + (g / (1.0 + np.exp(-g)) * (u @ up.T)) @ down.T
    w["model.norm.weight"] = np.ones(H)
    order = rng.permutation(V - 4)  # cycles of length P over 252 tokens; 252..255: a 4-cycle
    perm = np.arange(V)
    for c in range(0, V - 4, P):
        cyc = order[c:c + P]
        perm[cyc] = np.roll(cyc, -1)
    perm[V - 4:] = np.roll(np.arange(V - 4, V), -1)
    head = _rms_rows(F)
    head[:, :2] = 0.0
    lm = np.zeros((V, H))
    lm[perm] = 0.2 * head  # row perm[x] is token x's final state
    w["lm_head.weight"] = lm
    save_file({k: np.asarray(v, np.float32) for k, v in w.items()}, str(path / "model.safetensors"))
    return perm


def _build_drafter(path, target_dir):
    write_tiny_drafter(path, target_dir, seed=4, block_size=B, num_hidden_layers=1,
                       target_layer_ids=(2,), num_key_value_heads=4, rope_theta=2.0)
    cfg = json.loads((path / "config.json").read_text())
    d, nh = cfg["head_dim"], cfg["num_attention_heads"]
    theta = cfg["rope_theta"] ** (-np.arange(0, d, 2) / d)  # [d/2] radians per position
    k_unit = np.concatenate([np.ones(d // 2), np.zeros(d // 2)])  # NEOX pairs (i, i + d/2)
    q_unit = np.concatenate([np.cos(D * theta), -np.sin(D * theta)])  # k_unit turned by -D
    w = {k: np.zeros_like(v) for k, v in load_file(path / "model.safetensors").items()}
    w["fc.weight"] = np.eye(H)
    w["hidden_norm.weight"] = np.ones(H)
    w["norm.weight"] = np.ones(H)
    L = "layers.0."
    w[L + "input_layernorm.weight"] = np.r_[0.0, np.ones(H - 1)]  # noise rows: no channel 0
    w[L + "post_attention_layernorm.weight"] = np.ones(H)
    w[L + "self_attn.q_proj.weight"][:, 1] = np.tile(q_unit, nh)
    w[L + "self_attn.k_proj.weight"][:, 0] = np.tile(k_unit, nh)
    w[L + "self_attn.q_norm.weight"] = np.full(d, GAIN)
    w[L + "self_attn.k_norm.weight"] = np.full(d, GAIN)
    w[L + "self_attn.v_proj.weight"] = np.eye(H)
    w[L + "self_attn.o_proj.weight"] = COPY * np.eye(H)
    save_file({k: np.asarray(v, np.float32) for k, v in w.items()}, str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("feature_drafter")
    rng = np.random.default_rng(0)
    perm = _build_target(root / "t", rng)
    _build_drafter(root / "d", root / "t")
    prompt = [int(rng.integers(V - 4))]
    for _ in range(11):  # a 12-token prompt already on its cycle
        prompt.append(int(perm[prompt[-1]]))
    return root, perm, np.array(prompt)


def _load(root):
    target = TargetModel.from_pretrained(root / "t")
    return target, DFlashDrafter.from_pretrained(root / "d", target)


def _feed(drafter, monkeypatch, transform):
    """Route every feature batch the loop hands to the draft cache through ``transform``."""
    make = drafter.new_cache

    def new_cache(window=None):
        cache = make(window)
        extend = cache.extend
        cache.extend = lambda feats, pos: extend(transform(np.asarray(feats)), pos)
        return cache

    monkeypatch.setattr(drafter, "new_cache", new_cache)


def test_feature_routing_changes_acceptance(setup, monkeypatch):
    root, perm, prompt = setup
    target, drafter = _load(root)
    plain = generate(target, None, prompt, N_NEW).tokens
    # The construction holds: greedy text follows perm (so it is P-periodic).
    seq = np.concatenate([prompt, plain])
    np.testing.assert_array_equal(seq[1:], perm[seq[:-1]])
    spec = generate(target, drafter, prompt, N_NEW)
    assert spec.tokens == plain
    assert spec.tau > 7.0, spec.acceptance_lengths  # every draft accepted (B = 8)

    # Zeroed features: nothing to copy.
    _feed(drafter, monkeypatch, lambda f: np.zeros_like(f))
    zeroed = generate(target, drafter, prompt, N_NEW)
    monkeypatch.undo()
    # Features one row late: row p holds the feature of position p - 1.
    last = {}

    def shift(f):
        prev = last.get("row", f[:1])
        last["row"] = f[-1:]
        return np.concatenate([prev, f[:-1]])

    _feed(drafter, monkeypatch, shift)
    shifted = generate(target, drafter, prompt, N_NEW)
    monkeypatch.undo()
    # Features of another layer: the target captures layer 1 instead of the drafter's layer 2.
    target.set_target_layer_ids([1])
    other_layer = generate(target, drafter, prompt, N_NEW)
    for name, res in (("zeroed", zeroed), ("shifted", shifted), ("layer 1", other_layer)):
        assert res.tokens == plain, name  # lossless whatever the drafter sees ...
        assert res.tau < 2.5, (name, res.acceptance_lengths)  # ... but rarely accepted
