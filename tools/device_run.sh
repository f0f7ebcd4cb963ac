#!/bin/bash
# One device call: golden fixtures + their numpy check + default-model training.
# Usage (on the GPU box, repo root): bash tools/device_run.sh MAIN_SECONDS DRAFT_SECONDS
# Results go to $OUT: golden.tgz, models.tar.part*, logs.
MS=${1:-210}; DS=${2:-70}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -c 'import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)'
python3 tools/make_golden.py /tmp/fx 2>&1 | tee $OUT/golden.log
python3 tools/check_golden.py /tmp/fx/* 2>&1 | tee -a $OUT/golden.log
tar czf $OUT/golden.tgz -C /tmp fx
python3 tools/train_default.py --corpus .dev/corpus --out /tmp/models --main-seconds $MS --draft-seconds $DS 2>&1 | tee $OUT/train.log
(cd /tmp && tar cf - models | split -b 15M - $OUT/models.tar.part)
ls -la $OUT; du -sh /tmp/models/*
