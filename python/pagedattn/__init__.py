"""pagedattn: paged decode attention over a block-table KV cache.

One decode step attends each sequence's new query token over its whole context, whose keys and
values live in fixed-size blocks of a shared cache pool found through a per-sequence block table::

    out[b,h,:] = sum_t softmax(scale * q[b,h,:] . K_t)_t * V_t     over t < context_lens[b]
    lse[b,h]   = log(sum_t exp(scale * q[b,h,:] . K_t))

Every function takes any DLPack tensor (NumPy, PyTorch, CuPy, JAX, ...) and uses it in place,
without copies: dtypes, shapes, devices and strides are read from the tensors. CPU tensors run on
the CPU backend, CUDA tensors on the CUDA backend on the tensors' device. A bad input raises
pagedattn.Error (a ValueError) naming the argument, before anything is written. decode also
takes the attention variants (a sliding window, a logits soft-cap, ALiBi slopes and attention
sinks) and several query tokens per sequence (q_indptr), causal or under a tree mask
(tree_mask). The caches may be laid out HND [num_blocks, num_kv_heads, block_size, head_dim] or
NHD [num_blocks, block_size, num_kv_heads, head_dim] (kv_layout), with any strides: K and V as
views into one tensor work in place. They may hold f32, f16, bf16, or quantized codes: fp8 (e4m3
or e5m2) or int8, with per-tensor, per-kv-head and per-token scales, or int4 (two 4-bit codes a
byte, marked with pagedattn.int4(), with a scale per group of 32 values of every row).

mla_decode runs multi-head latent attention (DeepSeek-V2/V3) over a latent cache given as one
combined tensor or as its two parts; write_mla_cache and copy_mla_blocks write and copy that
cache.

Functions: decode, mla_decode, pack_tree_masks, write_cache, copy_blocks, write_mla_cache,
copy_mla_blocks, merge_states, workspace_size, mla_workspace_size, bf16, fp8_e4m3, fp8_e5m2,
int4; class BlockManager.
See docs/python.md in the source tree for the whole story.
"""

from __future__ import annotations

import numbers
import operator
import sys
from typing import Any, List, Optional, Sequence, Tuple, Union

from ._errors import Error
from . import _ext
from ._ext import (
    CUDA_HEAD_DIMS,
    MAX_BLOCK_SIZE,
    MAX_GROUP_SIZE,
    MAX_MLA_HEADS,
    SUPPORTED_HEAD_DIMS,
    BlockManager,
    built_with_cuda,
)

__all__ = [
    "Error",
    "BlockManager",
    "BF16Bits",
    "FP8Bits",
    "Int4Bits",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "int4",
    "decode",
    "mla_decode",
    "pack_tree_masks",
    "write_cache",
    "copy_blocks",
    "write_mla_cache",
    "copy_mla_blocks",
    "merge_states",
    "workspace_size",
    "mla_workspace_size",
    "cuda_available",
    "built_with_cuda",
    "SUPPORTED_HEAD_DIMS",
    "CUDA_HEAD_DIMS",
    "MAX_BLOCK_SIZE",
    "MAX_GROUP_SIZE",
    "MAX_MLA_HEADS",
]

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    try:
        __version__ = _version("pagedattn")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        __version__ = "unknown"
except ImportError:  # pragma: no cover
    __version__ = "unknown"

Tensor = Any
"""Any object exporting DLPack (``__dlpack__``) or the buffer protocol."""

Stream = Union[None, int, Any]
"""None (the caller's current stream), a ``cudaStream_t`` as an int, or a stream object with a
``cuda_stream`` (PyTorch) or ``ptr`` (CuPy) attribute."""


class BF16Bits:
    """A 16-bit integer tensor (uint16 or int16) whose elements are bf16 bit patterns.

    NumPy has no bfloat16 dtype of its own; ``pagedattn.bf16(x)`` marks such a tensor so that it
    is read (or written) as bf16. Tensors whose dtype is bfloat16 already (PyTorch, JAX, CuPy, or
    NumPy arrays of ``ml_dtypes.bfloat16``) need no marking.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    def __repr__(self) -> str:
        return f"pagedattn.bf16({self.tensor!r})"


def bf16(tensor: Tensor) -> BF16Bits:
    """Marks ``tensor`` (uint16 or int16 elements) as holding bf16 bit patterns."""
    return BF16Bits(tensor)


class FP8Bits:
    """An 8-bit integer tensor (uint8 or int8) whose elements are codes of an fp8 format, for
    a K or V cache: ``format`` is ``"fp8_e4m3"`` (OCP e4m3, PyTorch's float8_e4m3fn) or
    ``"fp8_e5m2"``.

    NumPy has no fp8 dtypes of its own; ``pagedattn.fp8_e4m3(x)`` and ``pagedattn.fp8_e5m2(x)``
    mark such a tensor so that it is read (or written) as fp8. Tensors whose dtype is an fp8
    format already (PyTorch's ``float8_e4m3fn`` and ``float8_e5m2``, NumPy arrays of those
    ``ml_dtypes`` types) need no marking. An int8 tensor without a marking is a cache of int8
    codes.
    """

    __slots__ = ("tensor", "format")

    def __init__(self, tensor: Tensor, format: str) -> None:
        if format not in ("fp8_e4m3", "fp8_e5m2"):
            raise Error(
                f"pagedattn: format = {format!r}: expected 'fp8_e4m3' or 'fp8_e5m2'", "format"
            )
        self.tensor = tensor
        self.format = format

    def __repr__(self) -> str:
        return f"pagedattn.{self.format}({self.tensor!r})"


def fp8_e4m3(tensor: Tensor) -> FP8Bits:
    """Marks ``tensor`` (uint8 or int8 elements) as holding fp8 e4m3 codes (OCP e4m3: 4
    exponent bits, 3 mantissa bits, no infinities; PyTorch's float8_e4m3fn)."""
    return FP8Bits(tensor, "fp8_e4m3")


def fp8_e5m2(tensor: Tensor) -> FP8Bits:
    """Marks ``tensor`` (uint8 or int8 elements) as holding fp8 e5m2 codes (OCP e5m2: 5
    exponent bits, 2 mantissa bits; PyTorch's float8_e5m2)."""
    return FP8Bits(tensor, "fp8_e5m2")


class Int4Bits:
    """An 8-bit integer tensor (uint8 or int8) holding packed int4 codes of a K or V cache: two
    signed 4-bit codes a byte (-7 to 7 written; -8 read as -8), the element of even index in the
    low nibble. Its last dimension is head_dim / 2 bytes, and its strides count bytes. An int4
    cache always comes with its group scales (``k_token_scales``, ``v_token_scales``: float32
    ``[num_blocks, num_kv_heads, block_size, head_dim / 32]``, one per group of 32 values of a
    row); head_dim must be a multiple of 32 (docs/kv_quantization.md).
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    def __repr__(self) -> str:
        return f"pagedattn.int4({self.tensor!r})"


def int4(tensor: Tensor) -> Int4Bits:
    """Marks ``tensor`` (uint8 or int8 elements, ``[..., head_dim / 2]``) as holding packed int4
    cache codes, two a byte, the even element in the low nibble."""
    return Int4Bits(tensor)


# The marked integer tensors: the module reads them as the dtype the mark names.
_MARKED = (BF16Bits, FP8Bits, Int4Bits)


def _remark(like: Any, x: Any) -> Any:
    """x marked as ``like`` is (x itself when ``like`` is not marked)."""
    if isinstance(like, BF16Bits):
        return BF16Bits(x)
    if isinstance(like, FP8Bits):
        return FP8Bits(x, like.format)
    if isinstance(like, Int4Bits):
        return Int4Bits(x)
    return x


def cuda_available() -> Tuple[bool, str]:
    """(available, why): whether the CUDA backend was built and a device is usable; ``why``
    says what is missing when it is not."""
    return _ext.cuda_available()


# ----------------------------------------------------------------------------------------------
# Tensors of the frameworks we know, without importing any framework that the caller has not.


def _module(name: str) -> Any:
    return sys.modules.get(name)


def _is_torch(x: Any) -> bool:
    torch = _module("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x: Any) -> bool:
    np = _module("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _is_cupy(x: Any) -> bool:
    cupy = _module("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def _is_ml_bf16(x: Any) -> bool:
    # ml_dtypes' bfloat16 is a user-defined NumPy dtype (kind "V"); testing the kind first keeps
    # the common case cheap (dtype.name is a slow property, and this runs for every tensor).
    return _is_numpy(x) and x.dtype.kind == "V" and x.dtype.name == "bfloat16"


def _looks_like_tensor(x: Any) -> bool:
    if hasattr(x, "__dlpack__") or _is_numpy(x):
        return True
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


def _cuda_device(x: Any) -> Optional[int]:
    """The CUDA device index of x, or None when x is not on a CUDA device."""
    if _is_torch(x):
        return x.device.index if x.device.type == "cuda" else None
    if _is_numpy(x):
        return None
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            kind, index = dev()
        except Exception:  # noqa: BLE001 - not our error to report here
            return None
        return int(index) if int(kind) == 2 else None
    return None


# ml_dtypes' fp8 types the caches take, by NumPy dtype name.
_ML_FP8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def _unwrap(x: Any, name: str, tags: List[str]) -> Any:
    """The object handed to the module: bf16 and fp8 markings noted in ``tags`` (``name`` for
    bf16, ``name:fp8_e4m3`` or ``name:fp8_e5m2`` for fp8), autograd detached. Runs for every
    tensor of every call, so the common cases return early."""
    if isinstance(x, BF16Bits):
        tags.append(name)
        x = x.tensor
    elif isinstance(x, FP8Bits):
        tags.append(f"{name}:{x.format}")
        x = x.tensor
    elif isinstance(x, Int4Bits):
        tags.append(f"{name}:int4")
        x = x.tensor
    else:
        np = sys.modules.get("numpy")
        if np is not None and isinstance(x, np.ndarray):
            dt = x.dtype
            # ml_dtypes' types are of kind "V", but float8_e5m2 is of kind "f" (the one 1-byte
            # float: NumPy has none); testing the kind first keeps the common case cheap.
            if dt.kind == "V" or (dt.kind == "f" and dt.itemsize == 1):
                dtype_name = dt.name
                if dtype_name == "bfloat16":  # ml_dtypes' bfloat16
                    tags.append(name)
                    return x.view(np.uint16)
                fmt = _ML_FP8.get(dtype_name)
                if fmt is not None:
                    tags.append(f"{name}:{fmt}")
                    return x.view(np.uint8)
                if dtype_name.startswith("float8_"):
                    raise Error(
                        f"pagedattn: {name}.dtype = {dtype_name}: not an fp8 format of the "
                        f"library (fp8 caches: float8_e4m3fn or float8_e5m2)",
                        name,
                    )
            return x
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.requires_grad:
        x = x.detach()
    return x


# PyTorch dtypes as DLPack (type code, bits): 0 int, 1 uint, 2 float, 4 bfloat, and DLPack
# 1.1's 8-bit floats: 10 float8_e4m3fn and 12 float8_e5m2 (the fp8 caches' formats), 11
# float8_e4m3fnuz, 13 float8_e5m2fnuz and 14 float8_e8m0fnu (refused by the module, which names
# them).
_TORCH_DLPACK_DTYPES: Optional[dict] = None


def _torch_dlpack_dtypes(torch: Any) -> dict:
    global _TORCH_DLPACK_DTYPES
    if _TORCH_DLPACK_DTYPES is None:
        table = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
                 torch.float64: (2, 64), torch.int32: (0, 32), torch.int16: (0, 16),
                 torch.int64: (0, 64), torch.int8: (0, 8), torch.uint8: (1, 8)}
        for name, code_bits in (("uint16", (1, 16)), ("float8_e4m3fn", (10, 8)),
                                ("float8_e5m2", (12, 8)), ("float8_e4m3fnuz", (11, 8)),
                                ("float8_e5m2fnuz", (13, 8)), ("float8_e8m0fnu", (14, 8))):
            dtype = getattr(torch, name, None)
            if dtype is not None:
                table[dtype] = code_bits
        _TORCH_DLPACK_DTYPES = table
    return _TORCH_DLPACK_DTYPES


def _describe_torch(x: Any, dtypes: dict) -> Any:
    """The tuple _ref gives for a PyTorch tensor on the CPU or a CUDA device (x as it is for
    any other device, where the dtype table lacks its dtype, or for a negated view: the DLPack
    path then refuses it with the error that names it)."""
    code_bits = dtypes.get(x.dtype)
    if code_bits is None or x.is_neg():
        return x
    if x.is_cuda:
        return (x.data_ptr(), code_bits[0], code_bits[1], 2, x.get_device(), x.shape, x.stride())
    if x.is_cpu:
        return (x.data_ptr(), code_bits[0], code_bits[1], 1, 0, x.shape, x.stride())
    return x  # another device (MPS, XPU, meta, ...): DLPack's path names it


def _ref(x: Any) -> Any:
    """What the module gets for an (unwrapped) tensor. A PyTorch tensor goes as a plain tuple
    (data pointer, DLPack type code, bits, DLPack device type, device index, shape, strides in
    elements), read from its attributes: a DLPack export costs more than the rest of a small
    call (docs/python.md). The module checks the tuple exactly as it checks a DLPack
    tensor. Anything else (and a PyTorch dtype the table lacks, so that its error names it) goes
    as it is."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return x
    return _describe_torch(x, _torch_dlpack_dtypes(torch))


def _empty(like: Any, shape: Tuple[int, ...], float32: bool, name: str) -> Any:
    """An uninitialised tensor of the same framework and device as ``like``: of its dtype, or
    float32."""
    if _is_torch(like):
        torch = _module("torch")
        return torch.empty(shape, dtype=torch.float32 if float32 else like.dtype, device=like.device)
    if _is_numpy(like):
        np = _module("numpy")
        return np.empty(shape, dtype=np.float32 if float32 else like.dtype)
    if _is_cupy(like):
        cupy = _module("cupy")
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=cupy.float32 if float32 else like.dtype)
    if _cuda_device(like) is None and _looks_like_tensor(like):
        import numpy as np

        try:
            return np.empty(shape, dtype=np.float32 if float32 else np.dtype(like.dtype))
        except TypeError:
            pass
    raise Error(
        f"pagedattn: {name} = None: cannot allocate it like a {type(like).__name__}; "
        f"pass {name}= explicitly",
        name,
    )


def _outputs(like_arg: Any, out: Any, lse: Any, return_lse: bool, out_shape: Sequence[int],
             tags: List[str]):
    """out (when None: allocated like ``like_arg`` with ``out_shape``, marked like it) and
    lse (when None and ``return_lse``: float32, out's shape without head_dim). Returns (out,
    lse, out as the caller gets it back, out and lse as handed to the module)."""
    like = like_arg.tensor if isinstance(like_arg, _MARKED) else like_arg
    if out is None:
        out = _remark(like_arg, _empty(like, tuple(int(s) for s in out_shape), False, "out"))
    if lse is None and return_lse:
        lse = _empty(like, tuple(int(s) for s in out_shape[:-1]), True, "lse")
    out_user = out.tensor if isinstance(out, _MARKED) else out
    out_in = _unwrap(out, "out", tags)
    lse_in = None if lse is None else _unwrap(lse, "lse", tags)
    return out, lse, out_user, out_in, lse_in


def _stream(stream: Stream, like: Any) -> int:
    if stream is None:
        if _is_torch(like) and like.is_cuda:
            torch = _module("torch")
            # The raw handle of PyTorch's current stream, without building a Stream object,
            # which every call would pay for; the public API where this PyTorch lacks it.
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is not None:
                return int(raw(like.get_device()))
            return int(torch.cuda.current_stream(like.device).cuda_stream)
        if _is_cupy(like):
            cupy = _module("cupy")
            with cupy.cuda.Device(like.device.id):
                return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, bool):
        pass
    elif isinstance(stream, int):
        if stream >= 0:
            return stream
    else:
        for attr in ("cuda_stream", "ptr"):
            value = getattr(stream, attr, None)
            if isinstance(value, int):
                return value
    raise Error(
        f"pagedattn: stream = {stream!r}: expected None, a cudaStream_t as a non-negative int, "
        f"or a stream object with .cuda_stream (PyTorch) or .ptr (CuPy)",
        "stream",
    )


def _check_tensor(x: Any, name: str) -> None:
    """Refuses an object that is no tensor, naming the argument; a marked tensor (bf16(),
    fp8_e4m3(), fp8_e5m2()) is checked as the tensor it marks."""
    if isinstance(x, _MARKED):
        x = x.tensor
    if not _looks_like_tensor(x):
        raise Error(
            f"pagedattn: {name} = an object of type {type(x).__name__}: expected a tensor "
            f"supporting DLPack or the buffer protocol (NumPy, PyTorch, CuPy, JAX, ...)",
            name,
        )


def _check_backend(backend: Any) -> str:
    if not isinstance(backend, str):
        raise Error(f"pagedattn: backend = {backend!r}: expected 'auto', 'cpu' or 'cuda'", "backend")
    return backend


def _per_head(x: Any, name: str) -> Any:
    """alibi_slopes, sinks, q_indptr, tree_mask, tree_mask_indptr, k_scales, v_scales,
    k_token_scales or v_token_scales as handed to the module (None stays None). The module
    checks the dtype, shape and device and names the argument; a tuple or list is refused here,
    so that it is never taken for a described tensor."""
    if x is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and type(x) is torch.Tensor:  # the serving loop's case, first
        return _describe_torch(x, _torch_dlpack_dtypes(torch))
    _check_tensor(x, name)
    return _ref(_unwrap(x, name, []))


def _int32(value: Any, name: str, meaning: str) -> int:
    """``value`` as a plain int in the int32 range: any integer type but bool is taken. The
    errors name ``name``; ``meaning`` says in the type error what a special value means."""
    if type(value) is not int:  # a plain int (never a bool) needs no conversion
        try:
            if isinstance(value, bool):
                raise TypeError
            index = operator.index(value)
        except TypeError:
            raise Error(
                f"pagedattn: {name} = {value!r}: expected an int ({meaning})", name
            ) from None
        value = index
    if not -(2**31) <= value < 2**31:
        raise Error(f"pagedattn: {name} = {value}: outside the int32 range", name)
    return value


def _variant_args(window_left: Any, logits_soft_cap: Any, alibi_slopes: Any, sinks: Any) -> tuple:
    """The attention variants as the module's trailing decode arguments. Their types are checked
    here; their values (window_left >= -1, a finite cap >= 0, finite slopes, sinks neither NaN
    nor +inf) by the library, which names the argument or the element."""
    window = _int32(window_left, "window_left", "-1: no window")
    cap = logits_soft_cap
    if type(cap) is not float:
        if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
            raise Error(
                f"pagedattn: logits_soft_cap = {cap!r}: expected a number (0: no soft-cap)",
                "logits_soft_cap",
            )
        cap = float(cap)
    return window, cap, _per_head(alibi_slopes, "alibi_slopes"), _per_head(sinks, "sinks")


_NO_VARIANTS = (-1, 0.0, None, None)


def _kv_layout(kv_layout: Any) -> str:
    """kv_layout as the module takes it: "HND" or "NHD" (given in any case)."""
    if type(kv_layout) is str and kv_layout == "HND":  # the default, first
        return "HND"
    if isinstance(kv_layout, str):
        upper = kv_layout.upper()
        if upper in ("HND", "NHD"):
            return upper
    raise Error(
        f"pagedattn: kv_layout = {kv_layout!r}: expected 'HND' ([num_blocks, num_kv_heads, "
        f"block_size, head_dim]) or 'NHD' ([num_blocks, block_size, num_kv_heads, head_dim])",
        "kv_layout",
    )


def _kv_scales(k_scale: Any, v_scale: Any, k_scales: Any, v_scales: Any) -> dict:
    """The quantized cache scales as the module's keyword arguments: none when all are the
    defaults (1, 1, None, None), so that a call without them passes the module nothing. Their
    types are checked here; their values (each in [1e-30, 1e30]) and whether the cache is
    quantized at all by the library, which names the argument or the element
    (``k_scales[3]``)."""
    if (k_scales is None and v_scales is None and type(k_scale) in (float, int)
            and type(v_scale) in (float, int) and k_scale == 1 and v_scale == 1):
        return {}
    kw = {}
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if type(value) is not float:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise Error(
                    f"pagedattn: {name} = {value!r}: expected a number (per kv head: "
                    f"{name}s=, a float32 tensor [num_kv_heads])",
                    name,
                )
            try:
                value = float(value)
            except OverflowError:
                raise Error(
                    f"pagedattn: {name} = {value!r}: outside the float range", name
                ) from None
        kw[name] = value
    kw["k_scales"] = _per_head(k_scales, "k_scales")
    kw["v_scales"] = _per_head(v_scales, "v_scales")
    return kw


def _token_scale_kwargs(k_token_scales: Any, v_token_scales: Any, keywords: dict) -> None:
    """Adds k_token_scales and v_token_scales to the module's keyword arguments when either is
    given. The module checks that both are, their dtype, shape and device, and turns their
    strides into the library's token_scale_strides; the library checks their values (decode)
    and that the cache is quantized."""
    if k_token_scales is not None or v_token_scales is not None:
        keywords["k_token_scales"] = _per_head(k_token_scales, "k_token_scales")
        keywords["v_token_scales"] = _per_head(v_token_scales, "v_token_scales")


def _query_token_args(q_indptr: Any, max_q_len: Any) -> tuple:
    """q_indptr and max_q_len as the module's last two decode arguments. max_q_len's type is
    checked here, its value (at least 1, and at least each sequence's query count) by the
    library; None has the module compute it from q_indptr."""
    if max_q_len is not None:
        max_q_len = _int32(max_q_len, "max_q_len", "None: computed from q_indptr")
    return _per_head(q_indptr, "q_indptr"), max_q_len


def _tree_mask_kwargs(tree_mask: Any, tree_mask_indptr: Any, keywords: dict) -> None:
    """Adds tree_mask and tree_mask_indptr to the module's keyword arguments when either is
    given. The module checks that both are, with q_indptr, and their dtypes, shapes and device;
    the library their values."""
    if tree_mask is not None or tree_mask_indptr is not None:
        keywords["tree_mask"] = _per_head(tree_mask, "tree_mask")
        keywords["tree_mask_indptr"] = _per_head(tree_mask_indptr, "tree_mask_indptr")


def pack_tree_masks(masks: Sequence[Any]) -> Tuple[Any, Any]:
    """Packs one boolean mask per sequence into decode's ``tree_mask`` and ``tree_mask_indptr``.

    ``masks[b]`` is sequence b's n_b x n_b mask over its query tokens (n_b = q_indptr[b + 1] -
    q_indptr[b]; a sequence without query tokens takes a 0 x 0 mask): ``masks[b][i, j]`` says
    whether token i attends new token j, which must come no later (j <= i). Any array-like of
    bools (NumPy, a CPU PyTorch tensor, nested lists). Each mask is flattened row-major and
    packed with little-endian bit order (``numpy.packbits(..., bitorder="little")``) into its
    own ceil(n_b * n_b / 8) bytes.

    Returns:
        (tree_mask, tree_mask_indptr): NumPy uint8 [total bytes] and int32 [len(masks) + 1],
        byte offsets, in host memory.

    Raises:
        pagedattn.Error: naming ``masks[b]`` for a mask that is not a square array of bools or
            has a bit above its diagonal set.
    """
    import numpy as np

    packed = []
    for b, mask in enumerate(masks):
        m = np.asarray(mask)
        name = f"masks[{b}]"
        if m.dtype != np.bool_:
            raise Error(f"pagedattn: {name}.dtype = {m.dtype}: expected bool", name)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise Error(f"pagedattn: {name}.shape = {m.shape}: expected a square [n, n]", name)
        above = np.argwhere(np.triu(m, 1))
        if len(above):
            i, j = (int(x) for x in above[0])
            raise Error(
                f"pagedattn: {name}[{i}, {j}] = True: token {i} may not attend the later token "
                f"{j} (bits above the diagonal must be clear)",
                name,
            )
        packed.append(np.packbits(m.reshape(-1), bitorder="little"))
    sizes = [len(p) for p in packed]
    indptr = np.zeros(len(packed) + 1, dtype=np.int64)
    np.cumsum(sizes, out=indptr[1:])
    if indptr[-1] >= 2**31:
        raise Error(f"pagedattn: masks = {len(packed)} masks: {int(indptr[-1])} bytes, "
                    f"beyond the int32 offsets of tree_mask_indptr", "masks")
    data = np.concatenate(packed) if packed else np.zeros(0, dtype=np.uint8)
    return data.astype(np.uint8, copy=False), indptr.astype(np.int32)


# ----------------------------------------------------------------------------------------------
# The functions


def decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    scale: Optional[float] = None,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    stream: Stream = None,
    workspace: Optional[Tensor] = None,
    checked: bool = False,
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    q_indptr: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    tree_mask: Optional[Tensor] = None,
    tree_mask_indptr: Optional[Tensor] = None,
    kv_layout: str = "HND",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    k_scales: Optional[Tensor] = None,
    v_scales: Optional[Tensor] = None,
    k_token_scales: Optional[Tensor] = None,
    v_token_scales: Optional[Tensor] = None,
    batch_invariant: bool = False,
    share_prefixes: bool = True,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """One decode step of attention over a paged KV cache.

    For sequence b and query head h (kv = h // (num_heads // num_kv_heads)), over the tokens
    t < context_lens[b], token t living in block block_table[b, t // block_size] at slot
    t % block_size::

        out[b,h,:] = sum_t softmax(scale * q[b,h,:] . K_t)_t * V_t
        lse[b,h]   = log(sum_t exp(scale * q[b,h,:] . K_t))

    A context of 0 gives out = 0 and lse = -inf. Table entries past a context are never read.

    The attention variants (window_left, logits_soft_cap, alibi_slopes, sinks; see
    docs/variants.md) change which tokens are attended and what the logits are; they combine
    freely, and the defaults give the plain attention above. With L = context_lens[b] and the
    query at position L - 1, the logit of token t is s_t = scale * q[b,h,:] . K_t, then
    cap * tanh(s_t / cap) with a soft-cap, then + alibi_slopes[h] * (t - (L - 1)) with ALiBi.

    Multi-token queries (speculative decoding, chunked prefill): with ``q_indptr``, sequence b
    has n_b = q_indptr[b + 1] - q_indptr[b] query tokens, rows q_indptr[b] to
    q_indptr[b + 1] - 1 of q, out and lse. Its token i sits at position P = L - n_b + i (the
    new tokens' keys and values are already in the cache) and is exactly a query of a context
    of P + 1 tokens: it attends to tokens t <= P (causal), and the window, ALiBi and sinks are
    taken from P as from L - 1 above. A token with P < 0 attends to nothing (out = 0, lse =
    -inf, or the sink).

    Tree masks (speculative decoding over a token tree: EAGLE, Medusa): with ``tree_mask`` and
    ``tree_mask_indptr`` (and q_indptr), sequence b's n_b x n_b mask replaces the causal rule
    among its new tokens: token i attends every token before the new ones (t < L - n_b) and
    new token j (at L - n_b + j) where bit (i, j) is set; the window, ALiBi and sinks stay as
    above. ``pack_tree_masks`` packs boolean masks into these two tensors. Both backends;
    on CUDA they live on q's device.

    Quantized caches (docs/fp8.md for the fp8 formats): k_cache and v_cache may hold fp8
    codes, e4m3 or e5m2, or int8 codes (-127 to 127), with q and out in float32, float16 or
    bfloat16. A code c of kv head kv in slot s of block n means
    c * k_scale * k_scales[kv] * k_token_scales[n, kv, s] in K (k_scales None: no factor
    k_scales[kv]; k_token_scales None: no per-token factor), and likewise with v_scale,
    v_scales and v_token_scales in V: pass the scales the cache was written with
    (write_cache). Both backends take them.

    Args:
        q: [batch, num_heads, head_dim], float32, float16 or bfloat16. Each sequence's
            [num_heads, head_dim] contiguous; sequences may be further apart than
            num_heads * head_dim elements (strides (S, head_dim, 1), S >= num_heads *
            head_dim), so the query part of a fused QKV projection,
            ``qkv[:, :num_heads * head_dim].view(batch, num_heads, head_dim)``, is read in
            place. On CUDA each sequence's row must start 16-byte aligned (S times the element
            size a multiple of 16).
        k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim] (``kv_layout``
            "HND") or [num_blocks, block_size, num_kv_heads, head_dim] ("NHD"), one dtype:
            float32, float16, bfloat16; fp8: PyTorch's float8_e4m3fn or float8_e5m2,
            ``ml_dtypes`` arrays of those, or uint8 codes marked with
            ``pagedattn.fp8_e4m3()`` or ``pagedattn.fp8_e5m2()``; or int8 codes: any int8
            tensor (``numpy.int8``, ``torch.int8``, ...). Any strides with head_dim
            contiguous (stride 1) and rows that do not overlap, the same in both: views such
            as ``kv[:, 0]`` and ``kv[:, 1]`` of a combined [num_blocks, 2, ...] tensor, or a
            slice of a larger pool, are read in place. On CUDA every stride times the element
            size must be a multiple of 16 bytes. num_heads must be a multiple of num_kv_heads
            (GQA/MQA).
        block_table: int32 [batch, max_blocks_per_seq]; rows contiguous, any row stride.
        context_lens: int32 [batch].
        scale: softmax scale; default 1 / sqrt(head_dim).
        out: [batch, num_heads, head_dim], any of the three float dtypes, laid out as q may
            be (a slice of a wider buffer: only each sequence's num_heads * head_dim elements
            are written; on CUDA its rows start at even elements); allocated like q (same
            framework, device and dtype), dense, when None.
        lse: float32 [batch, num_heads], written when given; allocated when None and
            ``return_lse``.
        return_lse: return (out, lse) instead of out.
        backend: "auto" (the tensors' device decides), "cpu" or "cuda"; an explicit choice
            must match the tensors' device.
        stream: CUDA stream to run on. None takes ``torch.cuda.current_stream()`` for PyTorch
            tensors, CuPy's current stream for CuPy arrays, else the default stream.
        workspace: CUDA device scratch of at least ``workspace_size(q, k_cache, block_table)``
            bytes (any dtype, contiguous). With one, decode allocates nothing and does not
            synchronize, so it can be captured in a CUDA graph; without one the library keeps
            a cached buffer per device. Ignored on the CPU.
        checked: CUDA: copy context_lens and block_table to the host and check them (the same
            errors as the CPU path) before running; synchronizes the stream, so not under
            graph capture. Unchecked, bad lengths are clamped and bad block ids skipped. The
            CPU backend always checks.
        window_left: -1 (the default) attends to the whole context; N >= 0 to the last N + 1
            tokens only (t >= L - 1 - N). Blocks before the window, and their table entries,
            are never read (they may hold -1). A sliding window of W tokens counting the
            query's own is window_left = W - 1.
        logits_soft_cap: cap > 0 replaces each scaled logit s by cap * tanh(s / cap) (Gemma
            2); 0 (the default) leaves it.
        alibi_slopes: float32 [num_heads] on q's device, contiguous: ALiBi adds
            alibi_slopes[h] * (t - (L - 1)) to the logit of token t (after the soft-cap).
            Slopes must be finite.
        sinks: float32 [num_heads] on q's device, contiguous: one logit per query head that
            joins the softmax's denominator and brings no value (gpt-oss). lse includes it, and
            a context of 0 gives out = 0 and lse = sinks[h]. -inf is no sink; NaN and +inf are
            errors. The values of alibi_slopes and sinks are checked on the CPU and, on CUDA,
            with ``checked``.
        q_indptr: int32 [batch + 1] on q's device, contiguous: multi-token queries (above).
            q and out are then [num_q_tokens, num_heads, head_dim] and lse
            [num_q_tokens, num_heads], with num_q_tokens = q.shape[0] = q_indptr[batch]; the
            batch is context_lens.shape[0]. q_indptr[0] = 0 and it never decreases (checked on
            the CPU and, on CUDA, with ``checked``).
        max_q_len: with q_indptr, a bound (>= 1) on every sequence's query count; it sizes the
            CUDA grid and workspace. None computes it from q_indptr: in place for host memory,
            but for a CUDA q_indptr by a copy to the host that waits for the stream, so pass it
            to avoid that synchronization (and under CUDA-graph capture).
        tree_mask: uint8 [bytes] on q's device, contiguous: the packed bits of every
            sequence's mask, bit (i, j) of sequence b at bit (i * n_b + j) % 8 (little-endian
            bit order) of byte tree_mask_indptr[b] + (i * n_b + j) // 8, as
            ``numpy.packbits(mask.reshape(-1), bitorder="little")`` packs a boolean mask. Bits
            with j > i must be clear. Given with tree_mask_indptr and q_indptr only.
        tree_mask_indptr: int32 [batch + 1] on q's device, contiguous: sequence b's mask
            starts at byte tree_mask_indptr[b]; tree_mask_indptr[0] >= 0 and each span
            [tree_mask_indptr[b], tree_mask_indptr[b + 1]) holds at least ceil(n_b * n_b / 8)
            bytes. The bytes the masks take must lie within tree_mask. The values and the bits
            are checked on the CPU.
        kv_layout: "HND" (the default) or "NHD", in any case: the order of the caches'
            dimensions (above). Anything else raises pagedattn.Error (a ValueError) naming
            kv_layout.
        k_scale, v_scale: quantized caches: the per-tensor scales of K and V (vLLM's k_scale
            and v_scale), real numbers in [1e-30, 1e30]. Other caches take 1 only.
        k_scales, v_scales: quantized caches: float32 [num_kv_heads] tensors on the caches'
            device, contiguous: per-kv-head scales, multiplied with k_scale and v_scale. Each
            in [1e-30, 1e30] (checked on the CPU and, on CUDA, with ``checked``). Other caches
            take None only.
        k_token_scales, v_token_scales: quantized caches, both or neither: float32 tensors
            [num_blocks, num_kv_heads, block_size] (in this order whatever kv_layout) on the
            caches' device, one scale per cache row (block, kv head, slot), multiplied with
            the others; write_cache writes them. Any strides with positive steps and no two
            rows at one address, the same in both: a [num_blocks, block_size, num_kv_heads]
            tensor kept beside an NHD cache goes as its view ``s.transpose(0, 2, 1)``
            (``s.permute(0, 2, 1)`` in PyTorch), and K's and V's scales may be two views into
            one tensor. The scales of every row in the blocks a sequence reads, below its
            context length, must be in [1e-30, 1e30] (checked on the CPU); rows past it are
            never read. Other caches take None only.
        batch_invariant: give each sequence's out and lse bits that depend on its own inputs
            alone, not on the rest of the batch: splits of a fixed token count and a fixed
            merge order (docs/batch_invariance.md, which gives its cost). On CUDA a caller's
            workspace must then be sized with ``workspace_size(..., batch_invariant=True)``.
        share_prefixes: sequences whose block tables begin with the same block ids (forks:
            parallel sampling, beam search, a shared system prompt) read those blocks once for
            all of them, found from the tables (the default; docs/shared_prefix.md). The results
            equal the plain decode's within the dtype's tolerance, not bitwise;
            ``batch_invariant`` turns it off. The CPU backend shares; CUDA decodes plainly.

    All tensors must be on one device. The input tensors are read in place and ``out``/``lse``
    written in place: nothing is copied.

    Returns:
        out, or (out, lse) when ``return_lse``.

    Raises:
        pagedattn.Error: naming the argument, before anything is written.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        T = torch.Tensor
        if (type(q) is T and type(k_cache) is T and type(v_cache) is T and type(block_table) is T
                and type(context_lens) is T and (out is None or type(out) is T)
                and (lse is None or type(lse) is T) and (workspace is None or type(workspace) is T)
                and type(backend) is str):
            return _decode_torch(torch, q, k_cache, v_cache, block_table, context_lens, scale, out,
                                 lse, return_lse, backend, stream, workspace, checked, window_left,
                                 logits_soft_cap, alibi_slopes, sinks, q_indptr, max_q_len,
                                 tree_mask, tree_mask_indptr, kv_layout, k_scale, v_scale,
                                 k_scales, v_scales, k_token_scales, v_token_scales,
                                 batch_invariant, share_prefixes)
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table), ("context_lens", context_lens)):
        _check_tensor(x, name)
    for name, x in (("out", out), ("lse", lse), ("workspace", workspace)):
        if x is not None:
            _check_tensor(x, name)
    backend = _check_backend(backend)
    layout = _kv_layout(kv_layout)
    tags: List[str] = []
    q_in = _unwrap(q, "q", tags)
    k_in = _unwrap(k_cache, "k_cache", tags)
    v_in = _unwrap(v_cache, "v_cache", tags)
    out, lse, out_user, out_in, lse_in = _outputs(q, out, lse, return_lse, q_in.shape, tags)
    ws_in = None if workspace is None else _unwrap(workspace, "workspace", [])
    if alibi_slopes is None and sinks is None and window_left == -1 and logits_soft_cap == 0.0:
        variants: tuple = ()
    else:
        variants = _variant_args(window_left, logits_soft_cap, alibi_slopes, sinks)
    if q_indptr is not None or max_q_len is not None:
        variants = (variants or _NO_VARIANTS) + _query_token_args(q_indptr, max_q_len)
    keywords = _kv_scales(k_scale, v_scale, k_scales, v_scales)
    _token_scale_kwargs(k_token_scales, v_token_scales, keywords)
    _tree_mask_kwargs(tree_mask, tree_mask_indptr, keywords)
    if layout != "HND":
        keywords["kv_layout"] = layout
    if batch_invariant:
        keywords["batch_invariant"] = True
    if not share_prefixes:
        keywords["share_prefixes"] = False
    _ext.decode(
        _ref(q_in), _ref(k_in), _ref(v_in),
        _ref(_unwrap(block_table, "block_table", [])),
        _ref(_unwrap(context_lens, "context_lens", [])),
        _ref(out_in), _ref(lse_in), None if scale is None else float(scale), backend,
        _stream(stream, q_in), _ref(ws_in), bool(checked), tags, *variants, **keywords,
    )
    if return_lse:
        return out_user, lse
    return out_user


def _decode_torch(torch, q, k_cache, v_cache, block_table, context_lens, scale, out, lse,
                  return_lse, backend, stream, workspace, checked, window_left, logits_soft_cap,
                  alibi_slopes, sinks, q_indptr, max_q_len, tree_mask, tree_mask_indptr, kv_layout,
                  k_scale, v_scale, k_scales, v_scales, k_token_scales, v_token_scales,
                  batch_invariant, share_prefixes):
    """decode() when every tensor is a plain PyTorch tensor, the serving loop's case: the same
    checks (in the module) and results, with the least Python work per call. A call without
    attention variants, multi-token queries, an NHD cache or cache scales passes the module none
    of their arguments; only one that sets them pays for checking and describing them."""
    layout = _kv_layout(kv_layout)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    stream = _stream(stream, q)
    dtypes = _torch_dlpack_dtypes(torch)
    q_d = _describe_torch(q, dtypes)
    k_d = _describe_torch(k_cache, dtypes)
    v_d = _describe_torch(v_cache, dtypes)
    table_d = _describe_torch(block_table, dtypes)
    lens_d = _describe_torch(context_lens, dtypes)
    out_d = _describe_torch(out, dtypes)
    lse_d = None if lse is None else _describe_torch(lse, dtypes)
    scale = None if scale is None else float(scale)
    ws_d = None if workspace is None else _describe_torch(workspace, dtypes)
    plain = (alibi_slopes is None and sinks is None and window_left == -1
             and logits_soft_cap == 0.0)
    keywords = _kv_scales(k_scale, v_scale, k_scales, v_scales)
    _token_scale_kwargs(k_token_scales, v_token_scales, keywords)
    _tree_mask_kwargs(tree_mask, tree_mask_indptr, keywords)
    if batch_invariant:
        keywords["batch_invariant"] = True
    if not share_prefixes:
        keywords["share_prefixes"] = False
    if plain and q_indptr is None and max_q_len is None and layout == "HND" and not keywords:
        _ext.decode(q_d, k_d, v_d, table_d, lens_d, out_d, lse_d, scale, backend, stream, ws_d,
                    bool(checked), [])
    else:
        extra = _NO_VARIANTS if plain else _variant_args(window_left, logits_soft_cap,
                                                         alibi_slopes, sinks)
        if q_indptr is not None or max_q_len is not None:
            extra = extra + _query_token_args(q_indptr, max_q_len)
        if layout != "HND":
            keywords["kv_layout"] = layout
        _ext.decode(q_d, k_d, v_d, table_d, lens_d, out_d, lse_d, scale, backend, stream, ws_d,
                    bool(checked), [], *extra, **keywords)
    if return_lse:
        return out, lse
    return out


def workspace_size(q: Tensor, k_cache: Tensor, block_table: Tensor, *, backend: str = "auto",
                   max_q_len: Optional[int] = None, kv_layout: str = "HND",
                   batch_invariant: bool = False) -> int:
    """Bytes of CUDA workspace decode needs for these shapes on the tensors' device.

    Depends on batch, num_heads, head_dim, num_kv_heads, block_size, the table's width and the
    dtypes of q and k_cache (they pick the kernel) only, not on the context lengths, so one
    workspace serves every later step of the same shapes and dtypes, CUDA-graph replays
    included. Pass q and k_cache as decode gets them (a bf16 or fp8 marking included). 0 for
    CPU tensors.

    For multi-token queries (decode's ``q_indptr``) pass the ``max_q_len`` the decode calls will
    pass: q is then [num_q_tokens, num_heads, head_dim] and the batch is block_table.shape[0].
    ``kv_layout`` says how to read k_cache's shape, as for decode(); its strides do not matter.
    ``batch_invariant`` sizes it for decode's batch-invariant mode, which needs more: room for
    every sequence's fixed-size splits at the table's capacity.
    """
    for name, x in (("q", q), ("k_cache", k_cache), ("block_table", block_table)):
        _check_tensor(x, name)
    tags: List[str] = []
    backend = _check_backend(backend)
    layout = _kv_layout(kv_layout)
    max_len = None if max_q_len is None else _query_token_args(None, max_q_len)[1]
    return _ext.workspace_size(
        _ref(_unwrap(q, "q", tags)), _ref(_unwrap(k_cache, "k_cache", tags)),
        _ref(_unwrap(block_table, "block_table", [])), backend, max_len, layout, tags,
        bool(batch_invariant),
    )


def write_cache(
    key: Tensor,
    value: Tensor,
    slot_mapping: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    backend: str = "auto",
    stream: Stream = None,
    checked: bool = False,
    kv_layout: str = "HND",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    k_scales: Optional[Tensor] = None,
    v_scales: Optional[Tensor] = None,
    k_token_scales: Optional[Tensor] = None,
    v_token_scales: Optional[Tensor] = None,
) -> None:
    """Writes new tokens' keys and values into the paged cache: token i goes to slot
    ``slot_mapping[i]`` (slot = block * block_size + offset; -1 skips the token).

    Args:
        key, value: [num_tokens, num_kv_heads, head_dim], one float dtype (float32, float16
            or bfloat16; converted to the cache's dtype, rounding to nearest even); each
            token's row contiguous, tokens any stride apart (the same in both).
        slot_mapping: int32 [num_tokens]; slots of one call must be distinct.
        k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim] ("HND") or
            [num_blocks, block_size, num_kv_heads, head_dim] ("NHD"), written in place; any
            strides with head_dim contiguous, the same in both, as for decode(). Of any
            dtype decode takes, fp8 and int8 included.
        k_scale, v_scale, k_scales, v_scales: quantized caches: the scales, as for decode()
            (pass the ones the decodes will pass). A quantized cache stores x / scale for each
            value x of kv head kv (scale = k_scale * k_scales[kv] in f32 for K, alike for V;
            with per-token scales, times the row's), rounded to the nearest code with ties to
            even; finite values beyond the format's range saturate to its largest finite code
            (e4m3 +-448, e5m2 +-57344, int8 +-127). In fp8 NaN stays NaN, and Inf stays Inf in
            e5m2 and becomes NaN in e4m3; in int8 NaN becomes 0 and Inf saturates. Other
            caches take the defaults only.
        k_token_scales, v_token_scales: quantized caches, both or neither: float32
            [num_blocks, num_kv_heads, block_size] tensors, laid out as decode() takes them,
            written in place: each written row (token, kv head) gets its own scale
            s = amax / (M * k_scale * k_scales[kv]) (rounded to f32), amax the row's largest
            finite |x| and M the format's largest code (448, 57344 or 127), clamped into
            [1e-30, 1e30]; s = 1 for a row with no finite nonzero value. The row's codes are
            then those of x / (k_scale * k_scales[kv] * s). V alike. Only the written rows'
            scales are written.
        backend, stream: as for decode().
        kv_layout: "HND" (the default) or "NHD", as for decode().
        checked: CUDA: copy slot_mapping (and k_scales, v_scales) to the host and check every
            slot (and scale) first, as the CPU backend always does (a synchronization; not
            under graph capture). Unchecked, the
            default as for decode(), out-of-range slots are skipped and repeated slots are not
            looked for; nothing is ever written outside the caches.

    Raises:
        pagedattn.Error: naming the argument (``slot_mapping[i]`` for a slot out of range),
            before anything is written.
    """
    for name, x in (("key", key), ("value", value), ("slot_mapping", slot_mapping),
                    ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(x, name)
    backend = _check_backend(backend)
    layout = _kv_layout(kv_layout)
    scales = _kv_scales(k_scale, v_scale, k_scales, v_scales)
    _token_scale_kwargs(k_token_scales, v_token_scales, scales)
    tags: List[str] = []
    k_in = _unwrap(k_cache, "k_cache", tags)
    _ext.write_cache(
        _ref(_unwrap(key, "key", tags)), _ref(_unwrap(value, "value", tags)),
        _ref(_unwrap(slot_mapping, "slot_mapping", [])), _ref(k_in),
        _ref(_unwrap(v_cache, "v_cache", tags)),
        backend, _stream(stream, k_in), bool(checked), tags, layout, **scales,
    )


def copy_blocks(
    k_cache: Tensor,
    v_cache: Tensor,
    pairs: Union[Sequence[Tuple[int, int]], Tensor],
    *,
    backend: str = "auto",
    stream: Stream = None,
    kv_layout: str = "HND",
    k_token_scales: Optional[Tensor] = None,
    v_token_scales: Optional[Tensor] = None,
) -> None:
    """Copies whole blocks src -> dst in both caches (every kv head and slot): the copy half of
    copy-on-write, as BlockManager.append_token() asks for it.

    Args:
        k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim] ("HND") or
            [num_blocks, block_size, num_kv_heads, head_dim] ("NHD"), written in place; any
            strides with head_dim contiguous, the same in both, and any dtype (fp8 and int8
            included), as for decode(). Only the blocks' rows are copied, bit for bit: padding
            between them is left as it is.
        pairs: (src, dst) block ids: a sequence of pairs or an int32/int64 CPU tensor [n, 2]
            (host memory for both backends). A dst may not appear twice nor be any pair's src.
        backend, stream: as for decode().
        kv_layout: "HND" (the default) or "NHD", as for decode().
        k_token_scales, v_token_scales: a quantized cache's per-token scales, both or
            neither, as decode() takes them: each copied block's scales are copied with its
            rows, in place.

    Raises:
        pagedattn.Error: naming the argument, before anything is copied.
    """
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(x, name)
    backend = _check_backend(backend)
    layout = _kv_layout(kv_layout)
    token_scales: dict = {}
    _token_scale_kwargs(k_token_scales, v_token_scales, token_scales)
    tags: List[str] = []
    k_in = _unwrap(k_cache, "k_cache", tags)
    # PyTorch caches go described, as to decode: DLPack exports of fp8 tensors are not
    # supported by every PyTorch release.
    _ext.copy_blocks(
        _ref(k_in), _ref(_unwrap(v_cache, "v_cache", tags)), pairs, backend,
        _stream(stream, k_in), tags, layout, **token_scales,
    )


def merge_states(
    parts: Tensor,
    part_lse: Tensor,
    *,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    stream: Stream = None,
) -> Any:
    """Merges the attention states of several segments of the same queries' contexts (each a
    decode over part of every context: shards on several GPUs, a shared prefix and a suffix)
    into the result over the whole contexts: ``m = max_s lse_s``, ``w_s = exp(lse_s - m)``,
    ``out = sum_s w_s out_s / sum_s w_s``, ``lse = m + log(sum_s w_s)``. Segments with
    ``lse = -inf`` (no tokens) weigh nothing; rows whose segments are all empty get out = 0,
    lse = -inf; a NaN lse gives NaN. See docs/context_parallel.md.

    Args:
        parts: [num_segments, ..., head_dim], f32/f16/bf16: each segment's decode ``out``
            (e.g. [S, batch, num_heads, head_dim]), contiguous.
        part_lse: float32 [num_segments, ...]: each segment's decode ``lse``, contiguous.
        out: [..., head_dim], any float dtype; allocated like ``parts`` when None.
        lse: float32 [...], written when given (allocated when ``return_lse``).
        return_lse: also return lse.
        backend, stream: as for decode().

    Returns:
        out, or (out, lse) when ``return_lse``.

    Raises:
        pagedattn.Error: naming the argument, before anything is written.
    """
    for name, x in (("parts", parts), ("part_lse", part_lse)):
        _check_tensor(x, name)
    for name, x in (("out", out), ("lse", lse)):
        if x is not None:
            _check_tensor(x, name)
    backend = _check_backend(backend)
    tags: List[str] = []
    parts_in = _unwrap(parts, "parts", tags)
    shape = tuple(int(s) for s in parts_in.shape)
    if len(shape) < 2:
        raise Error(
            f"pagedattn: parts.shape = {list(shape)}: expected [num_segments, ..., head_dim]",
            "parts",
        )
    out, lse, out_user, out_in, lse_in = _outputs(parts, out, lse, return_lse, shape[1:], tags)
    _ext.merge_states(
        parts_in, _unwrap(part_lse, "part_lse", []), out_in, lse_in, backend,
        _stream(stream, parts_in), tags,
    )
    if return_lse:
        return out_user, lse
    return out_user


def _latent_cache(kv_cache: Any, tags: List[str]) -> Tuple[Any, Any, Any]:
    """kv_cache (mla_decode's, write_mla_cache's, copy_mla_blocks') as the module takes it:
    (combined tensor, None) or (c_cache, kpe_cache), unwrapped and described, and the (first)
    tensor unwrapped, to pick the default stream from."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise Error(
                f"pagedattn: kv_cache = a {type(kv_cache).__name__} of {len(kv_cache)} items: "
                f"expected one tensor [num_blocks, block_size, kv_lora_rank + rope_dim] or the "
                f"pair (c_cache, kpe_cache)",
                "kv_cache",
            )
        c_cache, kpe_cache = kv_cache
        _check_tensor(c_cache, "c_cache")
        _check_tensor(kpe_cache, "kpe_cache")
        c_in = _unwrap(c_cache, "c_cache", tags)
        return _ref(c_in), _ref(_unwrap(kpe_cache, "kpe_cache", tags)), c_in
    _check_tensor(kv_cache, "kv_cache")
    kv_in = _unwrap(kv_cache, "kv_cache", tags)
    return _ref(kv_in), None, kv_in


def _kv_scale(kv_scale: Any) -> float:
    """kv_scale as a float; its value (1 for an unquantized cache, else in [1e-30, 1e30]) is
    checked by the library."""
    if type(kv_scale) is float:
        return kv_scale
    if isinstance(kv_scale, bool) or not isinstance(kv_scale, numbers.Real):
        raise Error(f"pagedattn: kv_scale = {kv_scale!r}: expected a number", "kv_scale")
    try:
        return float(kv_scale)
    except OverflowError:
        raise Error(f"pagedattn: kv_scale = {kv_scale!r}: outside the float range",
                    "kv_scale") from None


def mla_decode(
    q_nope: Tensor,
    q_pe: Tensor,
    kv_cache: Union[Tensor, Tuple[Tensor, Tensor]],
    block_table: Tensor,
    context_lens: Tensor,
    *,
    scale: Optional[float] = None,
    kv_scale: float = 1.0,
    out: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    stream: Stream = None,
    workspace: Optional[Tensor] = None,
    checked: bool = False,
    q_indptr: Optional[Tensor] = None,
    max_q_len: Optional[int] = None,
    batch_invariant: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """One decode step of multi-head latent attention (MLA, DeepSeek-V2/V3), absorbed form.

    Every token has one latent cache row: kv_lora_rank values c and rope_dim values k_pe, shared
    by all query heads. For query row r of sequence b and head h, over the tokens t the row
    attends (t < context_lens[b]; token t in block block_table[b, t // block_size], slot
    t % block_size)::

        s_t        = scale * (q_nope[r,h,:] . c_t + q_pe[r,h,:] . k_pe_t)
        out[r,h,:] = sum_t softmax(s)_t * c_t          (kv_lora_rank values)
        lse[r,h]   = log(sum_t exp(s_t))

    The caller folds W_UK into q_nope and applies W_UV to out. A context of 0 gives out = 0 and
    lse = -inf. With ``q_indptr`` each sequence has several query tokens, each attending causally
    up to its own position, as in decode(). See docs/mla.md.

    Args:
        q_nope: [batch, num_heads, kv_lora_rank] (with q_indptr: [num_q_tokens, ...]), float32,
            float16 or bfloat16; the last dimension contiguous, heads and rows any distance
            apart: FlashMLA's one q of [rows, num_heads, kv_lora_rank + rope_dim] goes as
            ``q[..., :kv_lora_rank]`` and ``q[..., kv_lora_rank:]``.
        q_pe: [batch, num_heads, rope_dim], q_nope's dtype, laid out likewise.
        kv_cache: the latent cache, either one tensor [num_blocks, block_size,
            kv_lora_rank + rope_dim] holding c then k_pe in each row (vLLM, FlashMLA, SGLang;
            [num_blocks, block_size, 1, kv_lora_rank + rope_dim] too), or the pair
            ``(c_cache, kpe_cache)`` of [num_blocks, block_size, kv_lora_rank] and
            [num_blocks, block_size, rope_dim] (FlashInfer). float32, float16, bfloat16 or fp8
            (PyTorch's float8_e4m3fn and float8_e5m2, ``ml_dtypes`` arrays of those, or uint8
            codes marked with ``pagedattn.fp8_e4m3()`` or ``pagedattn.fp8_e5m2()``). Any
            positive block and slot strides with each row contiguous: views and padded pools
            are read in place.
        block_table: int32 [batch, max_blocks_per_seq]; rows contiguous, any row stride.
        context_lens: int32 [batch].
        scale: softmax scale; default 1 / sqrt(kv_lora_rank + rope_dim).
        kv_scale: an fp8 cache's dequantization scale (a value is code * kv_scale), in
            [1e-30, 1e30]; other caches take 1 only.
        out: [rows, num_heads, kv_lora_rank], float32, float16 or bfloat16, each row's heads
            contiguous, rows any stride apart; allocated like q_nope (dense) when None.
        lse: float32 [rows, num_heads], contiguous; written when given, allocated when None and
            ``return_lse``.
        return_lse: return (out, lse) instead of out.
        backend, stream, workspace, checked, batch_invariant: as for decode().
        q_indptr, max_q_len: multi-token queries, as for decode(): int32 [batch + 1] on
            q_nope's device; max_q_len None computes it from q_indptr (for a CUDA q_indptr a
            copy that waits for the stream: pass it under CUDA-graph capture).

    Returns:
        out, or (out, lse) when ``return_lse``.

    Raises:
        pagedattn.Error: naming the argument, before anything is written.
    """
    for name, x in (("q_nope", q_nope), ("q_pe", q_pe), ("block_table", block_table),
                    ("context_lens", context_lens)):
        _check_tensor(x, name)
    for name, x in (("out", out), ("lse", lse), ("workspace", workspace)):
        if x is not None:
            _check_tensor(x, name)
    backend = _check_backend(backend)
    tags: List[str] = []
    q_nope_in = _unwrap(q_nope, "q_nope", tags)
    q_pe_in = _unwrap(q_pe, "q_pe", tags)
    c_in, kpe_in, _ = _latent_cache(kv_cache, tags)
    out, lse, out_user, out_in, lse_in = _outputs(q_nope, out, lse, return_lse, q_nope_in.shape,
                                                  tags)
    ws_in = None if workspace is None else _unwrap(workspace, "workspace", [])
    q_indptr_in, max_len = _query_token_args(q_indptr, max_q_len)
    _ext.mla_decode(
        _ref(q_nope_in), _ref(q_pe_in), c_in, kpe_in,
        _ref(_unwrap(block_table, "block_table", [])),
        _ref(_unwrap(context_lens, "context_lens", [])),
        _ref(out_in), _ref(lse_in), None if scale is None else float(scale), _kv_scale(kv_scale),
        backend, _stream(stream, q_nope_in), _ref(ws_in), bool(checked), tags, q_indptr_in,
        max_len, bool(batch_invariant),
    )
    if return_lse:
        return out_user, lse
    return out_user


def mla_workspace_size(q_nope: Tensor, q_pe: Tensor,
                       kv_cache: Union[Tensor, Tuple[Tensor, Tensor]], block_table: Tensor, *,
                       backend: str = "auto", max_q_len: Optional[int] = None,
                       batch_invariant: bool = False) -> int:
    """Bytes of CUDA workspace mla_decode needs for these shapes on the tensors' device.

    Pass q_nope, q_pe, kv_cache and block_table as mla_decode gets them (an fp8 marking
    included). Like workspace_size() for decode, the size depends on the shapes (batch,
    num_heads, kv_lora_rank, rope_dim, block_size, the table's width) and the dtypes only, not
    on the context lengths, so one workspace serves every later step of the same shapes,
    CUDA-graph replays included; the cache is checked as mla_decode checks it, so a cache the
    CUDA kernel refuses (its dtype, its alignment) raises here too. 0 for CPU tensors.

    For multi-token queries (mla_decode's ``q_indptr``) pass the ``max_q_len`` the calls will
    pass: q_nope is then [num_q_tokens, num_heads, kv_lora_rank] and the batch is
    block_table.shape[0]. ``batch_invariant`` sizes it for mla_decode's batch-invariant mode.

    Raises:
        pagedattn.Error: naming the argument, as mla_decode would.
    """
    for name, x in (("q_nope", q_nope), ("q_pe", q_pe), ("block_table", block_table)):
        _check_tensor(x, name)
    backend = _check_backend(backend)
    tags: List[str] = []
    q_nope_in = _ref(_unwrap(q_nope, "q_nope", tags))
    q_pe_in = _ref(_unwrap(q_pe, "q_pe", tags))
    c_in, kpe_in, _ = _latent_cache(kv_cache, tags)
    max_len = None if max_q_len is None else _query_token_args(None, max_q_len)[1]
    return _ext.mla_workspace_size(
        q_nope_in, q_pe_in, c_in, kpe_in, _ref(_unwrap(block_table, "block_table", [])), backend,
        max_len, tags, bool(batch_invariant),
    )


def write_mla_cache(
    kv_c: Tensor,
    k_pe: Tensor,
    slot_mapping: Tensor,
    kv_cache: Union[Tensor, Tuple[Tensor, Tensor]],
    *,
    kv_scale: float = 1.0,
    backend: str = "auto",
    stream: Stream = None,
    checked: bool = False,
) -> None:
    """Writes new tokens' latent rows into the MLA cache that mla_decode reads: token i's kv_c
    and k_pe rows go to slot ``slot_mapping[i]`` (slot = block * block_size + offset; any
    negative slot skips the token), as vLLM's ``concat_and_cache_mla`` does. See docs/mla.md.

    Args:
        kv_c: [num_tokens, kv_lora_rank], float32, float16 or bfloat16: the compressed latent
            (c) of each new token.
        k_pe: [num_tokens, rope_dim], kv_c's dtype: its rotary part. Each token's row
            contiguous in both, rows any stride apart, each tensor its own: both may be slices
            of one [num_tokens, kv_lora_rank + rope_dim] projection output.
        slot_mapping: int32 [num_tokens], contiguous; slots of one call must be distinct.
        kv_cache: the latent cache as mla_decode takes it, written in place: one tensor
            [num_blocks, block_size, kv_lora_rank + rope_dim] (or [num_blocks, block_size, 1,
            kv_lora_rank + rope_dim]) holding c then k_pe in each row, or the pair
            ``(c_cache, kpe_cache)``; float32, float16, bfloat16 or fp8 (e4m3, e5m2), any
            positive block and slot strides with each row contiguous.
        kv_scale: an fp8 cache stores value / kv_scale (the quotient in float32), rounded to
            the nearest code with ties to even; finite values beyond the format's range
            saturate to its largest code (e4m3 +-448, e5m2 +-57344); NaN stays NaN, and Inf
            stays Inf in e5m2 and becomes NaN in e4m3. Pass the kv_scale the decodes will
            pass, in [1e-30, 1e30]. Other caches take 1 only and store each value rounded to
            nearest even.
        backend, stream: as for decode(); the cache's device decides.
        checked: CUDA: copy slot_mapping to the host and check every slot first, as the CPU
            backend always does (a synchronization; not under graph capture). Unchecked, the
            default, slots past the pool are skipped and repeated slots are not looked for;
            nothing is ever written outside the cache.

    Raises:
        pagedattn.Error: naming the argument (``slot_mapping[i]`` for a slot past the pool),
            before anything is written.
    """
    for name, x in (("kv_c", kv_c), ("k_pe", k_pe), ("slot_mapping", slot_mapping)):
        _check_tensor(x, name)
    backend = _check_backend(backend)
    tags: List[str] = []
    kv_c_in = _unwrap(kv_c, "kv_c", tags)
    k_pe_in = _unwrap(k_pe, "k_pe", tags)
    c_in, kpe_in, _ = _latent_cache(kv_cache, tags)
    _ext.write_mla_cache(
        _ref(kv_c_in), _ref(k_pe_in), _ref(_unwrap(slot_mapping, "slot_mapping", [])), c_in,
        kpe_in, _kv_scale(kv_scale), backend, _stream(stream, kv_c_in), bool(checked), tags,
    )


def copy_mla_blocks(
    kv_cache: Union[Tensor, Tuple[Tensor, Tensor]],
    pairs: Union[Sequence[Tuple[int, int]], Tensor],
    *,
    backend: str = "auto",
    stream: Stream = None,
) -> None:
    """Copies whole blocks src -> dst of the MLA latent cache (every slot, both parts): the copy
    half of copy-on-write, as BlockManager.append_token() asks for it.

    Args:
        kv_cache: the latent cache as mla_decode takes it (one tensor or the pair
            ``(c_cache, kpe_cache)``), written in place, of any of its dtypes. Only the blocks'
            rows are copied, bit for bit: padding between them is left as it is.
        pairs: (src, dst) block ids: a sequence of pairs or an int32/int64 CPU tensor [n, 2]
            (host memory for both backends). A dst may not appear twice nor be any pair's src.
        backend, stream: as for decode(); the cache's device decides.

    Raises:
        pagedattn.Error: naming the argument, before anything is copied.
    """
    backend = _check_backend(backend)
    tags: List[str] = []
    c_in, kpe_in, like = _latent_cache(kv_cache, tags)
    _ext.copy_mla_blocks(c_in, kpe_in, pairs, backend, _stream(stream, like), tags)
