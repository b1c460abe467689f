"""Deeply nested JSON reaches the Python package as recipe text and checkpoint metadata: a
ValueError naming what was wrong, never a crash of the interpreter (a value 100,000 levels deep
overflowed the stack of the error message that quoted it)."""
import json
import struct

import pytest

import scalify

DEEP = "[" * 100000 + "]" * 100000


def test_a_deep_recipe_is_a_value_error():
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        scalify.Recipe.from_json('{"name": "x", "linear": ' + DEEP + "}")
    # Ordinary nesting still parses and is judged by its fields.
    with pytest.raises(ValueError, match="linear"):
        scalify.Recipe.from_json('{"name": "x", "linear": [[1]]}')


def test_a_checkpoint_with_deep_checksum_metadata_is_a_value_error(tmp_path):
    # A file another tool could write: its header's checksum key nested deep.
    header = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "__metadata__": {"scalify.crc32c": DEEP}}
    text = json.dumps(header).encode()
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(ValueError, match="scalify.crc32c is not a JSON object"):
        scalify.load_checkpoint(str(path))
