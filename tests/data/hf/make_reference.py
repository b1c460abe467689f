"""Builds the Hugging Face reference data of the pretrained-model tests, once, by hand (no model hub
is reachable when the tests run, so what transformers, tokenizers and sentencepiece compute is
committed as data):

    python3 -m venv /tmp/hfvenv && scripts/install_torch_cpu.sh /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers tokenizers sentencepiece safetensors protobuf
    /tmp/hfvenv/bin/python tests/data/hf/make_reference.py

Writes, beside this script:
  tiny_gpt2/       GPT-2 in the hub's layout (no "transformer." prefix, the attn.bias mask buffers
                   kept): config.json, model.safetensors (f32), and a byte-level BPE trained here on
                   the lines below (vocab.json, merges.txt)
  tiny_llama/      Llama, 4 heads, untied head, sharded f32 (model-0000k-of-0000n.safetensors and
                   model.safetensors.index.json), tokenizer.model (SentencePiece BPE trained here)
  tiny_llama_gqa/  Llama with 4 query heads over 2 key/value heads, tied head, bf16 weights
  tiny_gpt2_erf/   GPT-2 with the erf GELU (activation "gelu", as Cerebras-GPT), an MLP width of 96,
                   in GPT2LMHeadModel's own names ("transformer." prefix), the same BPE
  */reference.safetensors   ids [2, T] (I64) and the model's logits [2, T, V] (F32), eager attention
  bpe_encodings.jsonl, spm_encodings.jsonl   one {"text", "ids", "decoded"} per test line
Every parameter is drawn at random (norm gains and biases included), so a mapping that swaps,
transposes or drops one shows in the logits.
"""
import json
import os
import random
import shutil

import sentencepiece as spm
import torch
from safetensors.torch import load_file, save_file
from tokenizers import ByteLevelBPETokenizer
from transformers import (GPT2Config, GPT2LMHeadModel, GPT2Tokenizer, GPT2TokenizerFast, LlamaConfig,
                          LlamaForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
FORTUNES = "/usr/share/games/fortunes"


def fortune_lines():
    lines = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if "." in name or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines += [l.rstrip("\n") for l in f if l.strip() and l.strip() != "%"]
    return lines


# Fragments that stress pre-tokenisation: scripts, marks, emoji sequences, digits of other scripts,
# every kind of space (NBSP, em space, ideographic space, U+001C..U+001F which Python's isspace
# counts and Unicode's White_Space does not), contractions in both cases, runs of punctuation.
FRAGMENTS = [
    "Ünïcödé façade naïve café", "日本語のテキストです。", "Привет, мир!", "مرحبا بالعالم", "한국어 문장",
    "emoji 😀👍🏽 family 👨‍👩‍👧", "e\u0301 combining", "numbers 3.14159 1,000,000 2026-11-25", "½ ² ٣٤ ⅷ",
    "I'm you're he'll she'd we've it's", "DON'T I'M YOU'VE", "'s 't 're 've 'm 'll 'd", "rock'n'roll",
    "a  b   c\t\td", "   leading", "trailing   ", "\u00a0nbsp\u00a0", "em\u2003space", "ideo\u3000space",
    "sep\u001cfile\u001dgroup\u001erecord\u001funit", "zero\u200bwidth", "tab\tthen\t\ttabs", "!!! ??? ...",
    "x=y+z; f(a,b)->c", "http://example.com/path?q=1&r=2", "C++ & Python 3.11", "ǅ Dž title-case", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u2028line\u2029para", "Ωmega ωmega", "1st 2nd 3rd 4th", "$100 €50 ¥1000", "٣.١٤", "    ", " ", "\t",
]


def test_lines(fortunes, rng):
    lines = rng.sample(fortunes, 2500)
    for _ in range(500):
        parts = rng.sample(FRAGMENTS, rng.randint(1, 4))
        lines.append(rng.choice(["", " ", "  "]).join(parts))
    return lines


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm gains about 1, biases about 0
                base = 1.0 if ("ln" in name or "norm" in name) and name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / min(p.shape) ** 0.5)


def write_reference(saved, model, folder, vocab, gen, T=24):
    """Logits in f32 of `model` (the checkpoint as transformers reads it back), whose parameters
    must equal those of `saved` (the model that was written)."""
    read = dict(model.named_parameters())
    for name, p in saved.named_parameters():
        assert torch.equal(p.float(), read[name].float()), f"{folder}: {name} does not read back as written"
    ids = torch.randint(0, vocab, (2, T), generator=gen)
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous()}, os.path.join(folder, "reference.safetensors"))


def fresh(folder):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def make_bpe(lines, corpus, rng):
    folder = fresh(os.path.join(HERE, "tiny_gpt2"))
    bpe = ByteLevelBPETokenizer()  # GPT-2's byte-level pre-tokeniser, regex and byte map
    bpe.train_from_iterator(corpus, vocab_size=1000, min_frequency=2, special_tokens=["<|endoftext|>"])
    bpe.save_model(folder)
    fast = GPT2TokenizerFast(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))
    slow = GPT2Tokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))
    with open(os.path.join(HERE, "bpe_encodings.jsonl"), "w", encoding="utf-8") as out:
        for text in lines:
            ids = fast.encode(text)
            assert ids == slow.encode(text), f"fast and slow GPT-2 tokenizers disagree on {text!r}"
            decoded = fast.decode(ids, clean_up_tokenization_spaces=False)
            out.write(json.dumps({"text": text, "ids": ids, "decoded": decoded}, ensure_ascii=False) + "\n")
    return len(fast)


def make_gpt2(vocab, gen):
    folder = os.path.join(HERE, "tiny_gpt2")
    config = GPT2Config(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4, activation_function="gelu_new",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=0,
                        eos_token_id=0)  # <|endoftext|> is the trained vocabulary's first token
    model = GPT2LMHeadModel(config).eval()
    model.config._attn_implementation = "eager"
    randomize(model, gen)
    model.save_pretrained(folder, safe_serialization=True)
    # The hub's gpt2 checkpoint: GPT2Model's names (no "transformer." prefix), the tied head not
    # stored, and each layer's causal-mask buffer attn.bias [1, 1, n_positions, n_positions].
    path = os.path.join(folder, "model.safetensors")
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(path).items() if k != "lm_head.weight"}
    for l in range(config.n_layer):
        tensors[f"h.{l}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
    save_file(tensors, path, metadata={"format": "pt"})
    write_reference(model, GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval(), folder,
                    vocab, gen)


def make_gpt2_erf(vocab, gen):
    folder = fresh(os.path.join(HERE, "tiny_gpt2_erf"))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(HERE, "tiny_gpt2", name), folder)
    config = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=48, n_layer=2, n_head=3, n_inner=96, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    model.config._attn_implementation = "eager"
    randomize(model, gen)
    model.save_pretrained(folder, safe_serialization=True)
    write_reference(model, GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval(), folder,
                    vocab, gen, T=16)


def make_spm(lines, corpus, folder):
    prefix = os.path.join(folder, "tokenizer")
    # Llama 2's tokenizer options: BPE, identity normalisation, a dummy prefix, digits split,
    # unknown characters as bytes.
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=prefix, vocab_size=1000, model_type="bpe",
                                   normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
                                   byte_fallback=True, allow_whitespace_only_pieces=True, add_dummy_prefix=True,
                                   character_coverage=0.9995, bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    os.remove(prefix + ".vocab")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    with open(os.path.join(HERE, "spm_encodings.jsonl"), "w", encoding="utf-8") as out:
        for text in lines:
            ids = sp.encode(text)
            out.write(json.dumps({"text": text, "ids": ids, "decoded": sp.decode(ids)}, ensure_ascii=False) + "\n")
    return sp.get_piece_size()


def make_llama(folder, vocab, gen, kv_heads, dtype, tied, theta, eps, shard):
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, max_position_embeddings=64, rms_norm_eps=eps, rope_theta=theta,
                         tie_word_embeddings=tied, attention_bias=False, hidden_act="silu", bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    randomize(model, gen)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    write_reference(model, LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval(), folder,
                    vocab, gen)


def main():
    rng = random.Random(34)
    gen = torch.Generator().manual_seed(34)
    fortunes = fortune_lines()
    lines = test_lines(fortunes, rng)
    corpus = fortunes + lines
    vocab = make_bpe(lines, corpus, rng)
    make_gpt2(vocab, gen)
    llama = fresh(os.path.join(HERE, "tiny_llama"))
    vocab = make_spm(lines, corpus, llama)
    make_llama(llama, vocab, gen, kv_heads=4, dtype=torch.float32, tied=False, theta=10000.0, eps=1e-6, shard="200KB")
    gqa = fresh(os.path.join(HERE, "tiny_llama_gqa"))
    shutil.copy(os.path.join(llama, "tokenizer.model"), gqa)
    make_llama(gqa, vocab, gen, kv_heads=2, dtype=torch.bfloat16, tied=True, theta=500000.0, eps=1e-5, shard="10GB")
    make_gpt2_erf(1000, gen)  # last: the models above keep the random draws they were made with
    for folder in ("tiny_gpt2", "tiny_llama", "tiny_llama_gqa", "tiny_gpt2_erf"):
        os.remove(os.path.join(HERE, folder, "generation_config.json"))  # sampling defaults: not read
        print(folder, sorted(os.listdir(os.path.join(HERE, folder))))


if __name__ == "__main__":
    main()
