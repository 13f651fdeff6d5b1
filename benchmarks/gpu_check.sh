#!/usr/bin/env bash
# The GPU check (at most 8 minutes on one GPU), from the repository root with the project's environment:
#
#     bash benchmarks/gpu_check.sh
#
# 1. the CUDA tests (tests/training/test_distributed.py -k cuda: every mechanism trains on CUDA with both gradient
#    sources, the noise keeps its law on CUDA, a CUDA checkpoint resumes on the CPU and back);
# 2. DP step time / non-private step time on CUDA for the tutorial CNN, the GroupNorm ResNet (0.31M parameters) and
#    a GroupNorm ResNet-18 (ResNetGN with widths 64-512, two blocks per stage, 11M parameters), CIFAR-10-shaped
#    inputs (random, 3x32x32, 10 classes: the step time does not depend on the pixels), batch 256, for gaussian,
#    lap2 and dirichlet; interleaved rounds and paired ratios (benchmarks/timing.py), CUDA synchronised around each
#    call.
#
# GPU_CHECK_DEVICE, GPU_CHECK_BATCH, GPU_CHECK_ROUNDS and GPU_CHECK_STEPS change the device (default cuda), the
# batch (256), the rounds (5) and the steps per call (3), e.g. for a smoke run on the CPU:
#     GPU_CHECK_DEVICE=cpu GPU_CHECK_BATCH=4 GPU_CHECK_ROUNDS=1 GPU_CHECK_STEPS=1 bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

echo "== CUDA tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/training/test_distributed.py -k cuda -rs

echo "== DP step time / non-private step time"
timeout 300 "$PY" - <<'EOF'
import os
import sys
import warnings

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, "benchmarks")
from timing import fed_by_hand, interleaved  # noqa: E402

from dpnoise.accounting import noise_keywords  # noqa: E402
from dpnoise.models import ResNetGN, build_model  # noqa: E402
from dpnoise.training import make_private  # noqa: E402

DEVICE = torch.device(os.environ.get("GPU_CHECK_DEVICE", "cuda"))
BATCH = int(os.environ.get("GPU_CHECK_BATCH", "256"))
ROUNDS = int(os.environ.get("GPU_CHECK_ROUNDS", "5"))
STEPS = int(os.environ.get("GPU_CHECK_STEPS", "3"))
MODELS = {
    "tutorial CNN": lambda: build_model("cnn", num_classes=10, in_channels=3, input_size=32),
    "GroupNorm ResNet": lambda: build_model("resnet-gn", num_classes=10, in_channels=3, input_size=32),
    "GroupNorm ResNet-18": lambda: ResNetGN(widths=(64, 128, 256, 512), blocks_per_stage=2, groups=32),
}
NOISE = {"gaussian": 1.0, "lap2": 1.0, "dirichlet": 0.25}
warnings.simplefilter("ignore")
torch.manual_seed(0)
data = TensorDataset(torch.randn(10 * BATCH, 3, 32, 32), torch.randint(0, 10, (10 * BATCH,)))
x, y = data.tensors[0][:BATCH].to(DEVICE), data.tensors[1][:BATCH].to(DEVICE)


def timed_steps(module, optimizer):
    def call():
        for _ in range(STEPS):
            module.train()
            optimizer.zero_grad()
            F.cross_entropy(module(x), y).backward()
            optimizer.step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
    return lambda i: call


print(f"{DEVICE} ({torch.cuda.get_device_name(DEVICE) if DEVICE.type == 'cuda' else 'cpu'}), batch {BATCH}, "
      f"{ROUNDS} rounds x {STEPS} steps")
for name, build in MODELS.items():
    model = build().to(DEVICE)
    candidates = {"non-private": timed_steps(model, torch.optim.Adam(model.parameters(), lr=1e-3))}
    for mechanism, noise in NOISE.items():
        model = build()
        module, optimizer, _ = make_private(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                                            DataLoader(data, batch_size=BATCH), mechanism=mechanism, delta=1e-5,
                                            **noise_keywords(mechanism, noise), device=DEVICE, seed=0)
        candidates[mechanism] = timed_steps(module, fed_by_hand(optimizer))
    timings = interleaved(candidates, ROUNDS, warmup=1)
    params = sum(p.numel() for p in model.parameters())
    plain = 1000 * timings.median("non-private") / STEPS
    print(f"{name} ({params:,} parameters): non-private {plain:.1f} ms/step; " + "; ".join(
        f"{m} {1000 * timings.median(m) / STEPS:.1f} ms/step = {timings.ratio(m, 'non-private'):.2f}x" for m in NOISE))
    del candidates, timings, module, optimizer
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
EOF
