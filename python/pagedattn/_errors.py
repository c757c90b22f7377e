"""pagedattn.Error, the one exception type of the package."""

from __future__ import annotations


class Error(ValueError):
    """Bad input to a pagedattn function, or a failure of the library.

    Raised before anything is written. ``str(e)`` reads
    ``pagedattn: <argument><what> = <value>: <reason>``, for example
    ``pagedattn: q.dtype = float64: expected float32, float16 or bfloat16``.

    Attributes:
        argument: the argument the error is about: a Python argument name (``"q"``,
            ``"block_table"``, ``"backend"``, ...) or, for checks made by the library on the
            values, the quantity or entry (``"num_heads"``, ``"head_dim"``,
            ``"block_table[2][1]"``, ``"context_lens[0]"``, ``"slot_mapping[3]"``).
        code: ``"invalid_argument"``, ``"out_of_range"``, ``"unsupported"``,
            ``"backend_unavailable"`` or ``"device_error"``.
    """

    def __init__(self, message: str, argument: str = "", code: str = "invalid_argument") -> None:
        super().__init__(message)
        self.argument = argument
        self.code = code
