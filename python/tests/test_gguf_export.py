"""`scalify export RUN --format gguf` (issue 46): the `gguf` package (llama.cpp's Python reader)
reads every tensor and key of the exported file, its dequantisation gives back the weights as
F16 / BF16 / Q8_0 store them (the references made here with NumPy, ml_dtypes and gguf.quants, from
the f32 Hugging Face export of the same checkpoint), and transformers' GGUF loader runs the
exported Llama and GPT-2 to the loss `scalify eval --model` gives the same weights. Skips when the
CLI, `gguf`, transformers or torch is absent."""

import json
import os
import signal
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))
HF_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "hf")
pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is not built (scripts/build.sh)")

SHAPE = dict(d_model=64, layers=2, seq=32, batch=4, eval_windows=2)
LLAMA = dict(SHAPE, heads=4, kv_heads=2, mlp_hidden=96, rms_norm="true", swiglu="true", rope_theta=10000, bias="false")
GPT2 = dict(SHAPE, heads=2)
CONTEXT, WINDOWS = 32, 3
Q = gguf.GGMLQuantizationType


def cli(*args):
    return subprocess.run([CLI, *map(str, args)], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two byte-level models trained 3 steps, with their f32 Hugging Face exports."""
    root = tmp_path_factory.mktemp("gguf_export")
    text = root / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while scalify counts every bit of it".split()
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(3000)))
    out = {"text": text}
    for name, settings in (("llama", LLAMA), ("gpt2", GPT2)):
        run = root / name
        cli("train", "--data", text, "--out", run, "--steps", 3, *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")])
        cli("export", run, "--out", root / f"{name}_hf_f32")
        out[name] = run
    out["root"] = root
    return out


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(family, hf_dir):
    """The GGUF tensors convert_hf_to_gguf.py makes of the f32 Hugging Face export, by name."""
    hf = safetensors_numpy.load_file(str(hf_dir / "model.safetensors"))
    out = {}
    if family == "llama":
        names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
                 "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
        out["token_embd.weight"] = hf["model.embed_tokens.weight"]
        out["output_norm.weight"] = hf["model.norm.weight"]
        for l in range(SHAPE["layers"]):
            for src, dst in names.items():
                w = hf[f"model.layers.{l}.{src}.weight"]
                if dst == "attn_q":
                    w = permute(w, LLAMA["heads"])
                if dst == "attn_k":
                    w = permute(w, LLAMA["kv_heads"])
                out[f"blk.{l}.{dst}.weight"] = w
    else:
        names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up",
                 "mlp.c_proj": "ffn_down"}
        out["token_embd.weight"] = out["output.weight"] = hf["wte.weight"]
        out["position_embd.weight"] = hf["wpe.weight"]
        out["output_norm.weight"], out["output_norm.bias"] = hf["ln_f.weight"], hf["ln_f.bias"]
        for l in range(SHAPE["layers"]):
            for src, dst in names.items():
                w = hf[f"h.{l}.{src}.weight"]
                out[f"blk.{l}.{dst}.weight"] = w.T if w.ndim == 2 else w  # Conv1D [in, out] -> [out, in]
                out[f"blk.{l}.{dst}.bias"] = hf[f"h.{l}.{src}.bias"]
    return out


def field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_gguf_package_reads_back_every_tensor_and_key(runs, family, dtype, tmp_path):
    path = tmp_path / "model.gguf"
    printed = cli("export", runs[family], "--format", "gguf", "--dtype", dtype, "--out", path)
    assert printed == f"{family} model written to {path} (GGUF, {dtype} weights, with its tokenizer)\n"
    reader = gguf.GGUFReader(str(path))
    assert reader.data_offset % 32 == 0
    expected = expected_tensors(family, runs["root"] / f"{family}_hf_f32")
    assert sorted(t.name for t in reader.tensors) == sorted(expected)
    matrix_type = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[dtype]
    for t in reader.tensors:
        want = expected[t.name].astype(np.float32)
        assert list(t.shape) == list(reversed(want.shape)), t.name  # ne[0] is the fastest dimension
        assert t.data_offset % 32 == 0
        assert t.tensor_type == (matrix_type if want.ndim == 2 else Q.F32), t.name
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(want.shape)
        if t.tensor_type == Q.F16:
            want = want.astype(np.float16).astype(np.float32)
        elif t.tensor_type == Q.BF16:
            want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
        elif t.tensor_type == Q.Q8_0:
            blocks = gguf.quants.quantize(want, Q.Q8_0)
            assert np.array_equal(np.asarray(t.data).reshape(-1), blocks.reshape(-1)), t.name  # ggml's bytes exactly
            want = gguf.quants.dequantize(blocks, Q.Q8_0).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=t.name)

    arch = family
    assert field(reader, "general.architecture") == arch
    assert field(reader, "general.name") == family
    assert field(reader, "general.alignment") == 32
    assert field(reader, "general.file_type") == {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[dtype]
    settings = LLAMA if family == "llama" else GPT2
    keys = {"context_length": SHAPE["seq"], "embedding_length": SHAPE["d_model"], "block_count": SHAPE["layers"],
            "attention.head_count": settings["heads"]}
    if family == "llama":
        keys.update({"feed_forward_length": LLAMA["mlp_hidden"], "attention.head_count_kv": LLAMA["kv_heads"], "vocab_size": 256,
                     "rope.dimension_count": SHAPE["d_model"] // LLAMA["heads"], "rope.freq_base": 10000.0,
                     "attention.layer_norm_rms_epsilon": np.float32(1e-6)})
    else:
        keys.update({"feed_forward_length": 4 * SHAPE["d_model"], "attention.layer_norm_epsilon": np.float32(1e-5)})
    for key, value in keys.items():
        assert field(reader, f"{arch}.{key}") == value, key
    symbols = bytes_to_unicode()
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert field(reader, "tokenizer.ggml.tokens") == [symbols[b] for b in range(256)]
    assert field(reader, "tokenizer.ggml.token_type") == [1] * 256
    assert field(reader, "tokenizer.ggml.merges") == []


def transformers_loss(model_dir, gguf_file, ids, **config):
    """transformers' GGUF loader: the mean next-token loss over the windows `scalify eval` takes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), gguf_file=gguf_file, dtype=torch.float32, **config).eval()
    x = torch.tensor([ids[w * CONTEXT:w * CONTEXT + CONTEXT] for w in range(WINDOWS)])
    y = torch.tensor([ids[w * CONTEXT + 1:w * CONTEXT + CONTEXT + 1] for w in range(WINDOWS)])
    with torch.no_grad():
        logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def with_f16_matrices(hf_dir, out):
    """The Hugging Face folder with its matrices rounded to f16 by NumPy and its norms and biases
    left f32: the weights an f16 GGUF file holds."""
    out.mkdir()
    for name in os.listdir(hf_dir):
        if name != "model.safetensors":
            (out / name).write_bytes((hf_dir / name).read_bytes())
    tensors = safetensors_numpy.load_file(str(hf_dir / "model.safetensors"))
    rounded = {k: v.astype(np.float16).astype(np.float32) if v.ndim == 2 else v for k, v in tensors.items()}
    safetensors_numpy.save_file(rounded, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_transformers_runs_the_exported_file_as_scalify_evaluates_it(runs, family, dtype, tmp_path):
    pytest.importorskip("transformers")
    cli("export", runs[family], "--format", "gguf", "--dtype", dtype, "--out", tmp_path / "model.gguf")
    hf = runs["root"] / f"{family}_hf_f32"
    if dtype == "f16":
        hf = with_f16_matrices(hf, tmp_path / "hf_f16")
    scalify = json.loads(cli("eval", "--model", hf, "--data", runs["text"], "--context", CONTEXT, "--windows", WINDOWS, "--json"))
    assert scalify["windows"] == WINDOWS and scalify["context"] == CONTEXT
    ids = list(runs["text"].read_bytes())  # the byte-level vocabulary: token i is byte i
    # transformers' GGUF config mapping leaves GPT-2's n_positions at its default (1,024) though
    # gpt2.context_length says 32; llama.cpp sizes position_embd from the tensor itself.
    config = {"n_positions": SHAPE["seq"]} if family == "gpt2" else {}
    assert transformers_loss(tmp_path, "model.gguf", ids, **config) == pytest.approx(scalify["val_loss"], rel=1e-6)


def test_transformers_reads_the_byte_vocabulary_as_a_tokenizer(runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    cli("export", runs["llama"], "--format", "gguf", "--out", tmp_path / "model.gguf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf")
    text = "Fox\n jumps: 1 über €"
    assert tokenizer.encode(text, add_special_tokens=False) == list(text.encode())
    assert tokenizer.decode(list(text.encode())) == text


def test_a_killed_or_refused_export_leaves_the_previous_file(runs, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"previous")
    env = dict(os.environ, SCALIFY_TEST_DIE_DURING_WRITE="model.gguf")
    died = subprocess.run([CLI, "export", str(runs["llama"]), "--format", "gguf", "--out", str(path)], env=env, capture_output=True)
    assert died.returncode == -signal.SIGKILL
    assert path.read_bytes() == b"previous"
    # Refused before anything is written: llama.cpp's gpt2 computes tanh GELU, not erf.
    erf = tmp_path / "erf"
    cli("train", "--data", runs["text"], "--out", erf, "--steps", 1, "--set", "gelu_erf=true", "--set", "d_model=32", "--set", "heads=2",
        "--set", "layers=1", "--set", "seq=16", "--set", "batch=2", "--set", "eval_windows=1")
    refused = subprocess.run([CLI, "export", str(erf), "--format", "gguf", "--out", str(path)], capture_output=True, text=True)
    assert refused.returncode != 0 and "uses erf GELU; llama.cpp's gpt2 architecture computes the tanh form" in refused.stderr
    assert path.read_bytes() == b"previous"
    refused = subprocess.run([CLI, "export", str(erf), "--dtype", "q8_0", "--out", str(tmp_path / "hf")], capture_output=True, text=True)
    assert refused.returncode != 0 and "--dtype q8_0 is for --format gguf" in refused.stderr
    assert not (tmp_path / "hf").exists()


def test_a_model_fine_tuned_from_a_gpt2_folder_takes_its_tokenizer_along(runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "init"  # a copy: the refused export below aims at one of its files
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):  # 1,000 tokens
        (folder / name).write_bytes(open(os.path.join(HF_DATA, "tiny_gpt2", name), "rb").read())
    run = tmp_path / "ft"
    cli("train", "--init", folder, "--data", runs["text"], "--out", run, "--steps", 1, "--set", "batch=2", "--set", "eval_windows=1")
    refused = subprocess.run([CLI, "export", str(run), "--format", "gguf", "--out", os.path.join(folder, "merges.txt")],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "which this command reads or the run owns" in refused.stderr
    cli("export", run, "--format", "gguf", "--out", tmp_path / "model.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    vocab = json.load(open(os.path.join(folder, "vocab.json"), encoding="utf-8"))
    assert field(reader, "tokenizer.ggml.tokens") == sorted(vocab, key=vocab.get)
    merges = open(os.path.join(folder, "merges.txt"), encoding="utf-8").read().splitlines()
    assert merges[0].startswith("#version") and field(reader, "tokenizer.ggml.merges") == merges[1:]
    assert field(reader, "tokenizer.ggml.bos_token_id") == 0 and field(reader, "tokenizer.ggml.eos_token_id") == 0
    text = runs["text"].read_text()[:2000]
    ids = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf").encode(text, add_special_tokens=False)
    assert ids == transformers.AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)


def write_token_file(path, tokens):
    """llm.c's token file: a 256-int32 header (magic 20240520, version 1, count), then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


def test_a_tokenizer_json_folder_becomes_the_same_tokenizer(runs, tmp_path):
    """A folder whose tokenizer is only tokenizer.json (what transformers saves today): its BPE
    vocabulary, merges and special tokens go into the file, and transformers' GGUF tokenizer
    encodes as the `tokenizers` library does with tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    source = os.path.join(HF_DATA, "tiny_gpt2")
    folder = tmp_path / "init"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes(open(os.path.join(source, name), "rb").read())
    vocab = json.load(open(os.path.join(source, "vocab.json"), encoding="utf-8"))
    merges = open(os.path.join(source, "merges.txt"), encoding="utf-8").read().splitlines()[1:]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "pre_tokenizer": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": [m.split(" ") for m in merges]}}), encoding="utf-8")
    write_token_file(tmp_path / "tokens.bin", [(i * 37) % len(vocab) for i in range(2000)])
    run = tmp_path / "ft"
    cli("train", "--init", folder, "--data", tmp_path / "tokens.bin", "--out", run, "--steps", 1, "--set", "batch=2", "--set",
        "eval_windows=1")
    cli("export", run, "--format", "gguf", "--out", tmp_path / "model.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    assert field(reader, "tokenizer.ggml.tokens") == sorted(vocab, key=vocab.get)
    assert field(reader, "tokenizer.ggml.token_type") == [3] + [1] * (len(vocab) - 1)  # <|endoftext|>: a control token
    assert field(reader, "tokenizer.ggml.merges") == merges
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    text = "Hello world<|endoftext|> 12345 " + runs["text"].read_text()[:1000]
    ids = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf").encode(text, add_special_tokens=False)
    assert ids == tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_a_model_without_a_tokenizer_is_written_with_none(tmp_path):
    """Fine-tuned from a folder without tokenizer files (config.json and weights only): the file
    says tokenizer.ggml.model "none" (llama.cpp's model without a vocabulary) and llama.vocab_size,
    and transformers runs it on token ids to scalify's loss on the same token file."""
    pytest.importorskip("transformers")
    source = os.path.join(HF_DATA, "tiny_llama_gqa")  # 1,000 tokens, tied head, grouped-query attention
    folder = tmp_path / "init"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes(open(os.path.join(source, name), "rb").read())
    ids = [(i * 37 + i // 7) % 1000 for i in range(2000)]
    write_token_file(tmp_path / "tokens.bin", ids)
    run = tmp_path / "ft"
    cli("train", "--init", folder, "--data", tmp_path / "tokens.bin", "--out", run, "--steps", 1, "--set", "batch=2", "--set",
        "eval_windows=1")
    printed = cli("export", run, "--format", "gguf", "--out", tmp_path / "model.gguf")
    assert printed.endswith("(GGUF, f32 weights, no tokenizer: the model it was fine-tuned from has none)\n")
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    assert field(reader, "tokenizer.ggml.model") == "none" and "tokenizer.ggml.tokens" not in reader.fields
    assert field(reader, "llama.vocab_size") == 1000
    assert "output.weight" not in [t.name for t in reader.tensors]  # tied: llama.cpp takes token_embd
    cli("export", run, "--out", tmp_path / "hf")
    scalify = json.loads(cli("eval", "--model", tmp_path / "hf", "--data", tmp_path / "tokens.bin", "--context", CONTEXT, "--windows",
                             WINDOWS, "--json"))
    assert transformers_loss(tmp_path, "model.gguf", ids) == pytest.approx(scalify["val_loss"], rel=1e-6)


def test_a_model_trained_in_fp8_is_written_as_its_represented_values(runs, tmp_path):
    """A checkpoint of a quantised recipe (FP8 with per-tensor current scaling): the file holds the
    values its parameters represent, as the Hugging Face export does."""
    run = tmp_path / "fp8"
    cli("train", "--recipe", "current", "--data", runs["text"], "--out", run, "--steps", 2,
        *[a for k, v in LLAMA.items() for a in ("--set", f"{k}={v}")])
    cli("export", run, "--out", tmp_path / "hf")
    cli("export", run, "--format", "gguf", "--out", tmp_path / "model.gguf")
    expected = expected_tensors("llama", tmp_path / "hf")
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    assert sorted(t.name for t in reader.tensors) == sorted(expected)
    for t in reader.tensors:
        np.testing.assert_array_equal(np.asarray(t.data).reshape(expected[t.name].shape), expected[t.name], err_msg=t.name)


def test_q8_0_falls_back_to_f16_where_rows_are_not_whole_blocks(runs, tmp_path):
    """As convert_hf_to_gguf.py does: a matrix whose rows (ne[0]) are not a multiple of 32 is
    stored as F16, and the export names it."""
    run = tmp_path / "odd"
    settings = dict(LLAMA, mlp_hidden=80)
    cli("train", "--data", runs["text"], "--out", run, "--steps", 1, *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")])
    printed = cli("export", run, "--format", "gguf", "--dtype", "q8_0", "--out", tmp_path / "model.gguf")
    fallback = [f"blk.{l}.ffn_down.weight" for l in range(SHAPE["layers"])]  # [d_model, 80]: rows of 80
    assert printed.splitlines()[1].endswith(": " + ", ".join(fallback))
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    types = {t.name: t.tensor_type for t in reader.tensors if len(t.shape) == 2}
    assert {name for name, t in types.items() if t == Q.F16} == set(fallback)
    assert all(t == Q.Q8_0 for name, t in types.items() if name not in fallback)
