"""Run several fine-tune configs in one launched process group; rank 0 writes their summaries.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/cp_finetune_driver.py cases.json out.json

``cases.json``: ``[[config_path, overrides], ...]``; a case ``[config_path, overrides,
{"expect_error": true}]`` must raise: its entries are ``{"error": "<type>: <message>"}`` (every
rank records its own, so a test can check that every rank refused it). ``out.json`` (rank 0): one
``{"losses", "train_tokens", "eval", "logs"}`` per case; ``out.json.rank<r>`` (every rank r): one
``{"local_losses", "dataset_rank"}`` per case (that rank's own losses; the logged ``losses`` are
the mean over all ranks). One launch for all cases because the
start-up (Paddle, PaddleNLP, fleet's groups) costs more than a 20-step run of the tiny model.
Used by tests/test_context_parallel_finetune.py (ROOT must be on PYTHONPATH).
"""

import json
import sys


def main(cases_path, out_path):
    import paddle

    from paddlenlp_patches import cli, finetune

    with open(cases_path) as f:
        cases = json.load(f)
    results, local = [], []
    for config, overrides, *opt in cases:
        if opt and opt[0].get("expect_error"):
            try:
                finetune.run(config, overrides)
            except Exception as e:  # noqa: BLE001 (recorded for the test to check)
                err = {"error": f"{type(e).__name__}: {e}"}
            else:
                err = {"error": None}
            results.append(err)
            local.append(err)
            continue
        s = finetune.run(config, overrides)
        results.append({"losses": s["losses"], "train_tokens": s["train_tokens"], "eval": s.get("eval"),
                        "logs": s["logs"]})
        local.append({"local_losses": s["local_losses"], "dataset_rank": s["trainer"].args.dataset_rank})
    rank = paddle.distributed.get_rank()
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump(local, f)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    cli.finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
