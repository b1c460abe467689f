"""Reference data for Scalify's GGUF reader (tests/test_gguf.cpp), made once with the `gguf` package
(llama.cpp's Python port of ggml's formats) and transformers, and committed:

  synthetic.gguf / synthetic.json / synthetic_expected.f32
      one tensor per supported ggml type, written by gguf.GGUFWriter (quantised by gguf.quants where
      the package can quantise the type; for Q4_K and Q6_K, which it cannot, random valid blocks),
      metadata of every value type, nested arrays included; the expected f32 values are
      gguf.quants.dequantize's, concatenated in tensor order.
  tiny_llama_gqa.gguf
      tests/data/hf/tiny_llama_gqa (a transformers Llama with grouped-query attention, bf16) as
      llama.cpp's converter writes it: llama.* metadata and q/k rows permuted as
      convert_hf_to_gguf.py's LlamaModel.permute does; BF16 tensors (the folder's values exactly).
  smollm2.json  (only where the real model is installed; scripts/fetch_smollm2.sh)
      per tensor of SmolLM2-135M-Instruct.Q4_1.gguf: type, shape, the first values and the SHA-256
      and CRC-32 (zlib's, what the C++ test checks) of gguf.quants.dequantize's f32 bytes; and transformers' mean loss per token (the GGUF loaded in
      f32) on 2 windows of 128 tokens, whose ids (transformers' GGUF tokenizer on TEXT) are stored
      too, also as smollm2_ids.bin (an llm.c token file, what `scalify eval --data` reads).

Run: /work/pydev/bin/python tests/data/gguf/make_reference.py
"""

import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = Path(__file__).resolve().parent
rng = np.random.default_rng(46)


def random_blocks(qtype: T, n_blocks: int) -> np.ndarray:
    """Random bytes in the type's block layout, with finite f16 scales (ggml's dequantisation is
    defined on every bit pattern of the codes; NaN scales would only test NaN propagation)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, size=(n_blocks, 2)).astype(np.float16).view(np.uint8).reshape(n_blocks, 4)
    if qtype == T.Q4_K:  # {f16 d, f16 dmin, scales[12], qs[128]}
        raw[:, 0:4] = scales
    elif qtype == T.Q6_K:  # {ql[128], qh[64], int8 scales[16], f16 d}
        raw[:, 208:210] = scales[:, 0:2]
    else:
        raise ValueError(qtype)
    return raw


def synthetic() -> None:
    rows, cols = 3, 256
    w = gguf.GGUFWriter(str(HERE / "synthetic.gguf"), "synthetic")
    meta = {
        "test.uint8": ("uint8", 200),
        "test.int8": ("int8", -100),
        "test.uint16": ("uint16", 60000),
        "test.int16": ("int16", -30000),
        "test.uint32": ("uint32", 4000000000),
        "test.int32": ("int32", -2000000000),
        "test.uint64": ("uint64", 18000000000000000000),
        "test.int64": ("int64", -9000000000000000000),
        "test.float32": ("float32", 0.1),
        "test.float64": ("float64", 0.1),
        "test.bool": ("bool", True),
        "test.string": ("string", "naïve ☃ text"),
    }
    for key, (kind, value) in meta.items():
        getattr(w, "add_" + kind)(key, value)
    w.add_array("test.strings", ["a", "", "ünïcode", "b c"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25, 3.0])
    w.add_array("test.nested", [[1, 2], [3, 4, 5]])
    expected = []
    tensors = []
    for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q6_K]:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        if qtype == T.F32:
            data, raw_dtype = values, None
        elif qtype == T.F16:
            data, raw_dtype = values.astype(np.float16), None
        elif qtype in (T.Q4_K, T.Q6_K):
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            data, raw_dtype = random_blocks(qtype, rows * cols // block_size).reshape(rows, -1), qtype
        else:
            data, raw_dtype = gguf.quants.quantize(values, qtype), qtype
        name = qtype.name.lower()
        if raw_dtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw_dtype)
        out = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(rows, cols)
        expected.append(out.tobytes())
        tensors.append({"name": name, "type": int(qtype), "shape": [rows, cols]})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (HERE / "synthetic_expected.f32").write_bytes(b"".join(expected))
    # The metadata as the package reads it back (an independent reader of the same file).
    reader = gguf.GGUFReader(str(HERE / "synthetic.gguf"))
    assert [t.name for t in reader.tensors] == [t["name"] for t in tensors]
    back = {key: reader.fields[key].contents() for key in list(meta) + ["test.strings", "test.ints", "test.floats", "test.nested"]}
    back["test.float32"] = float(np.float32(0.1))
    (HERE / "synthetic.json").write_text(json.dumps({"tensors": tensors, "metadata": back}, indent=1) + "\n")


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from rotate-half order to pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def tiny_llama() -> None:
    from safetensors.numpy import load_file
    import ml_dtypes

    folder = HERE.parent / "hf" / "tiny_llama_gqa"
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    w = gguf.GGUFWriter(str(HERE / "tiny_llama_gqa.gguf"), "llama")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    w.add_rope_dimension_count(config["head_dim"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for hf_name, value in sorted(tensors.items()):
        value = np.asarray(value)
        if hf_name == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif hf_name == "model.norm.weight":
            name = "output_norm.weight"
        else:
            layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
            part, kind = rest.rsplit(".", 1)
            name = f"blk.{layer}.{names[part]}.{kind}"
            if part == "self_attn.q_proj":
                value = permute(value, heads, heads)
            elif part == "self_attn.k_proj":
                value = permute(value, heads, kv_heads)
        assert value.dtype == ml_dtypes.bfloat16, hf_name
        w.add_tensor(name, np.ascontiguousarray(value).view(np.uint8), raw_dtype=T.BF16)  # shape from the bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TEXT = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt wind. "
    "Every evening the keeper climbed the one hundred and twelve steps to light the lamp, and every morning "
    "he wrote in a small leather book what ships had passed and what the weather had done. Most entries were "
    "short: calm sea, two fishing boats, rain after noon. But some pages were longer. He described a storm in "
    "which the waves reached the lower windows, a whale that followed a ferry for an hour, and a winter so cold "
    "that ice formed on the railing of the gallery. When the lighthouse was finally automated, the keeper gave "
    "the book to the village library. Children who read it today are surprised by how much can happen in a "
    "place where, as the keeper himself once wrote, nothing ever happens. The librarian keeps it in a glass case "
    "near the entrance, open to a page about a night when the lamp failed and he kept a lantern burning by hand "
    "until dawn, walking around the gallery every few minutes so that the light would seem to turn. A captain "
    "later wrote to thank him: without that small, stubborn light, she said, her boat would have struck the "
    "rocks. The letter is pressed between the pages, its ink faded to brown, and visitors often ask to see it. "
    "The village has changed since then. There is a café where the net loft used to be, and in summer the "
    "harbour is full of sailing yachts instead of trawlers, but the lighthouse still turns its beam across the "
    "water every night, and on clear evenings people walk up the path to watch it begin."
)


GREEDY_PROMPT, GREEDY_TOKENS = "The capital of France is", 12


def smollm2() -> None:
    path = Path(os.environ.get("SCALIFY_SMOLLM2", Path(os.environ.get("SCALIFY_CACHE", Path.home() / ".cache" / "scalify"))
                                / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not path.exists():
        print(f"{path} is absent: smollm2.json not made (scripts/fetch_smollm2.sh installs it)")
        return
    reader = gguf.GGUFReader(str(path))
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = [int(d) for d in reversed(t.shape.tolist())]
        assert values.size == int(np.prod(shape)), t.name
        tensors[t.name] = {"type": int(t.tensor_type), "shape": shape,
                           "sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest(),
                           "crc32": zlib.crc32(np.ascontiguousarray(values).tobytes()),
                           "first": [float(v) for v in values.reshape(-1)[:4]]}

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tok(TEXT)["input_ids"]
    context, windows = 128, 2
    assert len(ids) >= context * windows + 1, len(ids)
    ids = ids[: context * windows + 1]
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for w in range(windows):
            x = torch.tensor([ids[w * context: w * context + context]])
            y = torch.tensor([ids[w * context + 1: w * context + context + 1]])
            logits = model(x).logits.to(torch.float64)
            total += torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()
    loss = total / (context * windows)
    # Greedy decoding of a prompt: the ids transformers' generate gives (eos included when reached).
    prompt_ids = tok(GREEDY_PROMPT)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False)
    greedy = {"prompt": GREEDY_PROMPT, "prompt_ids": prompt_ids, "ids": out[0, len(prompt_ids):].tolist(),
              "text": tok.decode(out[0, len(prompt_ids):])}
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(ids)]
    (HERE / "smollm2_ids.bin").write_bytes(header.tobytes() + np.array(ids, dtype=np.uint16).tobytes())
    (HERE / "smollm2.json").write_text(json.dumps({
        "file": path.name, "sha256_of_file": hashlib.sha256(path.read_bytes()).hexdigest(),
        "context": context, "windows": windows, "ids": ids, "text": TEXT,
        "loss": loss, "greedy": greedy, "tensors": tensors}, indent=1) + "\n")
    print(f"transformers' loss per token: {loss!r} on {windows} windows of {context}")


if __name__ == "__main__":
    synthetic()
    tiny_llama()
    smollm2()
