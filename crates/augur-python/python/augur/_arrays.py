"""Token-id arrays in and out: lists, numpy arrays or torch tensors, without importing numpy or torch unless the
caller already handed us one of theirs (or asked for one by `return_tensors`)."""

import sys


def kind_of(value):
    """'pt' for a torch tensor, 'np' for a numpy array, None for anything else (lists)."""
    module = type(value).__module__.split(".")[0]
    if module == "torch" and "torch" in sys.modules:
        return "pt"
    if module == "numpy" and "numpy" in sys.modules:
        return "np"
    return None


def to_rows(value, name):
    """A batch of token-id rows from a list of ints (one row), a list of lists, or a 1-D/2-D array or tensor.

    Returns `(rows, kind)` where `kind` says what to give back (see `from_rows`)."""
    kind = kind_of(value)
    if kind is not None:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of token ids, a list of such lists, a numpy array or a torch "
                        f"tensor, not {type(value).__name__}")
    if len(value) > 0 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [list(value)]
    rows = []
    for i, row in enumerate(value):
        if not isinstance(row, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
            raise TypeError(f"`{name}` row {i} is not a list of token ids")
        rows.append([int(t) for t in row])
    return rows, kind


def from_rows(rows, kind):
    """`rows` (equal lengths) as a list of lists, a numpy int64 array or a torch long tensor."""
    if kind == "pt":
        import torch

        return torch.tensor(rows, dtype=torch.long)
    if kind == "np":
        import numpy

        return numpy.array(rows, dtype=numpy.int64)
    return rows


def tensor_kind(return_tensors):
    """Checks a tokenizer's `return_tensors` argument."""
    if return_tensors in (None, "pt", "np"):
        return return_tensors
    raise ValueError(f"Unable to convert output to tensors format {return_tensors}, augur supports 'pt' (torch), "
                     f"'np' (numpy) and None (lists).")
