// The host-side block manager: which cache blocks each sequence owns, with reference counts so a
// forked sequence shares its parent's blocks, and copy-on-write of a shared partial last block.
// It produces the block tables, context lengths and slot mappings that decode() and
// write_cache() take. See docs/cache.md.
//
// Every operation either completes or throws pagedattn::Error leaving the manager exactly as it
// was (strong guarantee); running out of blocks is such an error.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "pagedattn/cache_ops.hpp"

namespace pagedattn {

class BlockManager {
 public:
  using SeqId = std::int64_t;

  // The result of appending one token: the slot to write it to, and the block copy to perform
  // first when the token's block was shared (copy-on-write).
  struct Append {
    std::int32_t slot = -1;
    std::optional<BlockCopy> copy;
  };

  // Tables for one decode step over `seqs`, in that order.
  struct Tables {
    int max_blocks_per_seq = 0;             // row width (the widest sequence, at least 1)
    std::vector<std::int32_t> block_table;  // [seqs][max_blocks_per_seq], -1 padded
    std::vector<std::int32_t> context_lens;
  };

  BlockManager(int num_blocks, int block_size);

  int num_blocks() const { return static_cast<int>(ref_count_.size()); }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }
  int num_used_blocks() const { return num_blocks() - num_free_blocks(); }
  int num_sequences() const { return static_cast<int>(seqs_.size()); }

  // Adds sequence `id` with a prompt of `prompt_len` tokens (>= 0) and returns the prompt's slot
  // mapping (prompt_len entries, token order). The id must be new.
  std::vector<std::int32_t> add_sequence(SeqId id, int prompt_len);
  // Appends one token to `id`: allocates a block when the last one is full, copies the last
  // block when it is shared with another sequence and partly filled.
  Append append_token(SeqId id);
  // Releases `id`'s references; blocks nobody references go back to the free list.
  void free_sequence(SeqId id);
  // `child` (a new id) becomes a copy of `parent` sharing every block. Allocates nothing.
  void fork(SeqId parent, SeqId child);

  // Blocks add_sequence(_, prompt_len) and append_token(id) would allocate now (0 or 1). A
  // negative prompt_len is an Error, as for add_sequence.
  int blocks_for_prompt(int prompt_len) const;
  int blocks_to_append(SeqId id) const;

  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  int length(SeqId id) const;
  const std::vector<std::int32_t>& blocks(SeqId id) const;
  std::vector<SeqId> sequences() const;  // ascending ids
  int ref_count(std::int32_t block) const;
  // Slot of token `pos` (< length(id)) of sequence `id`.
  std::int32_t slot(SeqId id, int pos) const;

  // Block tables and context lengths for `seqs`; min_width (>= 0) widens the rows.
  Tables tables(const std::vector<SeqId>& seqs, int min_width = 0) const;

  // Token slots in used blocks that hold no token of any sequence (the tail of partial blocks)
  // over all slots of used blocks: internal fragmentation, 0 when no block is used.
  double fragmentation() const;
  // Tokens stored (shared tokens counted once).
  std::int64_t stored_tokens() const;

  // Recomputes every reference count and the free list from the sequences; throws Error on any
  // disagreement (a block owned twice without a count, a free block in use, ...). For tests.
  void check_invariants() const;

 private:
  struct Sequence {
    std::vector<std::int32_t> blocks;
    int length = 0;
  };
  const Sequence& get(SeqId id, const char* argument) const;
  [[noreturn]] void out_of_blocks(int needed, const char* what) const;
  std::int32_t take_free();  // the caller has checked that one is free

  int block_size_;
  std::vector<int> ref_count_;  // per block
  std::vector<int> filled_;     // per block: tokens stored (the longest owner's use of it)
  std::vector<std::int32_t> free_;
  std::unordered_map<SeqId, Sequence> seqs_;
};

}  // namespace pagedattn
