#include "pagedattn/block_manager.hpp"

#include <algorithm>
#include <sstream>
#include <string>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn {

BlockManager::BlockManager(int num_blocks, int block_size) : block_size_(block_size) {
  if (num_blocks < 0) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks, "must not be negative");
  }
  if (block_size < 1 || block_size > kMaxBlockSize) {
    fail(ErrorCode::kUnsupported, "block_size", block_size,
         "unsupported (supported: 1 to " + std::to_string(kMaxBlockSize) + ")");
  }
  if (static_cast<std::int64_t>(num_blocks) * block_size > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks,
         "times block_size exceeds the int32 slot range");
  }
  ref_count_.assign(num_blocks, 0);
  filled_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  // A stack: the lowest ids are handed out first, and freed blocks are reused first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

const BlockManager::Sequence& BlockManager::get(SeqId id, const char* argument) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(ErrorCode::kInvalidArgument, argument, id, "no such sequence");
  return it->second;
}

void BlockManager::out_of_blocks(int needed, const char* what) const {
  std::ostringstream v;
  v << needed << " (" << num_free_blocks() << " of " << num_blocks() << " free)";
  fail(ErrorCode::kOutOfRange, "blocks needed", v.str(),
       std::string("out of cache blocks to ") + what + "; no sequence was changed");
}

std::int32_t BlockManager::take_free() {
  const std::int32_t b = free_.back();
  free_.pop_back();
  return b;
}

int BlockManager::blocks_for_prompt(int prompt_len) const {
  if (prompt_len < 0) {
    fail(ErrorCode::kInvalidArgument, "prompt_len", prompt_len, "must not be negative");
  }
  return blocks_for(prompt_len, block_size_);
}

int BlockManager::blocks_to_append(SeqId id) const {
  const Sequence& s = get(id, "seq");
  if (s.length % block_size_ == 0) return 1;  // the last block is full (or there is none)
  return ref_count_[s.blocks.back()] > 1 ? 1 : 0;
}

std::vector<std::int32_t> BlockManager::add_sequence(SeqId id, int prompt_len) {
  if (prompt_len < 0) {
    fail(ErrorCode::kInvalidArgument, "prompt_len", prompt_len, "must not be negative");
  }
  if (contains(id)) fail(ErrorCode::kInvalidArgument, "seq", id, "already exists");
  const int needed = blocks_for_prompt(prompt_len);
  if (needed > num_free_blocks()) out_of_blocks(needed, "add the sequence");
  // Build everything that may allocate first; the free list changes only once nothing can throw.
  Sequence s;
  s.length = prompt_len;
  s.blocks.reserve(needed + 1);
  for (int i = 0; i < needed; ++i) s.blocks.push_back(free_[free_.size() - 1 - i]);
  std::vector<std::int32_t> slots(prompt_len);
  for (int t = 0; t < prompt_len; ++t) {
    slots[t] = s.blocks[t / block_size_] * block_size_ + t % block_size_;
  }
  seqs_.emplace(id, std::move(s));
  for (int i = 0; i < needed; ++i) {
    const std::int32_t b = take_free();
    ref_count_[b] = 1;
    filled_[b] = valid_in_block(prompt_len, block_size_, i);
  }
  return slots;
}

BlockManager::Append BlockManager::append_token(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(ErrorCode::kInvalidArgument, "seq", id, "no such sequence");
  Sequence& s = it->second;
  const int offset = s.length % block_size_;
  Append result;
  if (offset == 0) {  // a fresh block
    if (num_free_blocks() == 0) out_of_blocks(1, "append a token");
    s.blocks.reserve(s.blocks.size() + 1);
    const std::int32_t b = take_free();
    s.blocks.push_back(b);
    ref_count_[b] = 1;
    filled_[b] = 1;
    result.slot = b * block_size_;
  } else if (ref_count_[s.blocks.back()] > 1) {  // shared partial block: copy on write
    if (num_free_blocks() == 0) out_of_blocks(1, "copy a shared block on write");
    const std::int32_t old = s.blocks.back();
    const std::int32_t b = take_free();
    --ref_count_[old];
    ref_count_[b] = 1;
    filled_[b] = offset + 1;
    s.blocks.back() = b;
    result.copy = BlockCopy{old, b};
    result.slot = b * block_size_ + offset;
  } else {  // our own partial block
    const std::int32_t b = s.blocks.back();
    filled_[b] = std::max(filled_[b], offset + 1);
    result.slot = b * block_size_ + offset;
  }
  ++s.length;
  return result;
}

void BlockManager::free_sequence(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(ErrorCode::kInvalidArgument, "seq", id, "no such sequence");
  // free_ has capacity num_blocks, so these push_backs never reallocate.
  for (const std::int32_t b : it->second.blocks) {
    if (--ref_count_[b] == 0) {
      filled_[b] = 0;
      free_.push_back(b);
    }
  }
  seqs_.erase(it);
}

void BlockManager::fork(SeqId parent, SeqId child) {
  const Sequence& p = get(parent, "parent");
  if (contains(child)) fail(ErrorCode::kInvalidArgument, "child", child, "already exists");
  Sequence copy = p;
  copy.blocks.reserve(copy.blocks.size() + 1);
  seqs_.emplace(child, std::move(copy));
  for (const std::int32_t b : seqs_.at(child).blocks) ++ref_count_[b];
}

int BlockManager::length(SeqId id) const { return get(id, "seq").length; }

const std::vector<std::int32_t>& BlockManager::blocks(SeqId id) const {
  return get(id, "seq").blocks;
}

std::vector<BlockManager::SeqId> BlockManager::sequences() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& kv : seqs_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int BlockManager::ref_count(std::int32_t block) const {
  if (block < 0 || block >= num_blocks()) {
    fail(ErrorCode::kOutOfRange, "block", block,
         "out of range [0, " + std::to_string(num_blocks()) + ")");
  }
  return ref_count_[block];
}

std::int32_t BlockManager::slot(SeqId id, int pos) const {
  const Sequence& s = get(id, "seq");
  if (pos < 0 || pos >= s.length) {
    fail(ErrorCode::kOutOfRange, "pos", pos,
         "out of range [0, " + std::to_string(s.length) + ") (the sequence's length)");
  }
  return s.blocks[pos / block_size_] * block_size_ + pos % block_size_;
}

BlockManager::Tables BlockManager::tables(const std::vector<SeqId>& seqs, int min_width) const {
  if (min_width < 0) {
    fail(ErrorCode::kInvalidArgument, "min_width", min_width, "must not be negative");
  }
  Tables t;
  t.max_blocks_per_seq = std::max(1, min_width);
  for (const SeqId id : seqs) {
    t.max_blocks_per_seq =
        std::max(t.max_blocks_per_seq, static_cast<int>(get(id, "seq").blocks.size()));
  }
  t.block_table.assign(seqs.size() * static_cast<std::size_t>(t.max_blocks_per_seq), -1);
  t.context_lens.resize(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs_.at(seqs[i]);
    std::copy(s.blocks.begin(), s.blocks.end(), t.block_table.begin() + i * t.max_blocks_per_seq);
    t.context_lens[i] = s.length;
  }
  return t;
}

std::int64_t BlockManager::stored_tokens() const {
  std::int64_t n = 0;
  for (int b = 0; b < num_blocks(); ++b) n += ref_count_[b] > 0 ? filled_[b] : 0;
  return n;
}

double BlockManager::fragmentation() const {
  const std::int64_t used = static_cast<std::int64_t>(num_used_blocks()) * block_size_;
  return used == 0 ? 0.0 : 1.0 - static_cast<double>(stored_tokens()) / used;
}

void BlockManager::check_invariants() const {
  const auto broken = [](const std::string& what, std::int64_t v, const std::string& why) {
    fail(ErrorCode::kInvalidArgument, what, v, "block manager invariant broken: " + why);
  };
  std::vector<int> refs(num_blocks(), 0);
  std::vector<int> filled(num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    if (static_cast<int>(s.blocks.size()) != blocks_for(s.length, block_size_)) {
      broken("seq", id,
             "holds " + std::to_string(s.blocks.size()) + " blocks for length " +
                 std::to_string(s.length));
    }
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const std::int32_t b = s.blocks[i];
      if (b < 0 || b >= num_blocks()) broken("block", b, "out of range");
      if (std::count(s.blocks.begin(), s.blocks.end(), b) != 1) {
        broken("block", b, "appears twice in one sequence");
      }
      ++refs[b];
      filled[b] = std::max(filled[b], valid_in_block(s.length, block_size_, static_cast<int>(i)));
    }
  }
  std::vector<char> is_free(num_blocks(), 0);
  for (const std::int32_t b : free_) {
    if (b < 0 || b >= num_blocks()) broken("free block", b, "out of range");
    if (is_free[b]) broken("free block", b, "listed twice");
    is_free[b] = 1;
  }
  for (int b = 0; b < num_blocks(); ++b) {
    if (refs[b] != ref_count_[b]) {
      broken("block", b,
             "ref count " + std::to_string(ref_count_[b]) + " but " + std::to_string(refs[b]) +
                 " references");
    }
    if ((refs[b] == 0) != (is_free[b] != 0)) {
      broken("block", b, refs[b] == 0 ? "unreferenced but not free" : "referenced but free");
    }
    if (refs[b] > 0 && filled[b] != filled_[b]) {
      broken(
          "block", b,
          "fill " + std::to_string(filled_[b]) + " but sequences use " + std::to_string(filled[b]));
    }
  }
}

}  // namespace pagedattn
