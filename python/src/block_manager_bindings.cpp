#include "block_manager_bindings.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "pagedattn/block_manager.hpp"

namespace pagedattn::py {
namespace {

namespace nb = nanobind;
using namespace nb::literals;

using Int32Array = nb::ndarray<nb::numpy, std::int32_t>;

// A NumPy array [rows] (ndim 1) or [rows, cols] (ndim 2) that owns v's memory.
Int32Array to_numpy(std::vector<std::int32_t>&& v, std::size_t rows, std::size_t cols, int ndim) {
  if (v.empty()) v.reserve(1);  // a valid pointer even for an empty array
  auto* heap = new std::vector<std::int32_t>(std::move(v));
  nb::capsule owner(heap,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int32_t>*>(p); });
  if (ndim == 1) return Int32Array(heap->data(), {rows}, owner);
  return Int32Array(heap->data(), {rows, cols}, owner);
}

using AppendResult = std::pair<std::int32_t, std::optional<std::pair<std::int32_t, std::int32_t>>>;

// append_token's (slot, copy) as Python gets it: copy is None or (src, dst).
AppendResult append_result(const pagedattn::BlockManager::Append& a) {
  AppendResult r{a.slot, std::nullopt};
  if (a.copy) r.second = std::make_pair(a.copy->src, a.copy->dst);
  return r;
}

}  // namespace

void bind_block_manager(nb::module_& m) {
  using BM = pagedattn::BlockManager;
  nb::class_<BM>(m, "BlockManager",
                 "Host-side block allocation for a paged cache of `num_blocks` blocks of\n"
                 "`block_size` tokens: which blocks each sequence owns, reference counts so a\n"
                 "forked sequence shares its parent's blocks, and copy-on-write of a shared,\n"
                 "partly filled last block. Every method either completes or raises\n"
                 "pagedattn.Error leaving the manager unchanged (running out of blocks too).")
      .def(nb::init<int, int>(), "num_blocks"_a, "block_size"_a)
      .def_prop_ro("num_blocks", &BM::num_blocks, "Blocks in the pool.")
      .def_prop_ro("block_size", &BM::block_size, "Tokens per block.")
      .def_prop_ro("num_free_blocks", &BM::num_free_blocks, "Blocks no sequence references.")
      .def_prop_ro("num_used_blocks", &BM::num_used_blocks, "Blocks some sequence references.")
      .def_prop_ro("num_sequences", &BM::num_sequences, "Sequences held.")
      .def(
          "add_sequence",
          [](BM& bm, BM::SeqId id, int prompt_len) {
            std::vector<std::int32_t> slots = bm.add_sequence(id, prompt_len);
            const std::size_t n = slots.size();
            return to_numpy(std::move(slots), n, 0, 1);
          },
          "seq_id"_a, "prompt_len"_a,
          "Adds sequence `seq_id` (a new id) with a prompt of `prompt_len` tokens and returns\n"
          "the prompt's slot mapping: an int32 NumPy array of `prompt_len` slots in token\n"
          "order, for write_cache().")
      .def(
          "append_token", [](BM& bm, BM::SeqId id) { return append_result(bm.append_token(id)); },
          "seq_id"_a,
          "Appends one token to `seq_id`. Returns (slot, copy): the slot to write the token\n"
          "to, and None or a (src, dst) block copy to perform first with copy_blocks() when\n"
          "the last block was shared (copy-on-write).")
      .def("free_sequence", &BM::free_sequence, "seq_id"_a,
           "Releases `seq_id`'s blocks; blocks nobody references become free.")
      .def("fork", &BM::fork, "parent"_a, "child"_a,
           "Makes `child` (a new id) share every block of `parent`. Allocates nothing.")
      .def("blocks_for_prompt", &BM::blocks_for_prompt, "prompt_len"_a,
           "Blocks add_sequence(_, prompt_len) would allocate now.")
      .def("blocks_to_append", &BM::blocks_to_append, "seq_id"_a,
           "Blocks append_token(seq_id) would allocate now (0 or 1).")
      .def("__contains__", &BM::contains, "seq_id"_a)
      .def("__len__", &BM::num_sequences)
      .def("length", &BM::length, "seq_id"_a, "Tokens in `seq_id`.")
      .def(
          "blocks", [](const BM& bm, BM::SeqId id) { return bm.blocks(id); }, "seq_id"_a,
          "The block ids of `seq_id`, in token order.")
      .def("sequences", &BM::sequences, "The sequence ids held, ascending.")
      .def("ref_count", &BM::ref_count, "block"_a, "How many sequences reference `block`.")
      .def("slot", &BM::slot, "seq_id"_a, "pos"_a, "The slot of token `pos` of `seq_id`.")
      .def(
          "tables",
          [](const BM& bm, const std::vector<BM::SeqId>& seqs, int min_width) {
            BM::Tables t = bm.tables(seqs, min_width);
            const std::size_t n = t.context_lens.size();
            const std::size_t w = static_cast<std::size_t>(t.max_blocks_per_seq);
            return std::make_pair(to_numpy(std::move(t.block_table), n, w, 2),
                                  to_numpy(std::move(t.context_lens), n, 0, 1));
          },
          "seq_ids"_a, "min_width"_a = 0,
          "Decode tables for `seq_ids`, in that order: (block_table, context_lens), int32\n"
          "NumPy arrays of shapes [n, width] (-1 padded; width is the widest sequence's\n"
          "block count, at least 1 and at least `min_width`) and [n].")
      .def("fragmentation", &BM::fragmentation,
           "Unfilled token slots in used blocks over all slots of used blocks (0 when none).")
      .def("stored_tokens", &BM::stored_tokens, "Tokens stored, shared tokens counted once.")
      .def("check_invariants", &BM::check_invariants,
           "Recomputes the reference counts and the free list; raises pagedattn.Error on any\n"
           "disagreement.");
}

}  // namespace pagedattn::py
