"""Builds the reference data of the byte-level BPE tests (issue 46), once, by hand: what Hugging
Face's `tokenizers` and transformers give is committed as data, the C++ tests never run them.

    /work/pydev/bin/python tests/data/tokenizer/make_reference.py   # tokenizers, transformers, gguf

Writes, beside this script:
  tiny_json/tokenizer.json   a byte-level BPE trained here on fortune lines, with 600 tokens less
      the 8 single bytes in MISSING_BYTES (and every token holding one), as SmolLM2's vocabulary
      lacks 21; pre_tokenizer Sequence[Digits(individual_digits), ByteLevel(use_regex)]; merges as
      [a, b] pairs; added tokens (<|endoftext|>, <|im_start|>, <|im_end|>, and <|im, shorter than
      <|im_start|>: the longest match wins)
  tiny_json_split/tokenizer.json   the same vocabulary with pre_tokenizer Sequence[Split(GPT-2's
      pattern), Digits, ByteLevel(use_regex false)], merges as "a b" strings, unk_token <unk> with
      fuse_unk, ignore_merges
  tiny_json_llama3/tokenizer.json   the same vocabulary split by Llama 3's pattern
      (Sequence[Split(Llama 3's pattern), ByteLevel(use_regex false)]), ignore_merges, as Llama 3's file
  tiny_vocab/vocab.json, merges.txt   tiny_json's model as GPT-2's two files (no added tokens)
  *_encodings.jsonl   one {"text", "ids"} per test line, as `tokenizers` encodes it
  smollm2_lines.jsonl   SmolLM2-135M-Instruct's ids of the hand-picked lines and of the first
      corpus lines, from transformers' tokenizer of the GGUF file (checked equal to that of the
      tokenizer.json folder transformers wrote from it, where that folder is here)
  smollm2_corpus.json   per text file of the default corpus: its line count, token count and an
      FNV-1a 64 hash of its lines' ids (each id 4 bytes little-endian, 0xFFFFFFFF after each line),
      and the same for the file's whole text encoded at once (what `scalify eval` reads)
"""
import json
import os

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
FORTUNES = "/usr/share/games/fortunes"
SMOLLM2_DIR = os.environ.get("SCALIFY_CACHE", os.path.expanduser("~/.cache/scalify"))
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HF = "/work/cache/smollm2-hf"  # transformers 5's save of the GGUF (tokenizer.json only), if present

# Bytes the tiny vocabularies have no token for: control bytes, and bytes no UTF-8 text holds.
MISSING_BYTES = [4, 6, 19, 0x1F, 0xC0, 0xC1, 0xF5, 0xFF]
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                  r"\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Lines for each rule: digits (of several scripts, in runs and beside letters), added tokens
# (alone, adjacent, inside words, overlapping), non-ASCII text, bytes with no token (between
# letters that merge, in runs, at the ends), whitespace runs of every kind, contractions.
HAND_PICKED = [
    "12345 abc", "a1b22c333 4444", "3.14159 1,000,000 2026-11-27", "x=42;y=-7", "½ ² ٣٤ ⅷ", " 7", "  99 bottles",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "x<|endoftext|>y", "<|endoftext|><|endoftext|>",
    "<|im_start|><|im_end|>", "<|im<|im_start|>", "<|im_star", "a <|im_end|> b", "<|endoftext|",
    "Ünïcödé façade naïve café", "日本語のテキストです。", "Привет, мир!", "emoji 😀👍🏽 family 👨‍👩‍👧", "e\u0301 combining",
    "a\x04b", "th\x04e", "!!\x04!!", "..\x04..", "--\x04\x06--", "==\x04\x04==", "\x04\x06\x13", "in\x1f\x1fside", "\x04start", "end\x06", "tab\x13\x04\ttab",
    "a  b   c\t\td", "   leading", "trailing   ", "\n\n\nnewlines\n\n", " \t \n ", "\u00a0nbsp\u00a0", "ideo\u3000space",
    "I'm you're he'll she'd we've it's", "DON'T I'M", "'s 't 're", "!!! ??? ...", "http://example.com/path?q=1&r=2",
    "'S 'RE 'Ll 'VE 'D", "a\r\n\r\nb", "x \n\n  y", "12345678 1234 x12y", "hello!!!\n\nworld", " ?!x", "  \t\n", "?\r\n",
    "a,\nb", " \u00a0\nx", "(x) [y]\n", "\x04hello \x04 1",
]


def fortune_files():
    """The default corpus's text files, as the trainer reads them (no name with a dot, no link)."""
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if "." in name or os.path.islink(path) or not os.path.isfile(path):
            continue
        yield name, open(path, encoding="utf-8").read()


def fortune_lines():
    return [l for _, text in fortune_files() for l in text.split("\n") if l.strip() and l.strip() != "%"]



def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_tiny():
    """The tiny_json tokenizer as a dict."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(fortune_lines()[:20000], trainer)
    d = json.loads(tok.to_str())
    # Drop the missing bytes' tokens and every token and merge holding one; ids stay contiguous.
    gone = {bytes_to_unicode()[b] for b in MISSING_BYTES}
    kept = [t for t, _ in sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1]) if not gone & set(t)]
    added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im"]
    d["model"]["vocab"] = {t: i for i, t in enumerate(added + kept)}
    d["model"]["merges"] = [m for m in d["model"]["merges"] if not gone & set(m[0] + m[1])]
    d["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                          "special": t != "<|im"} for i, t in enumerate(added)]
    return d


def write_encodings(name, tok, lines):
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps({"text": line, "ids": tok.encode(line, add_special_tokens=False).ids}, ensure_ascii=False) + "\n")


def fnv1a(ids_lists):
    h = 0xCBF29CE484222325
    for ids in ids_lists:
        for i in list(ids) + [-1]:
            for byte in (i & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    lines = HAND_PICKED + fortune_lines()[::97][:300]
    d = train_tiny()
    os.makedirs(os.path.join(HERE, "tiny_json"), exist_ok=True)
    with open(os.path.join(HERE, "tiny_json", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
    write_encodings("tiny_json_encodings.jsonl", Tokenizer.from_str(json.dumps(d)), lines)

    s = json.loads(json.dumps(d))
    s["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    s["model"]["merges"] = [" ".join(m) for m in s["model"]["merges"]]
    s["model"]["vocab"]["<unk>"] = len(s["model"]["vocab"])
    s["model"].update(unk_token="<unk>", fuse_unk=True, ignore_merges=True)
    os.makedirs(os.path.join(HERE, "tiny_json_split"), exist_ok=True)
    with open(os.path.join(HERE, "tiny_json_split", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(s, f, ensure_ascii=False)
    write_encodings("tiny_json_split_encodings.jsonl", Tokenizer.from_str(json.dumps(s)), lines)

    l3 = json.loads(json.dumps(d))
    l3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    l3["model"]["ignore_merges"] = True
    os.makedirs(os.path.join(HERE, "tiny_json_llama3"), exist_ok=True)
    with open(os.path.join(HERE, "tiny_json_llama3", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(l3, f, ensure_ascii=False)
    write_encodings("tiny_json_llama3_encodings.jsonl", Tokenizer.from_str(json.dumps(l3)), lines)

    # GPT-2's two files of tiny_json's model (as transformers 4 saved SmolLM2's), read by tokenizers
    # as a ByteLevel BPE without added tokens.
    os.makedirs(os.path.join(HERE, "tiny_vocab"), exist_ok=True)
    with open(os.path.join(HERE, "tiny_vocab", "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(d["model"]["vocab"], f, ensure_ascii=False)
    with open(os.path.join(HERE, "tiny_vocab", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(" ".join(m) + "\n" for m in d["model"]["merges"]))
    v = Tokenizer(models.BPE.from_file(os.path.join(HERE, "tiny_vocab", "vocab.json"), os.path.join(HERE, "tiny_vocab", "merges.txt")))
    v.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    write_encodings("tiny_vocab_encodings.jsonl", v, lines)

    # SmolLM2: transformers' tokenizer of the GGUF file.
    from transformers import AutoTokenizer
    gguf = AutoTokenizer.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_GGUF)
    others = [AutoTokenizer.from_pretrained(SMOLLM2_HF)] if os.path.isdir(SMOLLM2_HF) else []
    encode = lambda t, text: t(text, add_special_tokens=False)["input_ids"]
    corpus = fortune_lines()
    with open(os.path.join(HERE, "smollm2_lines.jsonl"), "w", encoding="utf-8") as f:
        for line in HAND_PICKED + corpus[:200]:
            ids = encode(gguf, line)
            for o in others:
                assert encode(o, line) == ids, line
            f.write(json.dumps({"text": line, "ids": ids}, ensure_ascii=False) + "\n")
    files = []
    for name, text in fortune_files():
        per_line = [encode(gguf, l) for l in text.split("\n")]
        whole = encode(gguf, text)
        for o in others:
            assert encode(o, text) == whole, name
        files.append({"file": name, "lines": len(per_line), "line_tokens": sum(map(len, per_line)), "line_fnv1a": fnv1a(per_line),
                      "tokens": len(whole), "fnv1a": fnv1a([whole])})
    with open(os.path.join(HERE, "smollm2_corpus.json"), "w") as f:
        json.dump({"model": SMOLLM2_GGUF, "corpus": FORTUNES, "files": files}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
