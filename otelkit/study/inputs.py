"""What a study sends: tensors from a user's function, or made from the model's metadata.

Made tensors follow the model's metadata: each input's datatype and shape, with the batch
dimension (when the model's ``max_batch_size`` is above 0) set to the point's batch size and
every other variable dimension (``-1``) to ``free_dim``. Values are seeded random numbers:
a model that branches on its input sees the same inputs from one run to the next.

>>> metadata = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
>>> arrays = inputs_from_metadata(metadata, max_batch_size=8, batch_size=4, free_dim=16)
>>> arrays["INPUT0"].shape, arrays["INPUT0"].dtype
((4, 16), dtype('float32'))
>>> batch_problem(max_batch_size=8, batch_size=64)
'the model takes batches of at most 8 (its max_batch_size), not 64'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["batch_problem", "inputs_from_metadata", "to_infer_inputs"]

_NUMPY_TYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
    "FP32": "float32", "FP64": "float64", "BYTES": "object",
}  # fmt: skip


def batch_problem(max_batch_size: int | None, batch_size: int) -> str | None:
    """Why ``batch_size`` does not fit a model with ``max_batch_size``, or ``None`` if it does
    (``None``: a server that does not say, as KServe v2 servers other than Triton)."""
    if max_batch_size is None:
        return None
    if max_batch_size == 0 and batch_size != 1:
        return (
            f"the model has no batch dimension (max_batch_size 0): batch size 1 only, "
            f"not {batch_size}"
        )
    if max_batch_size > 0 and batch_size > max_batch_size:
        return (
            f"the model takes batches of at most {max_batch_size} (its max_batch_size), "
            f"not {batch_size}"
        )
    return None


def inputs_from_metadata(
    metadata: Mapping[str, Any],
    *,
    max_batch_size: int | None,
    batch_size: int = 1,
    free_dim: int = 16,
    seed: int = 0,
) -> dict[str, NDArray[Any]]:
    """Input arrays for a model, from its KServe v2 metadata (``inputs``: name, datatype, shape).

    ``max_batch_size`` is Triton's (0: no batch dimension); ``None`` when the server does not
    say: a first dimension of -1 is then taken as the batch's.
    """
    import numpy as np

    problem = batch_problem(max_batch_size, batch_size)
    if problem:
        raise ValueError(problem)
    rng = np.random.default_rng(seed)
    arrays: dict[str, NDArray[Any]] = {}
    for spec in metadata.get("inputs", ()):
        datatype = str(spec["datatype"])
        if datatype not in _NUMPY_TYPES:
            raise ValueError(
                f"input {spec['name']!r}: datatype {datatype} is not one a study makes"
            )
        shape = [int(d) for d in spec["shape"]]
        batched = max_batch_size > 0 if max_batch_size is not None else shape[:1] == [-1]
        if batched and shape:
            shape[0] = batch_size
        elif batch_size != 1:
            raise ValueError(f"input {spec['name']!r} has no batch dimension: batch size 1 only")
        shape = [free_dim if d < 0 else d for d in shape]
        arrays[str(spec["name"])] = _values(rng, datatype, tuple(shape))
    return arrays


def _values(rng: Any, datatype: str, shape: tuple[int, ...]) -> NDArray[Any]:
    import numpy as np

    if datatype == "BYTES":
        return np.full(shape, b"otelkit", dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)  # type: ignore[no-any-return]
    dtype = np.dtype(_NUMPY_TYPES[datatype])
    if dtype.kind == "f":
        return rng.random(size=shape).astype(dtype)  # type: ignore[no-any-return]
    return rng.integers(0, 10, size=shape).astype(dtype)  # type: ignore[no-any-return]


def to_infer_inputs(module: Any, arrays: Mapping[str, NDArray[Any]]) -> Sequence[Any]:
    """tritonclient ``InferInput``s (of ``module``, http or grpc) holding ``arrays``."""
    import numpy as np

    inputs = []
    for name, array in arrays.items():
        value = np.asarray(array)
        datatype = "BYTES" if value.dtype == object else _datatype(value.dtype)
        tensor = module.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _datatype(dtype: np.dtype[Any]) -> str:
    for datatype, name in _NUMPY_TYPES.items():
        if name == dtype.name:
            return datatype
    raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype")
