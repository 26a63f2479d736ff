"""PaddleFormers integration (paddlenlp_patches.paddleformers): our op as PaddleFormers' "flashmask"
attention entry. Tiny random-init models of several families (fp32, CPU): packed documents equal
each document alone, packed DPO rows equal the separate prompt+answer sequences, our entry equals
PaddleFormers' own eager path with the equivalent dense mask, enable/disable restore the original
entry, bad input raises a clear error. Skipped where paddleformers is not importable (it cannot be
installed next to paddlenlp 3.0.0b4: they need incompatible aistudio-sdk versions)."""

import os
import sys
import types
import warnings

import numpy as np
import pytest

try:
    from paddleformers.nn.attention.eager_attention import eager_attention_forward
    from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS, AttentionInterface
    from paddleformers.transformers.ernie4_5.configuration import Ernie4_5Config
    from paddleformers.transformers.ernie4_5.modeling import Ernie4_5ForCausalLM
    from paddleformers.transformers.gemma3_text.configuration import Gemma3TextConfig
    from paddleformers.transformers.gemma3_text.modeling import Gemma3ForCausalLM
    from paddleformers.transformers.gpt_oss.configuration import GptOssConfig
    from paddleformers.transformers.gpt_oss.modeling import GptOssForCausalLM
    from paddleformers.transformers.llama.configuration import LlamaConfig
    from paddleformers.transformers.llama.modeling import LlamaForCausalLM
except ImportError as e:  # not installed, or installed next to paddlenlp's aistudio-sdk 0.2.6
    if os.environ.get("PFM_REQUIRE_PADDLEFORMERS") == "1":  # tests/run_paddleformers_tests.sh: must run
        raise
    pytest.skip(f"paddleformers is not importable: {e}", allow_module_level=True)

import paddle  # noqa: E402

import paddle_flashmask  # noqa: E402
import paddlenlp_patches as pp  # noqa: E402
from paddle_flashmask import masks  # noqa: E402
from paddlenlp_patches import paddleformers as pfp  # noqa: E402


def _import_deepseek_v3():
    # DeepSeek-V3's MoE imports paddlefleet_ops (not on PyPI) only to ask whether DeepEP (GPU
    # all-to-all) is there; a stub answering "no" is enough on one CPU device.
    stubbed = False
    try:
        import paddlefleet_ops  # noqa: F401
    except ImportError:
        stub = types.ModuleType("paddlefleet_ops")
        stub.is_deep_ep_available = lambda: False
        sys.modules["paddlefleet_ops"] = stub
        stubbed = True
    try:
        from paddleformers.transformers.deepseek_v3.configuration import DeepseekV3Config
        from paddleformers.transformers.deepseek_v3.modeling import DeepseekV3ForCausalLM
        return DeepseekV3Config, DeepseekV3ForCausalLM
    except ImportError:
        return None
    finally:
        if stubbed:
            sys.modules.pop("paddlefleet_ops", None)


DEEPSEEK = _import_deepseek_v3()
V = 61
TOL = 2e-5
COMMON = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=128, fuse_rms_norm=False,
              apply_rope_fusion=False, fuse_swiglu=False, use_fused_linear_cross_entropy=False,
              use_fused_head_and_loss_fn=False)
YARN = {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0}


def _llama(impl):
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, _attn_implementation=impl, **COMMON))


def _gemma3(impl, query_pre_attn_scalar=100):  # head dim 256, GQA 2:1, layer 0 sliding (window 4),
    # layer 1 full; scaling 1/sqrt(100), not 1/sqrt(head_dim) (PaddleFormers' flashmask and sdpa ignore it)
    return Gemma3ForCausalLM(Gemma3TextConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=query_pre_attn_scalar, sliding_window=4, sliding_window_pattern=2,
        _attn_implementation=impl, **COMMON))


def _ernie4_5(impl):  # caches the choice in every layer's attn_implementation
    return Ernie4_5ForCausalLM(Ernie4_5Config(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                              num_key_value_heads=2, _attn_implementation=impl, **COMMON))


def _deepseek_v3(impl):  # MLA (q/k head dim 24, v head dim 12) + MoE, yarn softmax scale
    config_cls, model_cls = DEEPSEEK
    return model_cls(config_cls(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1, n_shared_experts=1, n_group=1,
        topk_group=1, rope_scaling=YARN, _attn_implementation=impl, **COMMON))


def _gpt_oss(impl):  # MoE + attention sinks (exact dense path) + a sliding layer
    return GptOssForCausalLM(GptOssConfig(
        hidden_size=32, intermediate_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], _attn_implementation=impl, **COMMON))


FAMILIES = {"llama": _llama, "gemma3": _gemma3, "ernie4_5": _ernie4_5, "gpt_oss": _gpt_oss}
if DEEPSEEK is not None:
    FAMILIES["deepseek_v3"] = _deepseek_v3
# the op itself runs (no dense fallback) for all but GPT-OSS, whose sinks need the dense path
USES_OP = {"llama", "gemma3", "ernie4_5", "deepseek_v3"}


@pytest.fixture(autouse=True)
def _restore_entry():
    pfp.disable_flashmask()
    yield
    pfp.disable_flashmask()


def build(family, impl="flashmask", seed=0, **kw):
    paddle.seed(seed)
    model = FAMILIES[family](impl, **kw)
    # PaddleFormers 1.2.0's GPT-OSS inference MoE path mixes tokens (transpose([0, 1]) is a no-op),
    # so its output depends on the batch layout; the training path is per token. Dropout is 0.
    model.train() if family == "gpt_oss" else model.eval()
    return model


def logits(model, **kw):
    with paddle.no_grad():
        out = model(**kw)
    return out[0] if isinstance(out, (tuple, list)) else out.logits


def ids_of(n, seed=0):
    return paddle.to_tensor(np.random.default_rng(seed).integers(1, V, (1, n)), dtype="int64")


def positions(*runs):
    return paddle.to_tensor(np.concatenate([np.arange(a, b) for a, b in runs])[None], dtype="int64")


def maxdiff(a, b):
    return float((a.astype("float32") - b.astype("float32")).abs().max())


@pytest.fixture
def op_calls(monkeypatch):
    """Counts calls of paddle_flashmask.flashmask_attention (to tell the op from the dense path)."""
    calls = []
    real = paddle_flashmask.flashmask_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(paddle_flashmask, "flashmask_attention", spy)
    return calls


DOCS = [5, 7, 4]


def alone_kw(family, n):
    # Without mask and indices, Gemma3's full layers switch themselves to PaddleFormers' "sdpa" for
    # good, which ignores `scaling`: keep its references on the "flashmask" entry with causal indices
    return {"attn_mask_startend_row_indices": masks.causal_mask(n)} if family == "gemma3" else {}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_documents_equal_each_document_alone(family, op_calls):
    pfp.enable_flashmask()
    model = build(family)
    S = sum(DOCS)
    ids = ids_of(S)
    bounds = np.cumsum([0] + DOCS)
    packed = logits(model, input_ids=ids, position_ids=positions(*[(0, n) for n in DOCS]),
                    attn_mask_startend_row_indices=masks.causal_document_mask(DOCS))
    assert bool(paddle.isfinite(packed).all())
    assert (len(op_calls) > 0) == (family in USES_OP)
    for a, b in zip(bounds[:-1], bounds[1:]):
        alone = logits(model, input_ids=ids[:, a:b], position_ids=positions((0, b - a)), **alone_kw(family, b - a))
        assert maxdiff(packed[:, a:b], alone) < TOL, (family, a, b)


# two DPO groups (prompt, chosen, rejected) and 3 padding tokens in one row
GROUPS = [(4, [5, 3]), (3, [2, 4])]


# PaddleFormers folds a sliding window into the indices in packed-row index space
# (LTS_j = min(LTS_j, j + w)): a rejected answer then sees fewer prompt tokens than in its own
# sequence (the chosen answer sits in between). Exact against eager, not against the separate run.
SLIDING = {"gemma3", "gpt_oss"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_dpo_rows_equal_separate_sequences(family):
    total = sum(p + sum(ans) for p, ans in GROUPS)
    S = total + 3
    ids = ids_of(S, seed=1)
    runs, spans, o = [], [], 0
    for p, (c, r) in GROUPS:  # rejected positions restart at the prompt length
        runs += [(0, p), (p, p + c), (p, p + r)]
        spans.append((o, p, c, r))
        o += p + c + r
    runs.append((0, S - total))
    kw = dict(input_ids=ids, position_ids=positions(*runs),
              attn_mask_startend_row_indices=masks.share_question_mask(GROUPS, seqlen=S))
    ref = logits(build(family, "eager"), **kw)
    pfp.enable_flashmask()
    model = build(family)
    packed = logits(model, **kw)
    assert maxdiff(packed, ref) < TOL, family
    for o, p, c, r in spans:
        prompt, chosen, rejected = ids[:, o:o + p], ids[:, o + p:o + p + c], ids[:, o + p + c:o + p + c + r]
        pc = logits(model, input_ids=paddle.concat([prompt, chosen], 1), position_ids=positions((0, p + c)),
                    **alone_kw(family, p + c))
        assert maxdiff(packed[:, o:o + p + c], pc) < TOL, family
        if family not in SLIDING:
            pr = logits(model, input_ids=paddle.concat([prompt, rejected], 1), position_ids=positions((0, p + r)))
            assert maxdiff(packed[:, o + p + c:o + p + c + r], pr[:, p:]) < TOL, family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_equals_paddleformers_eager_with_dense_mask(family):
    """Our entry (indices) vs PaddleFormers' eager path, which expands the indices to a dense mask
    (and, for sliding layers, takes the window PaddleFormers folds into them)."""
    S = sum(DOCS)
    ids, pos, idx = ids_of(S, 2), positions(*[(0, n) for n in DOCS]), masks.causal_document_mask(DOCS)
    ref = logits(build(family, "eager"), input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    pfp.enable_flashmask()
    ours = logits(build(family), input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    assert maxdiff(ours, ref) < TOL


@pytest.mark.parametrize("family", sorted(USES_OP & set(FAMILIES)))
def test_training_loss_and_gradients_equal_eager(family):
    """Fine-tuning: the loss and every parameter's gradient through our op (backward included;
    DeepSeek-V3's padded MLA values too) equal PaddleFormers' eager path on a packed batch."""
    assert_training_equals_eager(family)


def assert_training_equals_eager(family, pass_model=False):
    """One training step of ``family`` on a packed batch, eager and through our entry (enabled for
    every model, or by passing the model to enable_flashmask): the loss and every gradient agree."""
    S = sum(DOCS)
    kw = dict(input_ids=ids_of(S, 7), position_ids=positions(*[(0, n) for n in DOCS]),
              attn_mask_startend_row_indices=masks.causal_document_mask(DOCS), labels=ids_of(S, 8))
    res = []
    for impl in ("eager", "flashmask"):
        if impl == "flashmask" and not pass_model:
            pfp.enable_flashmask()
        model = build(family, impl)
        if impl == "flashmask" and pass_model:
            pfp.enable_flashmask(model)
        model.train()
        out = model(**kw)
        loss = out[0] if isinstance(out, (tuple, list)) else out.loss
        loss.backward()
        res.append((float(loss), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (l0, g0), (l1, g1) = res
    assert abs(l0 - l1) < 1e-5 and g0.keys() == g1.keys() and len(g0) > 10
    assert max(maxdiff(g0[n], g1[n]) for n in g0) < 1e-5


@pytest.mark.parametrize("family", ["llama", "gemma3", "ernie4_5"])
def test_no_indices_equals_eager(family, op_calls):
    """Plain causal (no mask) and, for Gemma3's sliding layer, the dense causal+window mask
    PaddleFormers builds: both recognised and run by the op with causal / window_size."""
    ids = ids_of(12, 3)
    kw = {"query_pre_attn_scalar": 256} if family == "gemma3" else {}  # its full layer goes to "sdpa"
    ref = logits(build(family, "eager", **kw), input_ids=ids)
    pfp.enable_flashmask()
    ours = logits(build(family, **kw), input_ids=ids)
    assert maxdiff(ours, ref) < TOL
    if family == "gemma3":  # layer 1 (full, no mask) switches itself to "sdpa" in PaddleFormers
        assert [c.get("window_size") for c in op_calls] == [(3, 0)]
    else:
        assert len(op_calls) == 2 and all(c.get("window_size") is None for c in op_calls)


def test_dense_4d_mask_equals_eager():
    """A dense 4-D keep mask given to the model: eager adds it, our entry takes the exact dense path."""
    S = sum(DOCS)
    ids, pos = ids_of(S, 4), positions(*[(0, n) for n in DOCS])
    keep = paddle.to_tensor(masks.to_dense(masks.causal_document_mask(DOCS), True))
    ref = logits(build("llama", "eager"), input_ids=ids, position_ids=pos, attention_mask=keep)
    pfp.enable_flashmask()
    ours = logits(build("llama"), input_ids=ids, position_ids=pos, attention_mask=keep)
    idx_ours = logits(build("llama"), input_ids=ids, position_ids=pos,
                      attn_mask_startend_row_indices=masks.causal_document_mask(DOCS))
    assert maxdiff(ours, ref) < TOL and maxdiff(idx_ours, ref) < TOL


def test_bidirectional_documents_c4_equal_eager():
    """C = 4 indices (non-causal document mask) through a model: causal=False, as PaddleFormers."""
    S = sum(DOCS)
    ids, pos = ids_of(S, 5), positions(*[(0, n) for n in DOCS])
    lts_ute = masks.document_mask(DOCS)  # C = 2 [LTS, UTE]; PaddleFormers' eager needs C = 4 for causal=False
    idx = paddle.concat([lts_ute[..., :1], paddle.full_like(lts_ute[..., :1], S), paddle.zeros_like(lts_ute[..., :1]),
                         lts_ute[..., 1:]], axis=-1)
    ref = logits(build("llama", "eager"), input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    pfp.enable_flashmask()
    ours = logits(build("llama"), input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    assert maxdiff(ours, ref) < TOL


# ----- the entry itself, against PaddleFormers' eager function with a dense mask from masks.to_dense


class _Attn(paddle.nn.Layer):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def qkv(B=2, H=4, Hk=2, S=12, D=16, Dv=None, seed=0):
    rng = np.random.default_rng(seed)
    t = lambda *s: paddle.to_tensor(rng.standard_normal(s).astype("float32"))  # noqa: E731
    return t(B, H, S, D), t(B, Hk, S, D), t(B, Hk, S, Dv or D)


def test_dense_mask_per_kv_head_additive_equals_bool():
    """A mask head per k/v head [B, Hk, S, S]: taken as a bool mask, and as an additive one alike (the
    additive one had failed in Paddle's broadcast against the query heads' scores)."""
    q, k, v = qkv()
    rng = np.random.default_rng(3)
    keep = np.tril(np.ones((2, 2, 12, 12), bool)) & (rng.random((2, 2, 12, 12)) < 0.7)
    keep[..., 0] = True  # every row keeps a key: the additive form has no empty-row convention
    from paddlenlp_patches.paddleformers import flashmask_attention_forward as entry

    got_bool = entry(_Attn(2), q, k, v, attention_mask=paddle.to_tensor(keep))[0].numpy()
    add = paddle.to_tensor(np.where(keep, 0.0, -1e30).astype("float32"))
    got_add = entry(_Attn(2), q, k, v, attention_mask=add)[0].numpy()
    want = eager_ref(q, k, v, keep, 16 ** -0.5).numpy()
    np.testing.assert_allclose(got_bool, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_add, want, rtol=1e-5, atol=1e-5)


def eager_ref(q, k, v, keep, scale):
    """PaddleFormers' eager attention with an additive mask from a bool keep mask [B|1, Hm, Sq, Sk]."""
    keep = np.asarray(keep)
    H, Hm = q.shape[1], keep.shape[1]
    keep = np.repeat(keep, H // Hm, axis=1) if Hm not in (1, H) else keep
    add = paddle.to_tensor(np.where(keep, 0.0, -1e30).astype("float32"))
    return eager_attention_forward(_Attn(q.shape[1] // k.shape[1]), q, k, v, add, scaling=scale)[0]


@pytest.mark.parametrize("name", ["causal_document", "share_question", "sliding_window", "global_sliding_window",
                                  "causal_blockwise", "prefix_lm_document", "document", "qk_sparse"])
def test_entry_mask_forms_equal_eager(name, op_calls):
    q, k, v = qkv()
    idx, causal = masks.example_mask(name, 12, batch_size=2)
    is_causal = causal if idx.shape[-1] == 2 else None  # C = 2 is the one form that needs the flag
    out, weights = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx,
                                                   scaling=0.3, is_causal=is_causal)
    assert weights is None and list(out.shape) == [2, 12, 4 * 16] and op_calls[0]["causal"] == causal
    assert maxdiff(out, eager_ref(q, k, v, masks.to_dense(idx, causal), 0.3)) < 1e-5


def test_entry_per_kv_head_indices_and_index_layouts():
    q, k, v = qkv()
    idx, _ = masks.example_mask("random_eviction", 12, batch_size=2, num_heads=2)  # Hm = Hk = 2
    ref = eager_ref(q, k, v, masks.to_dense(idx, True), 0.25)
    out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx)[0]
    assert maxdiff(out, ref) < 1e-5
    one = masks.causal_document_mask([5, 7], batch_size=2)  # [B, 1, S, 1]
    ref = eager_ref(q, k, v, masks.to_dense(one, True), 0.25)
    for layout in (one, one[:, :, :, 0], one[:, 0, :, 0], one.astype("int64")):
        out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=layout)[0]
        assert maxdiff(out, ref) < 1e-5
    wrapped = one.astype("int64").numpy()
    wrapped[0, 0, 2, 0] = 2**32  # an int32 cast made it 0: every key masked, zeros, no error
    with pytest.raises(ValueError, match="startend_row_indices values must be query rows in"):
        pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=paddle.to_tensor(wrapped))


@pytest.mark.parametrize("Dq,Dv", [(24, 12), (12, 24)])
def test_entry_value_head_dim_differs(Dq, Dv, op_calls):
    """MLA-style Dv != Dq: zero-padded to one head dim for the op, output sliced back; exact."""
    q, k, v = qkv(D=Dq, Dv=Dv)
    idx = masks.causal_document_mask([5, 7], batch_size=2)
    out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx, scaling=0.2)[0]
    assert list(out.shape) == [2, 12, 4 * Dv] and len(op_calls) == 1
    assert maxdiff(out, eager_ref(q, k, v, masks.to_dense(idx, True), 0.2)) < 1e-5


@pytest.mark.parametrize("Dq,Dv,taken,want", [
    (192, 128, {(192, 128)}, (192, 128)),  # a Hopper GPU: MLA's pair as it is
    (192, 128, {(128, 128), (256, 256)}, None),  # elsewhere: 192/192 has no GPU kernel, dense
    (128, 64, {(128, 128)}, (128, 128)),  # one head dim for q, k and v: v zero-padded
    (64, 128, {(128, 128)}, (128, 128)),  # q/k zero-padded
    (128, 128, {(128, 128)}, (128, 128)),
    (128, 128, set(), None),
])
def test_entry_head_dims_for_the_op(monkeypatch, Dq, Dv, taken, want):
    """What the entry asks of the op per (Dq, Dv), given the pairs the device's kernels take:
    the call's own pair where taken, else both padded to the wider, else the dense path."""
    monkeypatch.setattr(pfp, "_op_supports", lambda q, d, dv: (d, dv) in taken)
    assert pfp._op_head_dims(None, Dq, Dv) == want


def test_entry_value_head_dim_192_128_on_a_hopper_gpu_goes_to_the_op_unpadded(monkeypatch):
    # the GPU's answer stood in by _op_supports (CPU here): 192/128 taken as it is, v not padded
    q, k, v = qkv(D=192, Dv=128, S=8)
    monkeypatch.setattr(pfp, "_op_supports", lambda q_, d, dv: (d, dv) == (192, 128))
    head_dims = []
    real = paddle_flashmask.flashmask_attention
    monkeypatch.setattr(paddle_flashmask, "flashmask_attention",
                        lambda q_, k_, v_, *a, **kw: (head_dims.append((q_.shape[-1], v_.shape[-1])),
                                                      real(q_, k_, v_, *a, **kw))[1])
    out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, scaling=0.1)[0]
    assert head_dims == [(192, 128)]
    assert maxdiff(out, eager_ref(q, k, v, np.tril(np.ones((8, 8), bool))[None, None], 0.1)) < 1e-5


@pytest.fixture
def op_head_dims(monkeypatch):
    """The (q/k, v) head dims of each paddle_flashmask.flashmask_attention call."""
    dims = []
    real = paddle_flashmask.flashmask_attention

    def spy(q_, k_, v_, *args, **kwargs):
        dims.append((q_.shape[-1], v_.shape[-1]))
        return real(q_, k_, v_, *args, **kwargs)

    monkeypatch.setattr(paddle_flashmask, "flashmask_attention", spy)
    return dims


@pytest.mark.parametrize("recorded,op_dims", [({}, (24, 24)), ({24: 12}, (24, 12)), ({24: None}, (24, 24))])
def test_entry_deepseek_placeholder_convention(monkeypatch, op_head_dims, recorded, op_dims):
    """DeepSeek-V3 under "flashmask" scales q by `scaling` itself, pads v and passes a bare
    nn.Layer(): that call must use 1/sqrt(Dq) (an attention layer's `scaling` is honoured). Where
    the model's value head dim is known (enable_flashmask(model)), the op gets v unpadded and the
    output comes back padded with zeros, as the caller slices it."""
    monkeypatch.setattr(pfp, "_PADDED_VALUE_HEAD_DIMS", dict(recorded))
    q, k, v = qkv(H=4, Hk=4, D=24, Dv=12)
    s = 0.26
    ref = eager_ref(q, k, v, np.tril(np.ones((12, 12), bool))[None, None], s)
    pre = s * 24**0.5  # what DeepSeek-V3's scaled_dot_product_attention does for "flashmask"
    v_pad = paddle.concat([v, paddle.zeros([2, 4, 12, 12])], axis=-1)
    out = pfp.flashmask_attention_forward(paddle.nn.Layer(), q * pre, k, v_pad, scaling=pre)[0]
    assert op_head_dims == [op_dims]
    out = out.reshape([2, 12, 4, 24])
    assert float(paddle.abs(out[..., 12:]).max()) == 0.0
    assert maxdiff(out[..., :12].reshape([2, 12, -1]), ref) < 1e-5


@pytest.mark.parametrize("recorded", [{}, {24: 12}])
def test_entry_deepseek_placeholder_without_a_kernel_says_to_pass_the_model(monkeypatch, op_head_dims, recorded):
    """On a GPU whose kernels take 24/12 and 24/16 but not 24/24 (as Hopper's take 192/128, not
    192/192), a DeepSeek-V3 call whose model was not passed to enable_flashmask reaches the entry
    padded to 24/24: value runs in two column pieces of 16 (exact), and the warning says how to
    reach the op in one call; with the model's value head dim known, the op runs once, unpadded,
    and nothing is warned."""
    monkeypatch.setattr(pfp, "_PADDED_VALUE_HEAD_DIMS", dict(recorded))
    monkeypatch.setattr(pfp, "_op_supports", lambda q_, d, dv: (d, dv) in {(24, 12), (24, 16)})
    monkeypatch.setattr(pfp, "_warned", set())
    q, k, v = qkv(H=4, Hk=4, D=24, Dv=12)
    v_pad = paddle.concat([v, paddle.zeros([2, 4, 12, 12])], axis=-1)
    ref = eager_ref(q, k, v, np.tril(np.ones((12, 12), bool))[None, None], 24**-0.5)
    if recorded:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = pfp.flashmask_attention_forward(paddle.nn.Layer(), q, k, v_pad)[0]
        assert op_head_dims == [(24, 12)]
    else:
        with pytest.warns(UserWarning, match=r"no GPU kernel .* head_dim 24: value runs in 2 calls of 24/16 .*"
                                             r"an MLA model \(DeepSeek-V3\) pads value .*enable_flashmask\(model\)"):
            out = pfp.flashmask_attention_forward(paddle.nn.Layer(), q, k, v_pad)[0]
        assert op_head_dims == [(24, 16), (24, 16)]
    out = out.reshape([2, 12, 4, 24])
    assert maxdiff(out[..., :12].reshape([2, 12, -1]), ref) < 1e-5
    assert float(paddle.abs(out[..., 12:]).max()) == 0.0


@pytest.mark.parametrize("taken,calls", [({(24, 16)}, [(24, 16)] * 2), ({(24, 8)}, [(24, 8)] * 3), (set(), [])])
def test_entry_value_in_column_pieces_is_exact_with_gradients(monkeypatch, op_head_dims, taken, calls):
    """Where the kernels take q/k's head dim only with a narrower value (and not one padded head
    dim), v runs in column pieces of the widest such width, the last one zero-padded: the output
    and the gradients of q, k and v are those of one call (each output column depends only on its
    value column; q and k collect the pieces' gradients). With no such width: the dense path."""
    monkeypatch.setattr(pfp, "_op_supports", lambda q_, d, dv: (d, dv) in taken)
    monkeypatch.setattr(pfp, "_warned", set())
    rng = np.random.default_rng(3)
    idx = masks.causal_document_mask([5, 7], batch_size=2)
    leaves = [paddle.to_tensor(rng.standard_normal(s).astype("float32"), stop_gradient=False)
              for s in ((2, 4, 12, 24), (2, 2, 12, 24), (2, 2, 12, 24))]
    dout = paddle.to_tensor(rng.standard_normal((2, 12, 4 * 24)).astype("float32"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pfp.flashmask_attention_forward(_Attn(2), *leaves, attn_mask_startend_row_indices=idx, scaling=0.2)[0]
    assert op_head_dims == calls
    grads = paddle.grad([out], leaves, [dout])
    monkeypatch.setattr(pfp, "_op_supports", lambda q_, d, dv: True)  # one call of 24/24
    ref_out = pfp.flashmask_attention_forward(_Attn(2), *leaves, attn_mask_startend_row_indices=idx, scaling=0.2)[0]
    ref_grads = paddle.grad([ref_out], leaves, [dout])
    assert maxdiff(out, ref_out) < 1e-5
    assert maxdiff(out, eager_ref(*leaves, masks.to_dense(idx, True), 0.2)) < 1e-5
    for g, r in zip(grads, ref_grads):
        assert maxdiff(g, r) < 1e-4 * max(1.0, float(r.abs().max()))


def test_padded_value_head_dims_recorded_from_mla_configs():
    """enable_flashmask(model) records {q/k head dim: v head dim} of MLA configs whose v is the
    narrower; a q/k head dim seen with two value head dims is left padded (None); disable clears."""
    def layer(**config):
        lay = paddle.nn.Layer()
        lay.config = types.SimpleNamespace(**config)
        return lay

    model = paddle.nn.LayerList([layer(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12),
                                 layer(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
                                 layer(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24),  # not narrower
                                 layer(hidden_size=32)])
    pfp.enable_flashmask(model)
    assert pfp._PADDED_VALUE_HEAD_DIMS == {24: 12, 192: 128}
    pfp.enable_flashmask(paddle.nn.LayerList([layer(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8)]))
    assert pfp._PADDED_VALUE_HEAD_DIMS == {24: None, 192: 128}
    pfp.disable_flashmask()
    assert pfp._PADDED_VALUE_HEAD_DIMS == {}


@pytest.mark.skipif(DEEPSEEK is None, reason="DeepSeek-V3 not importable here")
def test_deepseek_v3_passed_in_runs_mla_unpadded_and_equals_eager(op_head_dims):
    """A DeepSeek-V3 model passed to enable_flashmask: every attention call reaches the op as q/k 24
    with v 12 (not padded to 24), and the loss and every gradient equal the eager path's."""
    assert_training_equals_eager("deepseek_v3", pass_model=True)
    assert op_head_dims and set(op_head_dims) == {(24, 12)}


def test_entry_kv_cache_rows_are_bottom_right_causal():
    q, k, v = qkv(S=12)
    q = q[:, :, -3:]  # 3 new rows over 12 cached keys
    keep = np.tril(np.ones((3, 12), bool), k=9)[None, None]
    out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, scaling=0.25)[0]
    assert maxdiff(out, eager_ref(q, k, v, keep, 0.25)) < 1e-5


def test_entry_dense_paths_sink_softcap_dropout_gpu_fallback(monkeypatch, op_calls):
    q, k, v = qkv()
    idx = masks.causal_document_mask([5, 7], batch_size=2)
    keep = masks.to_dense(idx, True)
    pfp._warned.clear()
    # sink: PaddleFormers' eager sink path is the reference
    sink = paddle.to_tensor(np.linspace(-1, 1, 4).astype("float32"))
    add = paddle.to_tensor(np.where(keep, 0.0, -1e30).astype("float32"))
    ref = eager_attention_forward(_Attn(2), q, k, v, add, sink=sink, scaling=0.25)[0]
    with pytest.warns(UserWarning, match="attention sink"):
        out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx, sink=sink)[0]
    assert maxdiff(out, ref) < 1e-5
    # softcap: tanh-capped scores
    with pytest.warns(UserWarning, match="softcap"):
        out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx, softcap=2.0)[0]
    qq, kk = q.numpy(), np.repeat(k.numpy(), 2, axis=1)
    s = 2.0 * np.tanh(np.einsum("bhqd,bhkd->bhqk", qq, kk) * 0.25 / 2.0)
    p = np.exp(np.where(keep, s, -np.inf) - np.where(keep, s, -np.inf).max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    ref = np.einsum("bhqk,bhkd->bqhd", p, np.repeat(v.numpy(), 2, axis=1)).reshape(2, 12, -1)
    assert np.abs(out.numpy() - ref).max() < 1e-5
    # dropout: dense path (the op has none), rows still sum like attention (finite, right shape)
    with pytest.warns(UserWarning, match="dropout"):
        out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx, dropout=0.5)[0]
    assert list(out.shape) == [2, 12, 64] and bool(paddle.isfinite(out).all())
    assert not op_calls
    # a dtype/head dim without a GPU kernel: the same exact dense path, warned once
    monkeypatch.setattr(pfp, "_op_supports", lambda q, d, dv: False)
    with pytest.warns(UserWarning, match="no GPU kernel"):
        out = pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pfp.flashmask_attention_forward(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx)
    assert maxdiff(out, eager_ref(q, k, v, keep, 0.25)) < 1e-5 and not op_calls


def test_entry_gradients_match_eager():
    q, k, v = qkv()
    idx = masks.share_question_mask([(4, [5, 3])], batch_size=2)
    grads = []
    for fn in ("ours", "eager"):
        qs, ks, vs = (paddle.to_tensor(t.numpy(), stop_gradient=False) for t in (q, k, v))
        if fn == "ours":
            out = pfp.flashmask_attention_forward(_Attn(2), qs, ks, vs, attn_mask_startend_row_indices=idx)[0]
        else:
            out = eager_ref(qs, ks, vs, masks.to_dense(idx, True), 0.25)
        (out * out).sum().backward()
        grads.append([t.grad.numpy() for t in (qs, ks, vs)])
    for a, b in zip(*grads):
        assert np.abs(a - b).max() < 1e-4


# ----- enable / disable / context manager


def test_enable_disable_context_manager_restore_original():
    orig = AttentionInterface._global_mapping["flashmask"]
    assert orig is not pfp.flashmask_attention_forward and not pfp.is_enabled()
    pfp.enable_flashmask()
    pfp.enable_flashmask()  # idempotent: the original is still what disable restores
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is pfp.flashmask_attention_forward
    assert ALL_ATTENTION_FUNCTIONS["eager"] is eager_attention_forward
    pfp.disable_flashmask()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is orig
    pfp.disable_flashmask()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is orig
    with pfp.flashmask_enabled():
        assert pfp.is_enabled()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is orig
    pfp.enable_flashmask()
    with pfp.flashmask_enabled():
        pass
    assert pfp.is_enabled()  # was on before the block: stays on
    pfp.disable_flashmask()
    # the package's lazy aliases are the same functions
    assert pp.enable_paddleformers_flashmask is pfp.enable_flashmask
    assert pp.paddleformers_flashmask_enabled is pfp.flashmask_enabled
    assert "enable_paddleformers_flashmask" not in pp.__all__  # `import *` must not need paddleformers


def test_enable_with_model_switches_and_restores_its_choice():
    S = sum(DOCS)
    ids, pos, idx = ids_of(S, 6), positions(*[(0, n) for n in DOCS]), masks.causal_document_mask(DOCS)
    model = build("ernie4_5", "eager")
    ref = logits(model, input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    layers = [m for m in model.sublayers() if isinstance(getattr(m, "attn_implementation", None), str)]
    assert layers and all(m.attn_implementation == "eager" for m in layers)
    with pfp.flashmask_enabled(model):
        assert model.config._attn_implementation == "flashmask"
        assert all(m.attn_implementation == "flashmask" for m in layers)
        ours = logits(model, input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=idx)
    assert model.config._attn_implementation == "eager" and all(m.attn_implementation == "eager" for m in layers)
    assert not pfp.is_enabled() and maxdiff(ours, ref) < TOL
    pfp.enable_flashmask(model)
    pfp.enable_flashmask(model)
    pfp.disable_flashmask(model)
    assert model.config._attn_implementation == "eager" and not pfp.is_enabled()


# ----- bad input


def test_bad_input_raises_clear_errors():
    q, k, v = qkv()
    idx = masks.causal_document_mask([5, 7], batch_size=2)
    call = pfp.flashmask_attention_forward
    with pytest.raises(TypeError, match="int32"):
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx.astype("float32"))
    with pytest.raises(TypeError, match="paddle.Tensor"):
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx.numpy())
    with pytest.raises(ValueError, match="attn_mask_startend_row_indices must be"):
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx.unsqueeze(0))
    with pytest.raises(ValueError, match="attn_mask_startend_row_indices must be"):
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=paddle.concat([idx, idx, idx], -1))
    with pytest.raises(ValueError):  # 13 key columns for 12 keys: the op's shape check
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=paddle.concat([idx, idx[:, :, :1]], 2))
    with pytest.raises(ValueError):  # a value past the sequence: the op's value check
        call(_Attn(2), q, k, v, attn_mask_startend_row_indices=idx + 100)
    with pytest.raises(ValueError, match="not both"):
        call(_Attn(2), q, k, v, attention_mask=paddle.ones([2, 1, 12, 12], "bool"),
             attn_mask_startend_row_indices=idx)
    with pytest.raises(ValueError, match="attention_mask must be"):
        call(_Attn(2), q, k, v, attention_mask=paddle.ones([2, 12], "bool"))
    for shape in ([2, 3, 12, 12], [3, 1, 12, 12]):  # other heads or batch: had been Paddle's broadcast error
        with pytest.raises(ValueError, match=r"attention_mask must be \[1 or 2, 1 or "):
            call(_Attn(2), q, k, v, attention_mask=paddle.ones(shape, "bool"))
    with pytest.raises(ValueError, match="4-D tensor"):
        call(_Attn(2), q[0], k, v)
    with pytest.raises(ValueError, match="do not match"):
        call(_Attn(2), q, k[:, :, :, :8], v)
    pfp.enable_flashmask()  # through a whole model, the same errors
    with pytest.raises(TypeError, match="int32"):
        build("llama")(input_ids=ids_of(12), attn_mask_startend_row_indices=idx[:1].astype("float32"))
