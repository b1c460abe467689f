"""The package's namespace: help(scalify) and `from scalify import *` show every op and type, and
nothing the package only uses internally."""

import inspect
import pydoc
import types

import scalify


def test_all_lists_every_public_name_and_only_those():
    public = {n for n in dir(scalify) if not n.startswith("_")} - {"torch"}  # scalify.torch, once imported
    assert set(scalify.__all__) == public
    assert len(scalify.__all__) == len(set(scalify.__all__))


def test_no_helper_modules_or_typing_names_leak():
    for name in ("json", "os", "operator", "typing", "annotations", "Callable", "Dict", "Optional"):
        assert not hasattr(scalify, name), name
    modules = {n for n in dir(scalify) if isinstance(getattr(scalify, n), types.ModuleType) and not n.startswith("_")}
    assert modules - {"torch"} == {"unit"}


def test_help_shows_the_ops_with_their_documentation():
    text = pydoc.render_doc(scalify, renderer=pydoc.plaintext)
    for op in ("matmul", "softmax", "cross_entropy", "set_scaling", "dynamic_rescale", "quantize", "train"):
        assert op in text, op
    for name in scalify.__all__:
        obj = getattr(scalify, name)
        if callable(obj) and not isinstance(obj, types.ModuleType):
            doc = inspect.getdoc(obj) or ""
            prose = [line for line in doc.splitlines() if line.strip() and not line.startswith(f"{name}(")]  # nanobind's signature lines
            assert prose, f"scalify.{name} has no documentation beyond its signature"
