"""Run several fine-tune configs in one launched process group; rank 0 writes their summaries.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/cp_finetune_driver.py cases.json out.json

``cases.json``: ``[[config_path, overrides], ...]``. ``out.json``: one
``{"losses", "train_tokens", "eval", "logs"}`` per case. One launch for all cases because the
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
    results = []
    for config, overrides in cases:
        s = finetune.run(config, overrides)
        results.append({"losses": s["losses"], "train_tokens": s["train_tokens"], "eval": s.get("eval"),
                        "logs": s["logs"]})
    if paddle.distributed.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    cli.finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
