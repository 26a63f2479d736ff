"""PaddleNLP LLaMA + flashmask patch: packed batches are exact (vs separate documents and vs a dense
block-diagonal mask through PaddleNLP's own eager path), documents are isolated, every index layout
works, enable/disable/context manager behave, padding never yields NaN."""

import numpy as np
import pytest

from paddlenlp_test_env import require_paddlenlp  # noqa: E402

require_paddlenlp()

import paddle  # noqa: E402

import paddle_flashmask  # noqa: E402
import paddlenlp_patches as pp  # noqa: E402
from paddlenlp_patches import llama_attention  # noqa: E402
from paddlenlp_patches.collators import SFTCollator  # noqa: E402
from paddlenlp_patches.modeling import build_config  # noqa: E402
from paddlenlp_patches.packing import pack_records  # noqa: E402

from paddlenlp.transformers import LlamaForCausalLM  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256}
VOCAB = 97
TOL = 1e-5


@pytest.fixture(autouse=True)
def _restore_patch():
    pp.disable_flashmask()
    yield
    pp.disable_flashmask()


def tiny_model(use_flash_attention=True, seed=0):
    paddle.seed(seed)
    m = LlamaForCausalLM(build_config(None, TINY, VOCAB, use_flash_attention=use_flash_attention))
    m.eval()
    return m


def clone(model, use_flash_attention):
    m = tiny_model(use_flash_attention)
    m.set_state_dict(model.state_dict())
    return m


def make_records(lengths, seed=0, prompt=3):
    rng = np.random.default_rng(seed)
    recs = []
    for L in lengths:
        ids = rng.integers(4, VOCAB, L + 1).tolist()
        labels = [-100] * prompt + ids[prompt + 1:]
        recs.append({"input_ids": ids[:-1], "labels": labels, "attn_mask_startend_row_indices": [L] * L})
    return recs


def to_tensors(batch):
    return {k: paddle.to_tensor(v) for k, v in batch.items()}


def block_diag_mask(rows, S):
    """Independent dense reference: bool [B,1,S,S], tril blocks per document (+ one for padding)."""
    m = np.zeros((len(rows), 1, S, S), dtype=bool)
    for b, r in enumerate(rows):
        off = 0
        for L in r["doc_lens"] + [S - sum(r["doc_lens"])]:
            m[b, 0, off:off + L, off:off + L] = np.tril(np.ones((L, L), dtype=bool))
            off += L
    return m


ROWS = pack_records(make_records([9, 20, 5, 14, 30, 7, 11]), 40, greedy=True)


def test_packing_layout():
    assert [sum(r["doc_lens"]) <= 40 for r in ROWS] == [True] * len(ROWS)
    assert sorted(L for r in ROWS for L in r["doc_lens"]) == sorted([9, 20, 5, 14, 30, 7, 11])
    r = ROWS[0]
    off = 0
    for L in r["doc_lens"]:  # positions restart, LTS = end of the document
        assert r["position_ids"][off:off + L] == list(range(L))
        assert r["attn_mask_startend_row_indices"][off:off + L] == [off + L] * L
        off += L


def test_packed_equals_separate_and_dense_eager():
    model = tiny_model(True)
    eager = clone(model, False)  # PaddleNLP's own eager path, unpatched
    batch = SFTCollator(flash_mask=True)(ROWS)
    S = batch["input_ids"].shape[1]
    pp.enable_flashmask(model)
    loss, logits = model(**to_tensors(batch))[:2]

    pp.disable_flashmask()
    dense = block_diag_mask(ROWS, S)
    dbatch = {k: v for k, v in batch.items() if k != "attn_mask_startend_row_indices"}
    dbatch["attention_mask"] = dense
    loss_d, logits_d = eager(**to_tensors(dbatch))[:2]
    # collator's own dense mode is the same mask
    assert (SFTCollator(flash_mask=False)(ROWS)["attention_mask"] == dense).all()

    real = np.zeros(logits.shape[:2], dtype=bool)
    tok_sum, tok_n = 0.0, 0
    for b, r in enumerate(ROWS):
        off = 0
        for L in r["doc_lens"]:
            sl = slice(off, off + L)
            ids = paddle.to_tensor([r["input_ids"][sl]])
            lab = paddle.to_tensor([r["labels"][sl]])
            l_sep, lg_sep = eager(input_ids=ids, labels=lab)[:2]  # one document, plain causal
            assert np.abs(logits.numpy()[b, sl] - lg_sep.numpy()[0]).max() < TOL
            n = int((lab.numpy() != -100).sum())
            tok_sum += float(l_sep) * n
            tok_n += n
            real[b, sl] = True
            off += L
    assert np.abs((logits.numpy() - logits_d.numpy())[real]).max() < TOL
    assert abs(float(loss) - float(loss_d)) < TOL
    assert abs(float(loss) - tok_sum / tok_n) < TOL


def test_gradients_match_dense_eager():
    model = tiny_model(True)
    eager = clone(model, False)
    batch = SFTCollator(flash_mask=True)(ROWS)
    pp.enable_flashmask(model)
    model.train()
    model(**to_tensors(batch))[0].backward()
    pp.disable_flashmask()
    dbatch = SFTCollator(flash_mask=False)(ROWS)
    eager.train()
    eager(**to_tensors(dbatch))[0].backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    for n, p in eager.named_parameters():
        assert np.isfinite(grads[n]).all()
        assert np.abs(grads[n] - p.grad.numpy()).max() < TOL, n


def test_documents_are_isolated():
    model = pp.enable_flashmask(tiny_model(True))
    row = pack_records(make_records([12, 10, 15], seed=1), 64, greedy=False)
    assert len(row) == 1
    base = model(**to_tensors(SFTCollator()(row)))[1].numpy()
    changed = [dict(r, input_ids=list(r["input_ids"])) for r in row]
    changed[0]["input_ids"][12:22] = [5] * 10  # rewrite document 2 only
    out = model(**to_tensors(SFTCollator()(changed)))[1].numpy()
    assert np.abs(out[0, :12] - base[0, :12]).max() < 1e-6
    assert np.abs(out[0, 22:37] - base[0, 22:37]).max() < 1e-6
    assert np.abs(out[0, 12:22] - base[0, 12:22]).max() > 1e-3


def test_index_layouts_and_gqa():
    model = pp.enable_flashmask(tiny_model(True))
    batch = to_tensors(SFTCollator()(ROWS))
    ref = model(**batch)[1].numpy()
    lts = batch.pop("attn_mask_startend_row_indices")  # [B,1,S] int32
    B, _, S = lts.shape
    cols = paddle.arange(S, dtype="int32").reshape([1, 1, S])
    layouts = {
        "[B,1,S,1]": lts.unsqueeze(-1),
        "[B,S]": lts.squeeze(1),
        "int64": lts.astype("int64"),
        "[B,Hk,S,1]": paddle.tile(lts.unsqueeze(-1), [1, 2, 1, 1]),
        "C=2 (LTS,LTE=S)": paddle.stack([lts, paddle.full_like(lts, S)], axis=-1),
        # non-causal C=4 encoding of the same causal-document mask: UTE_j = j masks rows i < j
        "C=4": paddle.stack([lts, paddle.full_like(lts, S), paddle.zeros_like(lts),
                             paddle.tile(cols, [B, 1, 1])], axis=-1),
    }
    for name, ind in layouts.items():
        out = model(attn_mask_startend_row_indices=ind, **batch)[1].numpy()
        assert np.abs(out - ref).max() < TOL, name
    # GQA: use_flash_attention=False repeats k/v before the patched function; same result
    other = pp.enable_flashmask(clone(model, False))
    out = other(attn_mask_startend_row_indices=lts, **batch)[1].numpy()
    assert np.abs(out - ref).max() < TOL


def test_enable_before_or_after_build_idempotent_and_disable(monkeypatch):
    calls = []
    real_op = paddle_flashmask.flashmask_attention
    monkeypatch.setattr(paddle_flashmask, "flashmask_attention", lambda *a, **k: calls.append(1) or real_op(*a, **k))
    batch = to_tensors(SFTCollator()(ROWS))
    no_idx = {k: v for k, v in batch.items() if k != "attn_mask_startend_row_indices"}

    built_before = tiny_model(False)  # eager config, bound to PaddleNLP's function
    ignored = built_before(**batch)[1].numpy()  # unpatched: indices silently ignored
    assert np.abs(ignored - built_before(**no_idx)[1].numpy()).max() == 0
    assert not calls

    pp.enable_flashmask()  # without the model: its layers keep PaddleNLP's function ...
    pp.enable_flashmask(built_before)  # ... until it is passed in
    pp.enable_flashmask(built_before)  # idempotent
    layer = built_before.llama.layers[0].self_attn
    assert layer._pfm_orig_attn_func is llama_attention._STATE["orig_sdpa"]
    packed = built_before(**batch)[1].numpy()
    assert calls and np.abs(packed - ignored).max() > 1e-3

    built_after = clone(built_before, True)  # built while enabled: bound to the wrapper
    assert np.abs(built_after(**batch)[1].numpy() - packed).max() < TOL

    pp.disable_flashmask(built_before)
    assert layer.attn_func is llama_attention._STATE["orig_sdpa"]
    assert np.abs(built_before(**batch)[1].numpy() - ignored).max() == 0
    with pp.flashmask_enabled(built_before):
        assert pp.is_enabled()
        assert np.abs(built_before(**batch)[1].numpy() - packed).max() < TOL
    assert not pp.is_enabled()
    assert np.abs(built_before(**batch)[1].numpy() - ignored).max() == 0


def test_without_indices_causal_through_op_and_dense_masks_exact(monkeypatch):
    model = tiny_model(True)
    eager = clone(model, False)
    ids = paddle.to_tensor(np.random.default_rng(3).integers(4, VOCAB, (2, 24)))
    ref = eager(input_ids=ids)[0].numpy()  # unpatched eager, plain causal
    calls = []
    real_op = paddle_flashmask.flashmask_attention
    monkeypatch.setattr(paddle_flashmask, "flashmask_attention", lambda *a, **k: calls.append(k) or real_op(*a, **k))
    pp.enable_flashmask(model)
    pp.enable_flashmask(eager)
    assert np.abs(model(input_ids=ids)[0].numpy() - ref).max() < TOL
    assert np.abs(eager(input_ids=ids)[0].numpy() - ref).max() < TOL  # causal 4-D mask recognised
    assert calls and all(k.get("causal") for k in calls)
    # a padding mask is not causal: exact dense path, same as PaddleNLP's eager path
    pad = np.ones((2, 24), dtype="int64")
    pad[1, 17:] = 0
    calls.clear()
    got = model(input_ids=ids, attention_mask=paddle.to_tensor(pad))[0].numpy()
    pp.disable_flashmask()
    want = eager(input_ids=ids, attention_mask=paddle.to_tensor(pad))[0].numpy()
    assert not calls
    assert np.abs(got[:, :17] - want[:, :17]).max() < TOL and np.abs(got - want).max() < 1e-4


def test_padding_rows_without_keys_give_no_nan():
    """PaddleNLP's preference_collate_fn pads indices with the last value: padding rows then see
    no key at all. The op returns 0 for them and the gradients stay finite."""
    model = pp.enable_flashmask(tiny_model(True))
    model.train()
    rows = pack_records(make_records([10, 6], seed=4), 32, greedy=False)
    batch = SFTCollator()(rows)
    S = 24
    for k in ("input_ids", "position_ids", "labels"):
        batch[k] = np.pad(batch[k], ((0, 0), (0, S - batch[k].shape[1])),
                          constant_values=-100 if k == "labels" else 0)
    lts = batch["attn_mask_startend_row_indices"]
    batch["attn_mask_startend_row_indices"] = np.pad(lts, ((0, 0), (0, 0), (0, S - lts.shape[2])), mode="edge")
    loss, logits = model(**to_tensors(batch))[:2]
    loss.backward()
    assert np.isfinite(logits.numpy()).all() and np.isfinite(float(loss))
    for n, p in model.named_parameters():
        assert np.isfinite(p.grad.numpy()).all(), n
    ref = model(**to_tensors(SFTCollator()(rows)))[1].numpy()
    assert np.abs(logits.numpy()[:, :16] - ref[:, :16]).max() < TOL


def test_lora_wrapped_model_is_rebound():
    from paddlenlp_patches.lora import apply_lora

    base = tiny_model(False)
    dense_ref = clone(base, False)
    lmodel = apply_lora(base, r=4)
    pp.enable_flashmask(lmodel)
    got = lmodel(**to_tensors(SFTCollator()(ROWS)))[1].numpy()
    pp.disable_flashmask()
    want = dense_ref(**to_tensors(SFTCollator(flash_mask=False)(ROWS)))[1].numpy()
    real = SFTCollator()(ROWS)["labels"] != -100
    assert np.abs((got - want)[real]).max() < TOL


def test_gpu_fallback_asks_for_the_calls_value_head_dim(monkeypatch):
    # On GPU the op is taken where gpu_supports says so for q's head dim AND v's (192/128 runs on the
    # Hopper kernels, 192/192 nowhere); a stand-in GPU query, the answer recorded.
    class _GpuPlace:
        def is_gpu_place(self):
            return True

    class _Tensor:
        def __init__(self, dim):
            self.place, self.shape = _GpuPlace(), [1, 8, 2, dim]

    asked = []
    monkeypatch.setattr(paddle_flashmask.attention, "gpu_supports",
                        lambda q, d, deterministic=None, value_head_dim=None: asked.append((d, value_head_dim)) or True)
    assert llama_attention._op_supports(_Tensor(192), _Tensor(128))
    assert llama_attention._op_supports(_Tensor(64), _Tensor(64))
    assert asked == [(192, 128), (64, 64)]
    cpu = paddle.zeros([1, 8, 2, 192])
    assert llama_attention._op_supports(cpu, paddle.zeros([1, 8, 2, 128]))  # CPU: every call, not asked
    assert len(asked) == 2


def test_a_prefix_lm_dense_mask_is_not_taken_for_causal():
    # PaddleNLP's is_casual_mask only asks that nothing below the diagonal be masked: with
    # use_flash_attention on, LlamaModel.forward dropped this prefix-LM mask as "causal"
    S, prefix = 20, 6
    keep = np.tril(np.ones((S, S), dtype=bool))
    keep[:prefix, :prefix] = True
    mask = paddle.to_tensor(np.broadcast_to(keep, (2, 1, S, S)).copy())
    ids = paddle.to_tensor(np.random.default_rng(5).integers(4, VOCAB, (2, S)))
    model = tiny_model(True)
    eager = clone(model, False)
    want = eager(input_ids=ids, attention_mask=mask)[0].numpy()  # PaddleNLP's own eager path
    causal = eager(input_ids=ids)[0].numpy()
    assert np.abs(want - causal).max() > 1e-2  # the prefix matters
    original = llama_attention.llama_modeling.is_casual_mask
    pp.enable_flashmask(model)
    assert np.abs(model(input_ids=ids, attention_mask=mask)[0].numpy() - want).max() < TOL
    pp.disable_flashmask(model)
    assert llama_attention.llama_modeling.is_casual_mask is original


def test_indices_out_of_int32_or_not_a_tensor_are_errors():
    pp.enable_flashmask()
    model = tiny_model(True)
    ids = paddle.to_tensor(np.random.default_rng(6).integers(4, VOCAB, (1, 16)))
    good = np.full((1, 1, 16), 16, dtype="int64")
    for wrapped in (2**32, 2**32 + 16, -(2**32)):  # a plain int32 cast gave 0, 16 and 0: no error
        bad = good.copy()
        bad[0, 0, 3] = wrapped
        with pytest.raises(ValueError, match="startend_row_indices values must be query rows in"):
            model(input_ids=ids, attn_mask_startend_row_indices=paddle.to_tensor(bad))
    for not_a_tensor in (good, good.tolist()):
        with pytest.raises(TypeError, match="must be a paddle.Tensor, got"):
            model(input_ids=ids, attn_mask_startend_row_indices=not_a_tensor)


def test_the_index_values_are_checked_once_a_batch_not_once_a_layer(monkeypatch):
    # each layer had normalized the batch's indices into a new tensor, so the op checked the
    # values (a host sync on GPU) once per layer per forward
    from paddle_flashmask import attention as op_attention

    from paddlenlp_patches.indices import as_bhsc_int32

    checks = []
    real = op_attention._check_index_values

    def counted(ops, indices, seqlen_q, causal):
        checks.append(op_attention._already_checked(indices, seqlen_q, causal))
        return real(ops, indices, seqlen_q, causal)

    monkeypatch.setattr(op_attention, "_check_index_values", counted)
    pp.enable_flashmask()
    model = tiny_model(True)  # 2 layers
    ids = paddle.to_tensor(np.random.default_rng(7).integers(4, VOCAB, (2, 24)))
    ind = paddle.to_tensor(np.full((2, 1, 24), 24, dtype="int32"))
    for _ in range(3):
        model(input_ids=ids, attn_mask_startend_row_indices=ind)
    assert len(checks) == 6 and checks.count(False) == 1  # read back once, for the first layer
    assert as_bhsc_int32(ind) is as_bhsc_int32(ind)
    before = as_bhsc_int32(ind)
    ind[0, 0, 3] = 5  # changed in place: normalized (and checked) again
    assert as_bhsc_int32(ind) is not before and int(as_bhsc_int32(ind)[0, 0, 3, 0]) == 5
