"""Data path: tokenizer, jsonl validation (bad data -> clear errors), documented truncation,
packing, collators; layouts equal PaddleNLP's own pipeline (preprocess_preference_data +
ZeroPaddingMapDataset + preference_collate_fn) and our mask builders."""

import json
import logging

import numpy as np
import pytest

from paddlenlp_test_env import require_paddlenlp  # noqa: E402

require_paddlenlp()

from paddle_flashmask import masks  # noqa: E402
from paddlenlp_patches.collators import DPOCollator, RMCollator, SFTCollator, lts_to_dense  # noqa: E402
from paddlenlp_patches.data import DataFormatError, _Encoder, load_records, tokenize_dpo, tokenize_sft  # noqa: E402
from paddlenlp_patches.packing import pack_groups, pack_records  # noqa: E402
from paddlenlp_patches.tokenizer import CharTokenizer, load_tokenizer  # noqa: E402

TOK = CharTokenizer()
ENC = _Encoder(TOK)


def write_jsonl(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(p)


def test_char_tokenizer_roundtrip_and_save(tmp_path):
    ids = TOK.encode("add(1,2)=")["input_ids"]
    assert ids[0] == TOK.bos_token_id and TOK.decode(ids) == "add(1,2)="
    assert TOK("é", add_special_tokens=False)["input_ids"] == [TOK.unk_token_id]
    TOK.save_pretrained(str(tmp_path))
    assert load_tokenizer(str(tmp_path)).encode("xyz")["input_ids"] == TOK.encode("xyz")["input_ids"]
    assert isinstance(load_tokenizer(None), CharTokenizer)


def test_sft_record_layout_labels_preshifted():
    rec = tokenize_sft({"src": "ab=", "tgt": "ba"}, ENC, 64, 32)
    full = TOK.encode("ab=")["input_ids"] + TOK.encode("ba", add_special_tokens=False)["input_ids"] + [2]
    assert rec["input_ids"] == full[:-1]
    # labels[t] is the target of input_ids[t]: prompt masked, last prompt token predicts the answer
    assert rec["labels"] == [-100] * 3 + full[4:]
    assert rec["attn_mask_startend_row_indices"] == [len(full) - 1] * (len(full) - 1)
    multi = tokenize_sft({"src": ["a=", "b="], "tgt": ["x", "y"]}, ENC, 64, 32)
    assert sum(lab != -100 for lab in multi["labels"]) == 4  # x, eos, y, eos


@pytest.mark.parametrize("row, msg", [
    ({"src": "a"}, "missing field 'tgt'"),
    ({"tgt": "a"}, "missing field 'src'"),
    ({"src": "a", "tgt": "   "}, "empty answer"),
    ({"src": "a", "tgt": 3}, "must be a string"),
    ({"src": ["a", "b"], "tgt": ["x"]}, "same non-zero number of rounds"),
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "invalid JSON"),
])
def test_sft_bad_data_clear_errors(tmp_path, row, msg):
    path = write_jsonl(tmp_path, [{"src": "ok", "tgt": "fine"}, row])
    with pytest.raises(DataFormatError, match=msg) as e:
        load_records(path, TOK, "sft", 64, 32)
    assert f"{path}:2" in str(e.value)


@pytest.mark.parametrize("row, msg", [
    ({"prompt": "p", "chosen": "a"}, "missing field 'rejected'"),
    ({"prompt": "p", "chosen": "a", "rejected": ""}, "empty rejected answer"),
    ({"src": "p", "tgt": [], "response": ["a"], "sort": [1]}, "list of 2 strings"),
    ({"src": "p", "tgt": [], "response": ["a", "b"], "sort": [1, 1]}, "must differ"),
    ({"src": "p", "tgt": [], "response": ["a", "b"], "sort": [float("nan"), 1]}, "2 finite numbers"),
    ({"src": "p", "tgt": [], "response": ["a", "b"], "sort": [float("inf"), 1]}, "2 finite numbers"),
    ({"src": "p", "tgt": [], "response": ["a", "b"], "sort": [True, False]}, "2 finite numbers"),
    ({"src": ["p", "q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}, r"len\(src\) must be len\(tgt\) \+ 1"),
    ({"src": "p", "response": ["a", ""], "sort": [0, 1]}, "empty chosen answer"),
    ({"src": "p", "tgt": []}, "missing field"),
])
@pytest.mark.parametrize("task", ["dpo", "rm"])
def test_preference_bad_data_clear_errors(tmp_path, row, msg, task):
    path = write_jsonl(tmp_path, [row])
    with pytest.raises(DataFormatError, match=msg):
        load_records(path, TOK, task, 64, 32)


def test_overflow_policies(tmp_path, caplog):
    long_ex = {"src": "q" * 30, "tgt": "abcdefghij" * 4}  # 1 + 30 + 40 + 1 = 72 tokens
    path = write_jsonl(tmp_path, [{"src": "a=", "tgt": "b"}, long_ex])
    with pytest.raises(DataFormatError, match=r"72 tokens, more than max_length=48"):
        load_records(path, TOK, "sft", 48, 16, on_overflow="error")
    with caplog.at_level(logging.WARNING, logger="paddlenlp_patches"):
        assert len(load_records(path, TOK, "sft", 48, 16, on_overflow="skip")) == 1
    assert "skipped 1" in caplog.text
    rec = load_records(path, TOK, "sft", 48, 16, on_overflow="truncate")[1]
    ids, labels = rec["input_ids"], rec["labels"]
    assert len(ids) + 1 == 48
    # BOS kept, prompt cut on the left to src_length=16 tokens, answer cut on the right (no EOS)
    assert ids[0] == TOK.bos_token_id and ids[1:16] == TOK.encode("q" * 15, False)["input_ids"]
    answer = TOK.encode("abcdefghij" * 4, False)["input_ids"]
    assert ids[16:] == answer[:31] and labels == [-100] * 15 + answer[:32]
    with pytest.raises(ValueError, match="must be smaller"):
        load_records(path, TOK, "sft", 48, 48)
    # multi-round: the oldest round goes first
    multi = tokenize_sft({"src": ["x" * 30, "y="], "tgt": ["z" * 10, "w"]}, ENC, 20, 8)
    assert TOK.decode(multi["input_ids"]) == "y=w"


def test_dpo_truncation_keeps_valid_layout():
    ex = {"prompt": "p" * 40, "chosen": "c" * 30, "rejected": "r" * 10}
    with pytest.raises(DataFormatError, match="max_seq_len=48"):
        tokenize_dpo(ex, ENC, 48, 16, on_overflow="error")
    rec = tokenize_dpo(ex, ENC, 48, 16)
    P, C, R = rec["response_indexs"][0][0], *np.diff(rec["response_indexs"][0])
    assert P + C + R == len(rec["input_ids"]) == 48 and P == 16 and C >= 1 and R >= 1
    c_lab = [x for x in rec["chosen_labels"] if x]
    assert c_lab == TOK.encode("c" * 30, False)["input_ids"][:C]  # true next tokens, EOS cut off


def _pnlp_pref_records(examples, flash_mask=True):
    from types import SimpleNamespace

    from paddlenlp.trl import preprocess_preference_data

    da = SimpleNamespace(max_seq_len=512, max_prompt_len=256)
    return [preprocess_preference_data(dict(e), TOK, da, SimpleNamespace(flash_mask=flash_mask)) for e in examples]


PREF = [{"src": f"reverse({w})=", "tgt": [], "response": [w[::-1], w], "sort": [1, 0]}
        for w in ["abc", "hello", "xy", "flashmask", "zzzq", "tiny"]]


def test_dpo_records_and_packing_equal_paddlenlp_pipeline():
    from functools import partial

    from paddlenlp.datasets import ZeroPaddingMapDataset
    from paddlenlp.trl import preference_collate_fn

    ours = [tokenize_dpo(e, ENC, 512, 256) for e in PREF]
    theirs = _pnlp_pref_records(PREF)
    for a, b in zip(ours, theirs):
        assert a["input_ids"] == b["input_ids"] and a["position_ids"] == b["position_ids"]
        assert a["chosen_labels"] == b["response_0_labels"] and a["rejected_labels"] == b["response_1_labels"]
        assert a["response_indexs"][0] == b["response_indexs"][:3]
        assert a["attn_mask_startend_row_indices"] == b["attn_mask_startend_row_indices"]
    dense = _pnlp_pref_records(PREF, flash_mask=False)
    for a, b in zip(ours, dense):
        assert (lts_to_dense(np.asarray(a["attn_mask_startend_row_indices"])) == b["attention_mask"]).all()

    rows = pack_records(ours, 48, greedy=False)
    zp = ZeroPaddingMapDataset(theirs, None, 48)
    assert len(rows) == len(zp) and len(rows) < len(PREF)
    S = max(len(r["input_ids"]) for r in rows)
    mine = DPOCollator(flash_mask=True)(rows)
    ref = partial(preference_collate_fn, max_seq_len=S)([zp[i] for i in range(len(zp))])
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        for k in ("input_ids", "position_ids", "chosen_labels", "rejected_labels"):
            assert (mine[k][b, :n] == ref[k][b, :n]).all(), k
        assert (mine["attn_mask_startend_row_indices"][b, :, :n] == ref["attn_mask_startend_row_indices"][b, :, :n]).all()
    assert (mine["response_indexs"] == ref["response_indexs"]).all()
    # and equal to the share-question builder (padding is its own causal document in both)
    groups = [[] for _ in rows]
    for b, r in enumerate(rows):
        off = 0
        for ri in r["response_indexs"]:
            groups[b].append((ri[0] - off, [ri[1] - ri[0], ri[2] - ri[1]]))
            off = ri[2]
    built = masks.share_question_mask(groups, seqlen=S).numpy()[:, :, :, 0]
    assert (built == mine["attn_mask_startend_row_indices"]).all()


def test_rm_records_and_collator(tmp_path):
    recs = load_records(write_jsonl(tmp_path, PREF), TOK, "rm", 64, 32)
    r0 = recs[0]
    P = len(TOK.encode("reverse(abc)=")["input_ids"])
    assert r0["response_indexs"] == [[P + 3, P + 7]]  # last token (EOS) of chosen / rejected
    assert r0["input_ids"][P + 3] == r0["input_ids"][P + 7] == TOK.eos_token_id
    assert r0["position_ids"][P + 4] == P  # rejected restarts at the prompt length
    rows = pack_records(recs, 64)
    batch = RMCollator()(rows)
    assert batch["response_indexs"].shape == (len(PREF), 3)
    b, c, r = batch["response_indexs"].T
    assert (batch["input_ids"][b, c] == TOK.eos_token_id).all() and (batch["input_ids"][b, r] == TOK.eos_token_id).all()


def test_prompt_chosen_rejected_format_equals_paddlenlp_format():
    a = tokenize_dpo({"prompt": "reverse(abc)=", "chosen": "cba", "rejected": "abc"}, ENC, 64, 32)
    b = tokenize_dpo({"src": "reverse(abc)=", "tgt": [], "response": ["abc", "cba"], "sort": [0, 1]}, ENC, 64, 32)
    assert a == b


def test_sft_packing_equals_zero_padding_dataset_and_builder(tmp_path):
    from paddlenlp.datasets import ZeroPaddingMapDataset

    recs = load_records(write_jsonl(tmp_path, [{"src": f"q{i}" * (i % 5 + 1), "tgt": "a" * (i % 7 + 1)} for i in range(40)]),
                        TOK, "sft", 64, 32)
    rows = pack_records(recs, 64, greedy=False)
    zp = ZeroPaddingMapDataset(recs, None, 64)
    assert len(rows) == len(zp)
    for r, z in zip(rows, zp):
        assert r["input_ids"] == list(z["input_ids"]) and r["labels"] == list(z["labels"])
        assert r["attn_mask_startend_row_indices"] == list(z["attn_mask_startend_row_indices"])
    batch = SFTCollator(pad_token_id=0)(rows)
    S = batch["input_ids"].shape[1]
    built = masks.causal_document_mask([r["doc_lens"] for r in rows], seqlen=S).numpy()[:, :, :, 0]
    assert (built == batch["attn_mask_startend_row_indices"]).all()
    assert batch["attn_mask_startend_row_indices"].dtype == np.int32 and batch["input_ids"].dtype == np.int64
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        assert (batch["labels"][b, n:] == -100).all() and (batch["attn_mask_startend_row_indices"][b, 0, n:] == S).all()
    dense = SFTCollator(flash_mask=False)(rows)["attention_mask"]
    assert dense.shape == (len(rows), 1, S, S) and (dense == masks.to_dense(built[:, :, :, None], True)).all()
    counted = SFTCollator(count_tokens=True)(rows)["_num_real_tokens"]
    assert int(counted[0]) == sum(len(r["input_ids"]) for r in rows)


def test_pack_groups():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, 300).tolist()
    for greedy in (False, True):
        groups = pack_groups(lengths, 64, greedy=greedy)
        assert sorted(i for g in groups for i in g) == list(range(300))
        assert all(sum(lengths[i] for i in g) <= 64 for g in groups)
    assert len(pack_groups(lengths, 64, True)) <= len(pack_groups(lengths, 64, False))
    with pytest.raises(ValueError, match="1..64 tokens"):
        pack_groups([10, 65], 64)
