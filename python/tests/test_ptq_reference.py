"""`scalify quantize --model` against an independent PyTorch re-implementation of seed 003's PTQ.

FP8-AMAX casts each linear layer's input activation with b = floor(log2(448 / amax)), and the
paper takes that amax per data sample (Appendix G). Scalify evaluates several windows in one
forward pass, so before issue 46 it took the amax over the whole batch: a window's loss depended on
the windows beside it. The model here makes that visible: the tiny Llama with nine "quiet" tokens
whose embeddings are scaled by 2^-26, so a window of them has activations ~2^-16 of an ordinary
window's; under the batch's amax they flush to zero in e4m3, under their own they keep 3 bits.

The expected losses were computed once with transformers' LlamaForCausalLM and torch's float8
casts (tests/data/ptq/reference_ptq.py --make-test-reference) and committed; this test only runs
the CLI.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

HERE = os.path.dirname(__file__)
ROOT = os.path.join(HERE, "..", "..")
CLI = os.environ.get("SCALIFY_CLI", os.path.join(ROOT, "build", "apps", "scalify", "scalify"))
TINY_LLAMA = os.path.join(ROOT, "tests", "data", "hf", "tiny_llama")
REFERENCE = os.path.join(ROOT, "tests", "data", "ptq", "quiet_tokens_reference.json")


def scale_embedding_rows(shard: str, name: str, rows: list[int], factor: float) -> None:
    """Multiplies rows of an f32 tensor in a safetensors file in place (the format: an 8-byte header
    length, a JSON header, then the data)."""
    with open(shard, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        info = header[name]
        assert info["dtype"] == "F32"
        start, end = info["data_offsets"]
        f.seek(8 + n + start)
        w = np.frombuffer(f.read(end - start), dtype="<f4").reshape(info["shape"]).copy()
        w[rows] *= np.float32(factor)  # a power of two: exact
        f.seek(8 + n + start)
        f.write(w.tobytes())


def write_token_file(path: str, tokens: list[int]) -> None:
    """llm.c's layout: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


@pytest.fixture(scope="module")
def quiet_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict]:
    with open(REFERENCE) as f:
        ref = json.load(f)
    model = str(tmp_path_factory.mktemp("ptq") / "quiet_llama")
    shutil.copytree(TINY_LLAMA, model)
    with open(os.path.join(model, "model.safetensors.index.json")) as f:
        shard = json.load(f)["weight_map"]["model.embed_tokens.weight"]
    scale_embedding_rows(os.path.join(model, shard), "model.embed_tokens.weight", ref["quiet_tokens"], ref["quiet_scale"])
    tokens = os.path.join(model, "tokens.bin")
    write_token_file(tokens, ref["tokens"])
    return model, tokens, ref


def quantize(model: str, tokens: str, context: int, *args: str) -> str:
    r = subprocess.run([CLI, "quantize", "--model", model, "--data", tokens, "--context", str(context), "--windows", "2", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_fp8_amax_takes_each_windows_own_activation_amax(quiet_model: tuple[str, str, dict]) -> None:
    model, tokens, ref = quiet_model
    out = quantize(model, tokens, ref["context"], "--method", "amax")
    f32 = float(re.search(r"^f32: loss ([0-9.]+)", out, re.M).group(1))
    amax = float(re.search(r"^amax: loss ([0-9.]+)", out, re.M).group(1))
    assert f32 == pytest.approx(np.mean(ref["f32"]), rel=2e-6)
    # Per window (the paper) 7.34106, per batch of both windows 6.99720: the quiet window's
    # activations flushed to zero under the ordinary window's bias.
    assert amax == pytest.approx(np.mean(ref["amax_per_window"]), rel=2e-6)
    assert abs(amax - np.mean(ref["amax_per_batch"])) > 0.3


def test_the_sweeps_fp8_amax_row_is_per_window_too(quiet_model: tuple[str, str, dict]) -> None:
    model, tokens, ref = quiet_model
    out = quantize(model, tokens, ref["context"], "--sweep", "0:0")
    row = re.search(r"^\| fp8_amax \|\s*\| ([0-9.]+) \|", out, re.M)
    assert row, out
    assert float(row.group(1)) == pytest.approx(np.mean(ref["amax_per_window"]), abs=6e-5)  # printed to 4 decimals
