"""minitorch.autodiff: central_difference, topological_sort, backpropagate, Context, no_grad."""

import math

import pytest
from hypothesis import given
from minitorch_testing import floats

import minitorch
from minitorch import Context, Scalar, backpropagate, central_difference, no_grad, topological_sort
from minitorch.autocast import _lowered
from minitorch.autodiff import is_grad_enabled


@given(floats(-3.0, 3.0), floats(-3.0, 3.0))
def test_central_difference_of_smooth_functions(x: float, y: float) -> None:
    assert central_difference(lambda a: a * a * a, x) == pytest.approx(3 * x * x, abs=1e-6)
    assert central_difference(math.sin, x) == pytest.approx(math.cos(x), abs=1e-8)
    assert central_difference(lambda a, b: a * b + b, x, y, arg=1) == pytest.approx(x + 1.0, abs=1e-8)
    assert central_difference(lambda a, b: a * b + b, x, y, arg=0, epsilon=1e-3) == pytest.approx(y, abs=1e-8)


def _diamond():
    """x -> a = x * 2, b = x * x -> c = a + b -> d = c * c: x reaches d along two paths."""
    x = Scalar(1.5, name="x")
    a = x * 2.0
    b = x * x
    c = a + b
    d = c * c
    return x, a, b, c, d


def test_topological_sort_puts_each_variable_before_its_inputs() -> None:
    x, a, b, c, d = _diamond()
    order = topological_sort(d)
    ids = [v.unique_id for v in order]
    assert ids[0] == d.unique_id
    assert len(ids) == len(set(ids))
    position = {v.unique_id: i for i, v in enumerate(order)}
    for v in order:
        if not v.is_leaf:
            for parent in v.parents:
                assert position[v.unique_id] < position[parent.unique_id]
    assert {x.unique_id, a.unique_id, b.unique_id, c.unique_id} <= set(ids)


def test_topological_sort_skips_constants() -> None:
    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    k = minitorch.tensor([3.0, 4.0])
    y = (x * k).sum()
    order = topological_sort(y)
    assert k.unique_id not in {v.unique_id for v in order}
    assert x.unique_id in {v.unique_id for v in order}


def test_backpropagate_sums_the_paths_of_a_diamond() -> None:
    x, _, _, _, d = _diamond()
    backpropagate(d, 1.0)
    # d = (2x + x^2)^2, d' = 2 (2x + x^2)(2 + 2x)
    c = 2 * 1.5 + 1.5**2
    assert x.derivative == pytest.approx(2 * c * (2 + 2 * 1.5))


def test_backpropagate_scales_by_the_output_derivative_and_accumulates() -> None:
    x = Scalar(2.0)
    y = x * x
    backpropagate(y, 3.0)
    assert x.derivative == pytest.approx(12.0)
    backpropagate(x * 5.0, 1.0)
    assert x.derivative == pytest.approx(17.0)


def test_deep_graph_does_not_recurse() -> None:
    x = Scalar(0.5)
    y = x
    for _ in range(20000):
        y = y + 0.001
    y = y * x
    y.backward()
    assert y.data == pytest.approx(0.5 * 20.5)
    assert x.derivative == pytest.approx(20.5 + 0.5)


def test_context_skips_saving_when_no_backward_will_run() -> None:
    ctx = Context()
    ctx.save_for_backward(1.0, 2.0)
    assert ctx.saved_values == (1.0, 2.0)
    assert ctx.saved_tensors == (1.0, 2.0)
    quiet = Context(no_grad=True)
    quiet.save_for_backward(1.0)
    assert quiet.saved_values == ()


def test_no_grad_stops_recording_and_restores_the_flag() -> None:
    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    assert is_grad_enabled()
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2.0
        with no_grad():
            pass
        assert not is_grad_enabled()
    assert is_grad_enabled()
    assert y.is_constant()
    assert (x * 2.0).history is not None


def test_no_grad_restores_the_flag_after_an_exception() -> None:
    with pytest.raises(ValueError):
        with no_grad():
            raise ValueError("boom")
    assert is_grad_enabled()


class _TwiceFolding(minitorch.tensor_functions.Function):
    """2 * a, whose backward folds the gradient already gathered for a into its own (records what
    take_pending gave it, and whether it could have written into it: Context.may_write_pending)."""

    offered: list = []
    writable: list = []
    folds_pending = True

    @staticmethod
    def forward(ctx: Context, a: minitorch.Tensor) -> minitorch.Tensor:
        return a * 2.0

    @staticmethod
    def backward(ctx: Context, d: minitorch.Tensor) -> minitorch.Tensor:
        pending = ctx.take_pending(0, d.dtype)
        _TwiceFolding.offered.append(pending)
        _TwiceFolding.writable.append(ctx.may_write_pending(0))
        return d * 2.0 if pending is None else pending + d * 2.0


def test_a_backward_folds_the_gradient_gathered_for_its_input() -> None:
    """x feeds 2x (a folding op) and, directly, the sum after it: backward reaches the sum first, so
    2x's backward is offered x's gradient so far and returns the whole of it, which the engine keeps
    instead of adding the two (x's gradient is 3, not 5)."""
    _TwiceFolding.offered.clear()
    x = minitorch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    (x + _TwiceFolding.apply(x)).sum().backward()
    assert [o is not None for o in _TwiceFolding.offered] == [True]
    assert x.grad.to_numpy().tolist() == [3.0, 3.0, 3.0]


def test_nothing_is_offered_to_fold_without_another_use_or_of_another_dtype() -> None:
    _TwiceFolding.offered.clear()
    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    _TwiceFolding.apply(x).sum().backward()  # x's only use: nothing gathered yet
    assert _TwiceFolding.offered == [None]
    assert x.grad.to_numpy().tolist() == [2.0, 2.0]
    ctx = Context(pending=(minitorch.tensor([1.0]).bfloat16(),))
    assert ctx.take_pending(0, minitorch.float32) is None and not ctx.folded
    assert ctx.take_pending(0, minitorch.bfloat16) is ctx.pending[0] and ctx.folded == {0}


def test_an_input_an_op_uses_twice_is_not_offered() -> None:
    """An op whose inputs are x and x again: folding x's gathered gradient into both would count it
    twice, so neither is offered it."""
    offered = []

    class Both(minitorch.tensor_functions.Function):
        folds_pending = True

        @staticmethod
        def forward(ctx: Context, a: minitorch.Tensor, b: minitorch.Tensor) -> minitorch.Tensor:
            return a + b

        @staticmethod
        def backward(ctx: Context, d: minitorch.Tensor):
            offered.extend(ctx.take_pending(i, d.dtype) for i in range(2))
            return d, d

    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    (x + Both.apply(x, x)).sum().backward()
    assert offered == [None, None]
    assert x.grad.to_numpy().tolist() == [3.0, 3.0]



def test_only_a_gradient_backward_alone_holds_may_be_written_in_place() -> None:
    """The engine's own sum of two gradients is backward's alone; a gradient an op returned without
    handing it over (Context.hand_over) may be shared (Add hands its output's gradient to both inputs)."""
    _TwiceFolding.writable.clear()
    x = minitorch.tensor([1.0, -2.0], requires_grad=True)
    (_TwiceFolding.apply(x) + x * 2.0 + x * 3.0).sum().backward()  # x's gathered gradient: the engine's sum
    assert x.grad.to_numpy().tolist() == [7.0, 7.0]
    y = minitorch.tensor([1.0, -2.0], requires_grad=True)
    (_TwiceFolding.apply(y) + y).sum().backward()  # y's gathered gradient: Add's output gradient itself
    assert y.grad.to_numpy().tolist() == [3.0, 3.0]
    assert _TwiceFolding.writable == [True, False]
    ctx = Context(pending=(minitorch.tensor([1.0]),), pending_alone=(True,))
    assert not ctx.may_write_pending(0), "only after take_pending handed it over"
    ctx.take_pending(0, minitorch.float32)
    assert ctx.may_write_pending(0)


class _Settles:
    """Stands for work still making a tensor on another stream: counts the waits for it."""

    def __init__(self) -> None:
        self.waits = 0

    def settle(self) -> None:
        self.waits += 1


class _InFlight(minitorch.tensor_functions.Function):
    """Identity whose backward returns its gradient times 1 still in the making (mark "in_flight"), as
    a bf16 Linear's weight gradient leaves the side stream, or still read beside (mark "read_beside"),
    as the output gradient that weight gradient is made from; ctx.saved_values[0] is the stand-in for
    that work."""

    @staticmethod
    def forward(ctx: Context, a: minitorch.Tensor, work: _Settles, mark: str = "in_flight") -> minitorch.Tensor:
        ctx.save_for_backward(work, mark)
        return a * 1.0

    @staticmethod
    def backward(ctx: Context, grad_output: minitorch.Tensor):
        work, mark = ctx.saved_values
        grad = grad_output.float() * 1.0  # float32, as a bf16 Linear's weight gradient
        setattr(grad._tensor, mark, work)
        return grad, None, None


def _leaf() -> minitorch.Tensor:
    return minitorch.tensor([1.0, 2.0, 3.0]).requires_grad_(True)


def test_a_gradient_in_flight_is_handed_on_unwaited_until_something_reads_it() -> None:
    """Stored into .grad as it is (a view keeps the mark); waited for once before a sum, an
    accumulation into an existing .grad, and a grad-ready hook; settle() clears the mark."""
    w, work = _leaf(), _Settles()
    _InFlight.apply(w, work).sum().backward()
    assert work.waits == 0 and w.grad._tensor.in_flight is work
    assert w.grad._tensor.as_strided((3,)).in_flight is work
    w.grad.settle()
    assert work.waits == 1 and w.grad._tensor.in_flight is None

    w, first, second = _leaf(), _Settles(), _Settles()
    (_InFlight.apply(w, first) + _InFlight.apply(w, second)).sum().backward()
    assert (first.waits, second.waits) == (1, 1)  # the engine's sum of the two uses
    assert w.grad.to_numpy().tolist() == [2.0, 2.0, 2.0]

    w, again = _leaf(), _Settles()
    w.grad = minitorch.tensor([1.0, 1.0, 1.0])
    _InFlight.apply(w, again).sum().backward()
    assert again.waits == 1 and w.grad.to_numpy().tolist() == [2.0, 2.0, 2.0]

    w, hooked, seen = _leaf(), _Settles(), []
    w.register_grad_ready_hook(lambda p: seen.append(hooked.waits))
    _InFlight.apply(w, hooked).sum().backward()
    assert seen == [1]


def test_a_function_settles_a_gradient_in_flight_unless_it_settles_its_own() -> None:
    """An op between the in-flight gradient and the leaf (here a multiply, whose backward reads it)
    waits first; a parameter's bf16 working copy (autocast) hands the float32 gradient on untouched."""
    w, work = _leaf(), _Settles()
    (_InFlight.apply(w * 2.0, work)).sum().backward()
    assert work.waits == 1 and w.grad.to_numpy().tolist() == [2.0, 2.0, 2.0]

    w, work = _leaf(), _Settles()
    copy = _lowered(w, minitorch.bfloat16)
    assert copy.dtype is minitorch.bfloat16
    _InFlight.apply(copy, work).sum().backward()
    assert work.waits == 0 and w.grad.dtype is minitorch.float32 and w.grad._tensor.in_flight is work


def test_work_reading_a_gradient_beside_is_waited_for_only_before_a_write_into_it() -> None:
    """Reads of a gradient that work beside only reads (the engine's sum, a fold that adds it into a
    new tensor, settle()) go on without a wait; a fold that writes into it in place
    (Context.may_write_pending) and copy_ wait first."""
    x, work = _leaf(), _Settles()
    (_InFlight.apply(x, work, "read_beside") + x * 2.0).sum().backward()
    assert work.waits == 0 and x.grad.to_numpy().tolist() == [3.0, 3.0, 3.0]

    g, work = minitorch.tensor([1.0, 2.0]), _Settles()
    g._tensor.read_beside = work
    g.settle()
    assert work.waits == 0 and g._tensor.as_strided((2,)).read_beside is work
    ctx = Context(pending=(g,), pending_alone=(True,))
    assert ctx.take_pending(0, minitorch.float32) is g and work.waits == 0  # a fold that only reads it
    assert ctx.may_write_pending(0) and work.waits == 1 and g._tensor.read_beside is None

    h, work = minitorch.tensor([1.0, 2.0]), _Settles()
    h._tensor.read_beside = work
    h.copy_(0.0)
    assert work.waits == 1 and h.to_numpy().tolist() == [0.0, 0.0]


def test_backward_ends_with_the_backends_settle_side(monkeypatch) -> None:
    """backpropagate (Tensor.backward, or called directly) ends with the backend's settle_side hook:
    on CUDA the wait for all the side stream's work; a backend without the hook skips it."""
    calls = []
    w = _leaf()
    monkeypatch.setattr(w.backend.ops, "settle_side", lambda: calls.append(1), raising=False)
    (w * 2.0).sum().backward()
    backpropagate((w * 3.0).sum(), minitorch.tensor([1.0]))
    assert calls == [1, 1]


def test_side_work_waits_once_and_not_after_the_whole_side_stream_was_joined() -> None:
    """A SideWork's first settle() makes the stream wait for its event, later ones do nothing; once
    settle_side has joined the side stream (joined()), settle() waits for nothing (an event of an
    earlier step is never waited for inside a later CUDA graph capture)."""
    from minitorch.cuda.runtime import SideWork

    class Stream:
        def __init__(self) -> None:
            self.waited: list = []

        def wait_event(self, event: object) -> None:
            self.waited.append(event)

    main, event = Stream(), object()
    work = SideWork(main, event)
    work.settle()
    work.settle()
    assert main.waited == [event]
    joined = SideWork(main, object())
    joined.joined()
    joined.settle()
    assert main.waited == [event]
