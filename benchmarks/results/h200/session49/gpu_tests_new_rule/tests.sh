#!/usr/bin/env bash
OUT=$OUT STAGES=tests TEST_SELECT="fa2 and (forms_lengths or dkv_direct or gqa or head_groups or fully_masked or every_row or long_ctas_first_head_dims)" TEST_TIMEOUT_S=420 bash benchmarks/device/gpu_suite.sh
