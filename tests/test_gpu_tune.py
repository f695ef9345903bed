"""GPU: ``fastconv tune`` end to end in a fresh process with an empty plan cache: a list of
shapes and a model from an entry point are tuned exhaustively (a progress line per step on
stderr, which is not a terminal here), and the choices land in the disk cache."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

_MODEL = """import torch

def make():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                               torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, groups=16))
"""


def _fastconv(*args, env):
    return subprocess.run([sys.executable, "-m", "fastconv.tools.cli", *args], capture_output=True,
                          text=True, timeout=500, env=env)


def test_shapes_and_an_entry_point_model_are_tuned_and_stored(tmp_path):
    env = {**os.environ, "FASTCONV_CACHE_DIR": str(tmp_path / "plans")}
    (tmp_path / "net.py").write_text(_MODEL)
    shapes = ["4x16x15x17:24x16x3x3:padding=1", "4x24x13x11:24x1x5x5:groups=24:padding=2"]
    done = _fastconv("tune", "--shape", shapes[0], "--shape", shapes[1], "--precision",
                     "bf16", "--mode", "fwd,train", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"[1/4] {shapes[0]} fwd" in done.stderr and f"[4/4] {shapes[1]} train" in done.stderr
    assert "tuned 2 shapes bf16 fwd,train:" in done.stdout and " 0 choices" not in done.stdout
    model = _fastconv("tune", "--model", f"{tmp_path / 'net.py'}:make", "--batch", "4",
                      "--size", "32", env=env)
    assert model.returncode == 0, model.stderr[-2000:]
    assert "[1/2]" in model.stderr and "tuned " in model.stdout
    with open(tmp_path / "plans" / "plans-v1.json", encoding="utf-8") as f:
        stored = json.load(f)["entries"]
    for key in ("n4c16k24_in15x17_f3x3", "n4c24k24_in13x11_f5x5", "n4c3k16_in32x32_f3x3"):
        assert any(key in k for k in stored), (key, list(stored)[:6])  # shapes, then model
