"""pagedattn's compiled core (nanobind). Use the functions of the pagedattn package: they
allocate missing outputs, pick the default stream and unwrap bf16 and fp8 markings, then call
these. ``tags`` names the marked tensors: ``"name"`` (or ``"name:bf16"``) for bf16 bits in a
16-bit integer tensor, ``"name:fp8_e4m3"`` or ``"name:fp8_e5m2"`` for fp8 codes in an 8-bit one."""

from typing import Any, List, Optional, Sequence, Tuple

import numpy
import numpy.typing

SUPPORTED_HEAD_DIMS: Tuple[int, ...]
CUDA_HEAD_DIMS: Tuple[int, ...]
MAX_BLOCK_SIZE: int
MAX_GROUP_SIZE: int
MAX_MLA_HEADS: int
built_with_cuda: bool

def cuda_available() -> Tuple[bool, str]: ...
def decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    context_lens: Any,
    out: Any,
    lse: Optional[Any],
    scale: Optional[float],
    backend: str,
    stream: int,
    workspace: Optional[Any],
    checked: bool,
    tags: Sequence[str],
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
    alibi_slopes: Optional[Any] = None,
    sinks: Optional[Any] = None,
    q_indptr: Optional[Any] = None,
    max_q_len: Optional[int] = None,
    tree_mask: Optional[Any] = None,
    tree_mask_indptr: Optional[Any] = None,
    kv_layout: str = "HND",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    k_scales: Optional[Any] = None,
    v_scales: Optional[Any] = None,
    batch_invariant: bool = False,
    k_token_scales: Optional[Any] = None,
    v_token_scales: Optional[Any] = None,
    share_prefixes: bool = True,
) -> None: ...
def mla_decode(
    q_nope: Any,
    q_pe: Any,
    c_cache: Any,
    kpe_cache: Optional[Any],
    block_table: Any,
    context_lens: Any,
    out: Any,
    lse: Optional[Any],
    scale: Optional[float],
    kv_scale: float,
    backend: str,
    stream: int,
    workspace: Optional[Any],
    checked: bool,
    tags: Sequence[str],
    q_indptr: Optional[Any] = None,
    max_q_len: Optional[int] = None,
    batch_invariant: bool = False,
) -> None:
    """kpe_cache None: c_cache is the combined [num_blocks, block_size, kv_lora_rank + rope_dim]
    latent cache, split here into its two parts."""

def mla_workspace_size(
    q_nope: Any,
    q_pe: Any,
    c_cache: Any,
    kpe_cache: Optional[Any],
    block_table: Any,
    backend: str,
    max_q_len: Optional[int] = None,
    tags: Sequence[str] = ...,
    batch_invariant: bool = False,
) -> int: ...
def workspace_size(
    q: Any,
    k_cache: Any,
    block_table: Any,
    backend: str,
    max_q_len: Optional[int] = None,
    kv_layout: str = "HND",
    tags: Sequence[str] = ...,
    batch_invariant: bool = False,
) -> int: ...
def write_cache(
    key: Any,
    value: Any,
    slot_mapping: Any,
    k_cache: Any,
    v_cache: Any,
    backend: str,
    stream: int,
    checked: bool,
    tags: Sequence[str],
    kv_layout: str = "HND",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    k_scales: Optional[Any] = None,
    v_scales: Optional[Any] = None,
    k_token_scales: Optional[Any] = None,
    v_token_scales: Optional[Any] = None,
) -> None: ...
def merge_states(
    parts: Any,
    part_lse: Any,
    out: Any,
    lse: Optional[Any],
    backend: str,
    stream: int,
    tags: Sequence[str],
) -> None: ...
def copy_blocks(
    k_cache: Any,
    v_cache: Any,
    pairs: Any,
    backend: str,
    stream: int,
    tags: Sequence[str],
    kv_layout: str = "HND",
    k_token_scales: Optional[Any] = None,
    v_token_scales: Optional[Any] = None,
) -> None: ...

def write_mla_cache(
    kv_c: Any,
    k_pe: Any,
    slot_mapping: Any,
    c_cache: Any,
    kpe_cache: Optional[Any],
    kv_scale: float,
    backend: str,
    stream: int,
    checked: bool,
    tags: Sequence[str],
) -> None:
    """kpe_cache None: c_cache is the combined latent cache, as for mla_decode."""

def copy_mla_blocks(
    c_cache: Any,
    kpe_cache: Optional[Any],
    pairs: Any,
    backend: str,
    stream: int,
    tags: Sequence[str],
) -> None:
    """kpe_cache None: c_cache is the combined latent cache, as for mla_decode."""

class BlockManager:
    """Host-side block allocation for a paged cache of `num_blocks` blocks of `block_size`
    tokens: which blocks each sequence owns, reference counts so a forked sequence shares its
    parent's blocks, and copy-on-write of a shared, partly filled last block. Every method
    either completes or raises pagedattn.Error leaving the manager unchanged (running out of
    blocks too)."""

    def __init__(self, num_blocks: int, block_size: int) -> None: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references."""
    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence references."""
    @property
    def num_sequences(self) -> int:
        """Sequences held."""
    def add_sequence(self, seq_id: int, prompt_len: int) -> numpy.typing.NDArray[numpy.int32]:
        """Adds sequence `seq_id` (a new id) with a prompt of `prompt_len` tokens and returns
        the prompt's slot mapping: an int32 NumPy array of `prompt_len` slots in token order,
        for write_cache()."""
    def append_token(self, seq_id: int) -> Tuple[int, Optional[Tuple[int, int]]]:
        """Appends one token to `seq_id`. Returns (slot, copy): the slot to write the token to,
        and None or a (src, dst) block copy to perform first with copy_blocks() when the last
        block was shared (copy-on-write)."""
    def free_sequence(self, seq_id: int) -> None:
        """Releases `seq_id`'s blocks; blocks nobody references become free."""
    def fork(self, parent: int, child: int) -> None:
        """Makes `child` (a new id) share every block of `parent`. Allocates nothing."""
    def blocks_for_prompt(self, prompt_len: int) -> int:
        """Blocks add_sequence(_, prompt_len) would allocate now."""
    def blocks_to_append(self, seq_id: int) -> int:
        """Blocks append_token(seq_id) would allocate now (0 or 1)."""
    def __contains__(self, seq_id: int) -> bool: ...
    def __len__(self) -> int: ...
    def length(self, seq_id: int) -> int:
        """Tokens in `seq_id`."""
    def blocks(self, seq_id: int) -> List[int]:
        """The block ids of `seq_id`, in token order."""
    def sequences(self) -> List[int]:
        """The sequence ids held, ascending."""
    def ref_count(self, block: int) -> int:
        """How many sequences reference `block`."""
    def slot(self, seq_id: int, pos: int) -> int:
        """The slot of token `pos` of `seq_id`."""
    def tables(
        self, seq_ids: Sequence[int], min_width: int = 0
    ) -> Tuple[numpy.typing.NDArray[numpy.int32], numpy.typing.NDArray[numpy.int32]]:
        """Decode tables for `seq_ids`, in that order: (block_table, context_lens), int32 NumPy
        arrays of shapes [n, width] (-1 padded; width is the widest sequence's block count, at
        least 1 and at least `min_width`) and [n]."""
    def fragmentation(self) -> float:
        """Unfilled token slots in used blocks over all slots of used blocks (0 when none)."""
    def stored_tokens(self) -> int:
        """Tokens stored, shared tokens counted once."""
    def check_invariants(self) -> None:
        """Recomputes the reference counts and the free list; raises pagedattn.Error on any
        disagreement."""
