"""The calls of flashmask_attention that passed every argument check, by signature.

Every layer of a model, at every step, calls the op with the same shapes, dtypes, devices and
options, and the checks answer the same each time. Their Python, and the place reads they make
(a Place costs microseconds a read in Paddle's GPU runtime), were most of the wrapper's host time
on the device: 150 us a synchronized 8K forward call against 70 us for the op called alone
(H200, benchmarks/results/h200/op_overhead_v19/). A signature holds everything the checks read,
taken with one read of each tensor attribute; a call whose signature passed before runs on what
the checks derived, without them. What the signature cannot hold stays per call in the wrapper:
index and block-mask values (checked once per tensor), contiguity.
"""

import paddle

_MAX_CALLS = 256  # distinct signatures kept (a model has a handful); cleared when full
_calls = {}


def _place_key(place):
    if place.is_gpu_place():
        return place.gpu_device_id()
    return "cpu" if place.is_cpu_place() else str(place)  # str() costs 1.7 us on the CPU machine


def _tensor_key(t):
    return tuple(t.shape), t.dtype, _place_key(t.place), t.stop_gradient


def signature(query, key, value, indices, block_mask, options, environment):
    """A key of everything the argument checks read, or None where a call is not matched (static
    graphs, tensor subclasses such as parameters): those always run the checks. ``options`` are
    the call's other arguments (a tuple; lists in it become tuples), ``environment`` the process
    state the checks read (kernel family setting, environment switches, the deterministic flag).
    An unhashable option makes an unhashable key, which lookup() and remember() pass over."""
    if not paddle.in_dynamic_mode():
        return None
    tensor = paddle.Tensor
    if type(query) is not tensor or type(key) is not tensor or type(value) is not tensor:
        return None
    if (indices is not None and type(indices) is not tensor) or (
            block_mask is not None and type(block_mask) is not tensor):
        return None
    options = tuple(tuple(o) if type(o) is list else o for o in options)
    # With their types: True, 1 and 1.0 hash alike, but the checks tell them apart (causal=1 is a
    # TypeError), so a key must too (the elements of a (left, right) window as well).
    types = tuple(map(type, options)) + tuple(tuple(map(type, o)) for o in options if type(o) is tuple)
    return (_tensor_key(query), _tensor_key(key), _tensor_key(value),
            None if indices is None else _tensor_key(indices),
            None if block_mask is None else _tensor_key(block_mask),
            options, types, environment)


def lookup(sig):
    """What the checks derived for a call of this signature, or None (not seen, no signature)."""
    if sig is None:
        return None
    try:
        return _calls.get(sig)
    except TypeError:  # an unhashable option: the checks will say what is wrong with it
        return None


def remember(sig, checked):
    if sig is None:
        return
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    try:
        _calls[sig] = checked
    except TypeError:
        pass


def clear():
    """Forgets every signature (tests; a setting the signature does not see changed)."""
    _calls.clear()
