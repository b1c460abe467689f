"""Real vocabularies as transformers takes them (issue 46), through `scalify tokenize`: a byte-level
BPE whose vocab.json lacks some bytes, a folder with only tokenizer.json (its pre-tokenizer rules,
GPT-2's and Llama 3's patterns, and added tokens) give the ids of Hugging Face's `tokenizers`, committed by
tests/data/tokenizer/make_reference.py; so does the real SmolLM2 GGUF file (skipped when absent)."""
import json
import os
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

CLI = os.environ.get("SCALIFY_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps", "scalify", "scalify"))
DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "tokenizer"


def smollm2_path() -> Path:
    if "SCALIFY_SMOLLM2" in os.environ:
        return Path(os.environ["SCALIFY_SMOLLM2"])
    cache = os.environ.get("SCALIFY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "scalify")
    return Path(cache) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def read_token_file(path: Path) -> list[int]:
    """llm.c's .bin: 256 int32 of header (magic, version, count), then uint16 or uint32 tokens."""
    raw = path.read_bytes()
    magic, version, count = struct.unpack_from("<3i", raw)
    width = {20240520: 2, 20240801: 4}[magic]
    return list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), raw, 1024))


def cli_ids(model: Path, text: str, tmp_path: Path) -> list[int]:
    data, out = tmp_path / "text.txt", tmp_path / "ids.bin"
    data.write_bytes(text.encode("utf-8"))
    out.unlink(missing_ok=True)
    subprocess.run([CLI, "tokenize", "--model", str(model), "--data", str(data), "--out", str(out)], check=True,
                   capture_output=True, text=True)
    return read_token_file(out)


def reference(name: str, count: int) -> list[dict[str, Any]]:
    with open(DATA / name, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    # The hand-picked lines come first: every rule, missing bytes, added tokens; no line is empty.
    return [r for r in lines[:count] if r["ids"]]


@pytest.mark.parametrize("folder", ["tiny_vocab", "tiny_json", "tiny_json_split", "tiny_json_llama3"])
def test_tokenize_gives_the_ids_of_tokenizers(folder: str, tmp_path: Path) -> None:
    for r in reference(folder + "_encodings.jsonl", 50):
        assert cli_ids(DATA / folder, r["text"], tmp_path) == r["ids"], r["text"]


def test_tokenizer_json_special_tokens_are_one_token_each(tmp_path: Path) -> None:
    # Ids 0..3 are <|endoftext|>, <|im_start|>, <|im_end|>, <|im> (make_reference.py).
    ids = cli_ids(DATA / "tiny_json", "<|im_start|>user<|im_end|><|endoftext|>", tmp_path)
    assert ids[0] == 1 and ids[-2:] == [2, 0] and len(ids) == 2 + len(cli_ids(DATA / "tiny_json", "user", tmp_path)) + 1


def test_a_tokenizer_json_scalify_does_not_read_is_an_error_naming_it(tmp_path: Path) -> None:
    doc = json.loads((DATA / "tiny_json" / "tokenizer.json").read_text(encoding="utf-8"))
    doc["model"]["type"] = "WordPiece"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "text.txt").write_text("hello", encoding="utf-8")
    r = subprocess.run([CLI, "tokenize", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "text.txt"), "--out",
                        str(tmp_path / "ids.bin")], capture_output=True, text=True)
    assert r.returncode != 0
    assert "the model is \"WordPiece\", not a BPE" in r.stderr, r.stderr


def test_smollm2_gguf_gives_transformers_ids(tmp_path: Path) -> None:
    model = smollm2_path()
    if not model.exists():
        pytest.skip(f"{model} is absent (scripts/fetch_smollm2.sh installs it, or set SCALIFY_SMOLLM2)")
    for r in reference("smollm2_lines.jsonl", 60):
        assert cli_ids(model, r["text"], tmp_path) == r["ids"], r["text"]
