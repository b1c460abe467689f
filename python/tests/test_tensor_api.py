"""scalify.Tensor behaves like a torch.Tensor where the engine has the op: Python numbers, arrays
and lists on either side of an operator, indexing, reductions with dim=, conversions to Python
numbers, NumPy (__array__) and torch (DLPack). References are NumPy's own results."""

import numpy as np
import pytest

import scalify

RNG = np.random.default_rng(7)


def values(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def test_one_element_tensors_convert_to_python_numbers():
    t = scalify.Tensor(np.array([2.75], dtype=np.float32))
    assert float(t) == 2.75 and t.item() == 2.75 and int(t) == 2 and bool(t)
    assert not bool(scalify.Tensor([0.0]))
    loss = scalify.mean(scalify.Tensor(values((4, 3))))
    assert isinstance(loss.item(), float)
    assert int(scalify.Tensor([2.0**70])) == 2**70
    with pytest.raises(ValueError):
        int(scalify.Tensor([float("nan")]))
    with pytest.raises(ValueError, match=r"one-element.*\[2\]"):
        float(scalify.Tensor([1.0, 2.0]))


def test_numbers_on_either_side_give_numpys_float32_results_bit_for_bit():
    x = values((5, 4))
    t = scalify.Tensor(x)
    three = np.float32(3)
    cases = {
        "x + 1.0": (t + 1.0, x + np.float32(1)),
        "1.0 + x": (1.0 + t, np.float32(1) + x),
        "x - 1.5": (t - 1.5, x - np.float32(1.5)),
        "1.5 - x": (1.5 - t, np.float32(1.5) - x),
        "x * 2": (t * 2, x * np.float32(2)),
        "2 * x": (2 * t, np.float32(2) * x),
        "x / 3": (t / 3, x / three),
        "3 / x": (3 / t, three / x),
        "-x": (-t, -x),
        "abs(x)": (abs(t), np.abs(x)),
        "x ** 2": (t**2, x * x),
    }
    for name, (got, want) in cases.items():
        assert got.dtype == "f32", name
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)


def test_arrays_and_lists_on_either_side():
    x, y = values((3, 4)), values((3, 4))
    t = scalify.Tensor(x)
    np.testing.assert_array_equal((t + y).numpy(), x + y)
    got = y + t  # NumPy defers to the Tensor (__array_ufunc__ = None): the result keeps the graph
    assert isinstance(got, scalify.Tensor)
    np.testing.assert_array_equal(got.numpy(), y + x)
    np.testing.assert_array_equal((y * t).numpy(), y * x)
    np.testing.assert_array_equal((t - [1.0, 2.0, 3.0, 4.0]).numpy(), x - np.float32([1, 2, 3, 4]))
    w = values((4, 2))
    np.testing.assert_array_equal((t @ w).numpy(), scalify.matmul(t, scalify.Tensor(w)).numpy())
    np.testing.assert_allclose((x @ scalify.Tensor(w)).numpy(), x @ w, rtol=1e-6)


def test_numpy_scalars_are_numbers():
    x = values((2, 3))
    t = scalify.Tensor(x)
    np.testing.assert_array_equal((np.float32(2) * t).numpy(), x * np.float32(2))
    np.testing.assert_array_equal((t - np.float64(0.5)).numpy(), x - np.float32(0.5))
    assert scalify.Tensor(np.float32(3)).item() == 3.0


def test_unsupported_operands_raise_type_error():
    t = scalify.Tensor([1.0, 2.0])
    with pytest.raises(OverflowError):
        t + 10**400
    with pytest.raises(TypeError, match="dim"):
        t.sum(dim=True)
    with pytest.raises(TypeError):
        t + "a"
    with pytest.raises(TypeError):
        None * t


def test_scalar_operators_are_differentiable():
    x = RNG.uniform(0.5, 2.0, size=(6,))  # f64: the gradient checked exactly
    t = scalify.Tensor(x, requires_grad=True)
    scalify.sum(3 / t + 2 * t - 1.0 + (1.0 - t) * 0.5 + t**3).backward()
    np.testing.assert_allclose(t.grad, -3 / x**2 + 2 - 0.5 + 3 * x**2, rtol=1e-14)


def test_indexing_matches_numpy_and_is_differentiable():
    a = values((3, 4, 5))
    t = scalify.Tensor(a)
    for key in [1, -1, (1, 2), (slice(None), 1), (Ellipsis, -1), (None, 0, slice(1, 3)), (slice(1, None), Ellipsis, slice(0, 2)),
                (0, None, slice(None), 4), slice(-2, None)]:
        got = t[key]
        np.testing.assert_array_equal(got.numpy(), a[key], err_msg=str(key))
        assert got.shape == a[key].shape, key
    leaf = scalify.Tensor(a.astype(np.float64), requires_grad=True)
    scalify.sum(leaf[1:, 2, :3] * 2.0).backward()
    want = np.zeros(a.shape)
    want[1:, 2, :3] = 2.0
    np.testing.assert_array_equal(leaf.grad, want)
    rows = [r.numpy() for r in t]
    assert len(rows) == 3 and all(np.array_equal(r, a[i]) for i, r in enumerate(rows))
    with pytest.raises(TypeError, match="0-d"):
        iter(scalify.Tensor(1.0))


def test_indexing_refuses_what_it_cannot_do():
    t = scalify.Tensor(values((3, 4)))
    with pytest.raises(IndexError, match="out of range"):
        t[3]
    with pytest.raises(IndexError, match="index 1180591620717411303424 is out of range"):
        t[2**70]
    with pytest.raises(IndexError, match="out of range"):
        t[0, -2**63 - 1]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError, match="step"):
        t[::2]
    with pytest.raises(TypeError, match="indexed by ints"):
        t[np.array([0, 1])]
    with pytest.raises(TypeError, match="bool"):  # not t[1]
        t[True]


def test_shape_queries_and_layout_match_numpy():
    a = values((2, 3, 4))
    t = scalify.Tensor(a)
    assert (len(t), t.ndim, t.dim(), t.numel(), t.shape, t.size(), t.size(-1)) == (2, 3, 3, 24, (2, 3, 4), (2, 3, 4), 4)
    np.testing.assert_array_equal(t.T.numpy(), a.T)
    np.testing.assert_array_equal(t.reshape(-1, 4).numpy(), a.reshape(-1, 4))
    np.testing.assert_array_equal(t.reshape((4, 6)).numpy(), a.reshape(4, 6))
    np.testing.assert_array_equal(t.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    with pytest.raises(TypeError, match="0-d"):
        len(scalify.Tensor(1.0))
    with pytest.raises(ValueError, match="cannot hold"):
        t.reshape(5, -1)


def test_reductions_take_dim_and_keepdim_like_numpy():
    a = values((3, 4, 5), np.float64)
    t = scalify.Tensor(a)
    np.testing.assert_allclose(t.sum(dim=1).numpy(), a.sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(t.mean(dim=(0, 2), keepdim=True).numpy(), a.mean(axis=(0, 2), keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(scalify.sum(t, dim=-1, keepdim=True).numpy(), a.sum(axis=-1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(t.sum().item(), a.sum(), rtol=1e-14)
    with pytest.raises(ValueError, match="dimension 1 is named more than once"):  # numpy: "duplicate value in 'axis'"
        t.sum(dim=(1, -2))
    with pytest.raises(ValueError, match="more than once"):
        scalify.mean(t, dim=(0, 0))
    with pytest.raises(IndexError, match="dimension 3 is out of range"):
        t.sum(dim=3)
    with pytest.raises(IndexError, match="out of range"):
        t.mean(dim=2**40)


def test_every_op_takes_keywords():
    a, w = values((3, 4)), values((4, 2))
    t = scalify.Tensor(a)
    np.testing.assert_array_equal(scalify.matmul(a=t, b=w).numpy(), (t @ w).numpy())
    np.testing.assert_array_equal(scalify.add(a=t, b=1.0).numpy(), a + np.float32(1))
    np.testing.assert_array_equal(scalify.mul(a=t, b=t).numpy(), a * a)
    np.testing.assert_array_equal(scalify.reshape(x=t, shape=(2, 6)).numpy(), a.reshape(2, 6))
    np.testing.assert_array_equal(scalify.transpose(x=t, dim0=0, dim1=1).numpy(), a.T)
    np.testing.assert_allclose(scalify.mean(x=t, dim=0).numpy(), a.mean(axis=0), rtol=1e-6)


def test_numpy_reads_the_represented_value():
    data = values((2, 3))
    t = scalify.Tensor(data, scale=0.25)
    got = np.asarray(t)
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, data * np.float32(0.25))
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy"):
        np.asarray(t, copy=False)


def test_torch_reads_the_represented_value_through_dlpack():
    torch = pytest.importorskip("torch")
    data = values((2, 3))
    got = torch.from_dlpack(scalify.Tensor(data, scale=4.0))
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), data * np.float32(4))
    back = scalify.Tensor(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    np.testing.assert_array_equal(back.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_backward_takes_the_gradient_of_a_non_scalar_value():
    x = scalify.Tensor(values((2, 3)), requires_grad=True)
    y = x * 3.0
    seed = values((2, 3))
    y.backward(gradient=seed)
    np.testing.assert_array_equal(x.grad, seed * np.float32(3))
    with pytest.raises(ValueError, match=r"backward\(gradient\)"):
        (scalify.Tensor(values((2, 3)), requires_grad=True) * 2.0).backward()
    with pytest.raises(ValueError, match="shape"):
        (scalify.Tensor(values((2, 3)), requires_grad=True) * 2.0).backward(gradient=[1.0, 2.0])


def test_constructors_take_lists_numbers_and_any_layout():
    t = scalify.Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.dtype == "f32" and t.shape == (2, 2)
    assert scalify.Tensor(3).shape == () and scalify.Tensor(3).item() == 3.0
    a = values((3, 4))
    np.testing.assert_array_equal(scalify.Tensor(a.T).numpy(), a.T)  # not C-contiguous: copied in order
    assert scalify.Tensor(a.astype(np.float64)).dtype == "f64"
    with pytest.raises(TypeError, match="int64"):
        scalify.Tensor(np.arange(3))
    with pytest.raises(TypeError, match="str"):
        scalify.Tensor("1.0")


def test_requires_grad_can_be_set_and_repr_shows_values():
    t = scalify.Tensor([1.5, -2.0])
    t.requires_grad = True
    scalify.sum(t * t).backward()
    np.testing.assert_array_equal(t.grad, [3.0, -4.0])
    assert repr(t) == "scalify.Tensor([ 1.5, -2. ], dtype=f32, requires_grad=True)"
    assert repr(scalify.Tensor([1.0], scale=0.5)) == "scalify.Tensor([0.5], dtype=f32, scale=0.5)"  # the value: data x scale
