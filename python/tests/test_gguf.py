"""A GGUF file wherever a model folder is read (issue 46): ``train(init=FILE.gguf)`` starts from the
weights the Hugging Face folder it was converted from holds (tests/data/gguf/tiny_llama_gqa.gguf,
written as llama.cpp's converter writes tests/data/hf/tiny_llama_gqa), and ``scalify eval --model``
on the real model gives transformers' loss per token (tests/data/gguf/smollm2.json)."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import scalify

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
GGUF = DATA / "gguf" / "tiny_llama_gqa.gguf"
FOLDER = DATA / "hf" / "tiny_llama_gqa"
CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))


def smollm2() -> Path:
    if "SCALIFY_SMOLLM2" in os.environ:
        return Path(os.environ["SCALIFY_SMOLLM2"])
    cache = os.environ.get("SCALIFY_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "scalify")
    return Path(cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> str:
    """An llm.c token file (uint16 layout) of ids in the tiny model's vocabulary of 1000."""
    ids = (np.arange(4000) * 37 % 1000).astype(np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, ids.size]
    path = tmp_path_factory.mktemp("data") / "ids.bin"
    path.write_bytes(header.tobytes() + ids.tobytes())
    return str(path)


def bf16_tensors(path: Path) -> dict:
    """A safetensors file's BF16 tensors as float32, read from the format itself (not by scalify)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "BF16"
        begin, end = t["data_offsets"]
        bits = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.uint16).astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(t["shape"])
    return out


def test_training_starts_from_a_gguf_files_weights(tmp_path, token_file):
    settings = dict(steps=1, data=token_file, batch=2, eval_windows=1, eval_every=1, save_initial=True)
    from_gguf = scalify.train(str(tmp_path / "gguf"), init=str(GGUF), **settings)
    from_folder = scalify.train(str(tmp_path / "folder"), init=str(FOLDER), **settings)
    a, _ = scalify.load_checkpoint(os.path.join(from_gguf["run_dir"], "initial.safetensors"))
    b, _ = scalify.load_checkpoint(os.path.join(from_folder["run_dir"], "initial.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    # The weights are the folder's, as transformers stores them: the embedding, and layer 0's
    # query rows (which llama.cpp's converter permutes) as the first columns of the fused qkv.
    hf = bf16_tensors(FOLDER / "model.safetensors")
    assert np.array_equal(a["param.wte"], hf["model.embed_tokens.weight"])
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(a["param.h0.attn.qkv.w"][:, :q.shape[0]], q.T)
    # The norm's epsilon is float32 in GGUF (1e-5 rounds to 9.99999974737875e-06), config.json's a
    # double: the losses differ by that alone.
    assert from_gguf["val_loss"] == pytest.approx(from_folder["val_loss"], rel=1e-6)


def test_a_gguf_without_a_tokenizer_needs_token_files(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    with pytest.raises(ValueError, match="tokenizer is read where its tokenizer.ggml.model is"):
        scalify.train(str(tmp_path / "run"), init=str(GGUF), steps=1, data=str(text))


def test_another_architecture_is_refused_by_name(tmp_path, token_file):
    # The tiny file with its general.architecture renamed (same length: the layout stays valid).
    raw = GGUF.read_bytes()
    assert raw.count(b"llama") >= 1
    at = raw.index(b"general.architecture") + len(b"general.architecture") + 4 + 8
    assert raw[at:at + 5] == b"llama"
    bad = tmp_path / "qwen.gguf"
    bad.write_bytes(raw[:at] + b"qwen3" + raw[at + 5:])
    with pytest.raises(ValueError, match="holds a 'qwen3' model"):
        scalify.train(str(tmp_path / "run"), init=str(bad), steps=1, data=token_file)


@pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")
@pytest.mark.skipif(not smollm2().exists(), reason="the real model is absent (scripts/fetch_smollm2.sh installs it)")
def test_the_real_models_loss_is_transformers():
    ref = json.loads((DATA / "gguf" / "smollm2.json").read_text())
    out = subprocess.run([CLI, "eval", "--model", str(smollm2()), "--data", str(DATA / "gguf" / "smollm2_ids.bin"),
                          "--context", str(ref["context"]), "--json"], check=True, capture_output=True, text=True).stdout
    loss = json.loads(out.strip().splitlines()[-1])["val_loss"]
    assert abs(loss - ref["loss"]) / ref["loss"] < 1e-5, (loss, ref["loss"])
