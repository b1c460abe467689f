"""Builds the jax-scalify references of python/tests/test_torch_jax_scalify.py, once, by hand (the
tests never install JAX: what jax-scalify computes is committed as data, reference.npz beside this
script):

    /usr/bin/python3 -m venv /tmp/jaxvenv
    /tmp/jaxvenv/bin/pip install "jax[cpu]==0.4.31" jax-scalify==0.1.1 chex==0.1.86
    /tmp/jaxvenv/bin/python tests/data/jax_scalify/make_reference.py

jax-scalify 0.1.1 needs a JAX of its time (it uses jax.core.Primitive, gone from JAX 0.5+): 0.4.31
with chex 0.1.86 runs it. Versions are stored in the data ("meta", a JSON string).

A small transformer-like graph in float32, run op by op: each step is one jax_scalify.scalify call
whose inputs are ScaledArrays (data, power-of-two scale) built from the previous steps' recorded
outputs, so the torch side can run every op on exactly the same inputs. For each step "<name>" the
data "<name>/data" and scale "<name>/scale" are stored. Then the backward, op by op in reverse
(jax.vjp under scalify; the loss's cotangent 1, scale 1): "<name>/ct/..." the cotangent of the
step's output, "<name>/d_<input>/..." the step's vjp for that input (g, input of q, k and v, gets
the sum of their three by jax-scalify's add). Steps (shapes T=8 tokens, D=16, H=32):

  x [T, D] scale 2^-2, w1 [D, H] scale 2^-3, b1 [H] scale 2^-4     inputs
  mm1 = x @ w1                       dot_general, contracting D
  h = mm1 + b1                       add (b1 broadcast)
  gelu(h) (tanh form)                jax-scalify has no tanh / erf rule: recorded as "unsupported"
  g = h * 2^-1                       stands in for gelu's output (a scalar multiply)
  q, k, v = g @ wq, g @ wk, g @ wv   dot_general, contracting H (sqrt(32) not a power of two)
  s = q @ k^T                        dot_general, contracting D
  ss = s * 1/sqrt(D)                 multiply by a Python scalar
  sm = where(causal, ss, -inf)       select_n with a -inf constant: jax-scalify gives scale inf and
                                     NaN data ("unsupported"); sm is the mask applied to ss's data
  p = softmax(sm)                    softmax over T keys (exp(x - max) / sum, written out)
  o = p @ v                          dot_general, contracting T
  ln = (o - mean) / sqrt(var + eps)  LayerNorm written with sqrt and div (jax-scalify has no rsqrt)
  logits = ln @ wo                   dot_general, contracting D
  logp = log_softmax(logits)         log_softmax over C=16 classes (written out, as softmax)
  loss = -sum(onehot * logp) / T     cross-entropy, the mean over tokens
"""
import json
import os

import jax
import jax.numpy as jnp
import jax_scalify as jsa
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
T, D, H, C = 8, 16, 32, 16


def scaled(rec, name):
    return jsa.ScaledArray(jnp.asarray(rec[f"{name}/data"]), np.float32(rec[f"{name}/scale"]))


def record(rec, name, out):
    assert isinstance(out, jsa.ScaledArray), (name, type(out))
    rec[f"{name}/data"] = np.asarray(out.data, np.float32)
    rec[f"{name}/scale"] = np.float32(out.scale)


STEPS = []  # (name, fn, input names), in the order run


def step(rec, name, fn, *inputs):
    record(rec, name, jsa.scalify(fn)(*[scaled(rec, i) for i in inputs]))
    STEPS.append((name, fn, inputs))


def backward(rec, causal):
    """Reverse mode, op by op: the loss's cotangent 1 (scale 1); each step's jax.vjp under scalify
    with the cotangent of its output ("<name>/ct"), giving "<name>/d_<input>"; an input used by
    several steps (g: q, k, v) gets their sum by jax-scalify's add, in reverse step order."""
    ct = {"loss": jsa.ScaledArray(jnp.asarray(1.0, jnp.float32), np.float32(1.0))}
    for name, fn, inputs in reversed(STEPS):
        if name == "ss":  # the mask applied by hand: its cotangent is sm's, zero where masked
            ct["ss"] = jsa.ScaledArray(jnp.where(causal, ct["sm"].data, 0.0), ct["sm"].scale)
        g = ct[name]
        record(rec, f"{name}/ct", g)
        grads = jsa.scalify(lambda g, *xs: jax.vjp(fn, *xs)[1](g))(g, *[scaled(rec, i) for i in inputs])
        for i, gi in zip(inputs, grads):
            record(rec, f"{name}/d_{i}", gi)
            ct[i] = gi if i not in ct else jsa.scalify(lambda a, b: a + b)(ct[i], gi)


# jax.nn.softmax / log_softmax of JAX 0.4.31 take max(-inf, rowmax), which jax-scalify 0.1.1 turns
# into NaN (its -inf constant has scale inf); written out as jax.nn had them in jax-scalify's time.
def softmax(a):
    e = jnp.exp(a - jax.lax.stop_gradient(jnp.max(a, axis=-1, keepdims=True)))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def log_softmax(a):
    shifted = a - jax.lax.stop_gradient(jnp.max(a, axis=-1, keepdims=True))
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def main():
    rng = np.random.default_rng(45)
    rec = {}
    for name, shape, scale in [("x", (T, D), 2.0**-2), ("w1", (D, H), 2.0**-3), ("b1", (H,), 2.0**-4),
                               ("wq", (H, D), 2.0**-3), ("wk", (H, D), 2.0**-3), ("wv", (H, D), 2.0**-3),
                               ("wo", (D, C), 2.0**-1)]:
        rec[f"{name}/data"] = rng.standard_normal(shape).astype(np.float32)
        rec[f"{name}/scale"] = np.float32(scale)
    target = rng.integers(0, C, T)
    rec["target"] = target.astype(np.int64)
    unsupported = {}

    step(rec, "mm1", lambda x, w: x @ w, "x", "w1")
    step(rec, "h", lambda a, b: a + b, "mm1", "b1")
    try:
        step(rec, "gelu", lambda a: jax.nn.gelu(a, approximate=True), "h")
    except NotImplementedError as e:
        unsupported["gelu"] = str(e)
    step(rec, "g", lambda a: a * 0.5, "h")
    for w in ("q", "k", "v"):
        step(rec, w, lambda a, b: a @ b, "g", f"w{w}")
    step(rec, "s", lambda a, b: a @ b.T, "q", "k")
    step(rec, "ss", lambda a: a * (1.0 / np.sqrt(D)), "s")
    causal = np.tril(np.ones((T, T), bool))
    rec["causal"] = causal
    # jax-scalify 0.1.1 turns the -inf constant into a ScaledArray of scale inf: the select's output
    # scale is inf, its data NaN. Recorded as unsupported; the mask is applied to the data by hand
    # (the scale kept), which is what the softmax below is handed.
    record(rec, "sm_jax", jsa.scalify(lambda a: jnp.where(causal, a, -jnp.inf))(scaled(rec, "ss")))
    if not np.isfinite(rec["sm_jax/scale"]):
        unsupported["masked_fill"] = (f"where(mask, x, -inf): scale {float(rec['sm_jax/scale'])}, "
                                      f"data NaN {bool(np.isnan(rec['sm_jax/data']).any())}")
    del rec["sm_jax/data"], rec["sm_jax/scale"]
    rec["sm/data"] = np.where(causal, rec["ss/data"], -np.inf).astype(np.float32)
    rec["sm/scale"] = rec["ss/scale"]
    step(rec, "p", softmax, "sm")
    step(rec, "o", lambda a, b: a @ b, "p", "v")

    def layer_norm(a):
        mu = jnp.mean(a, axis=-1, keepdims=True)
        c = a - mu
        var = jnp.mean(c * c, axis=-1, keepdims=True)
        return c / jnp.sqrt(var + 1e-5)

    step(rec, "ln", layer_norm, "o")
    step(rec, "logits", lambda a, b: a @ b, "ln", "wo")
    step(rec, "logp", log_softmax, "logits")
    onehot = np.eye(C, dtype=np.float32)[target]
    step(rec, "loss", lambda a: -jnp.sum(onehot * a) / T, "logp")

    backward(rec, causal)
    rec["meta"] = np.array(json.dumps({
        "jax": jax.__version__, "jax_scalify": "0.1.1", "numpy": np.__version__,
        "unsupported": unsupported}))
    np.savez_compressed(os.path.join(HERE, "reference.npz"), **rec)
    for k in sorted(rec):
        if k.endswith("/scale"):
            print(k, float(rec[k]), np.log2(float(rec[k])))
    print(rec["meta"])


if __name__ == "__main__":
    main()
