#include "case_file.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "malformation.hpp"

namespace pagedattn::fuzz {

std::string to_text(const FuzzCase& c) {
  const testing::CaseSpec& s = c.spec;
  std::ostringstream os;
  os.precision(9);
  os << "# pagedattn-fuzz case (replay: pagedattn-fuzz --replay FILE)\n"
     << "origin " << c.origin_seed << ' ' << c.origin_index << '\n'
     << "batch " << s.batch << '\n'
     << "num_heads " << s.num_heads << '\n'
     << "num_kv_heads " << s.num_kv_heads << '\n'
     << "head_dim " << s.head_dim << '\n'
     << "block_size " << s.block_size << '\n'
     << "context_lens";
  for (int i = 0; i < s.batch && i < static_cast<int>(s.context_lens.size()); ++i) {
    os << ' ' << s.context_lens[i];
  }
  os << '\n'
     << "q_dtype " << dtype_name(s.q_dtype) << '\n'
     << "kv_dtype " << dtype_name(s.kv_dtype) << '\n'
     << "out_dtype " << dtype_name(s.out_dtype) << '\n'
     << "q_row_stride " << c.q_row_stride << '\n'
     << "out_row_stride " << c.out_row_stride << '\n'
     << "kv_layout " << testing::kv_layout_name(c.kv_layout) << '\n'
     << "kv_pad " << c.kv_pad << '\n'
     << "k_scale " << s.k_scale << '\n'
     << "v_scale " << s.v_scale << '\n';
  // A line of values (one per kv head or query head, or none: the line may be left out).
  const auto list = [&os](const char* key, const std::vector<float>& values) {
    os << key;
    for (float x : values) os << ' ' << x;
    os << '\n';
  };
  list("k_scales", c.k_scales);  // quantized caches, per kv head
  list("v_scales", c.v_scales);
  // Per-token scales: the flag, their layout and its pad (the scales come with the data seed).
  os << "token_scales " << s.token_scales << ' ' << token_scale_layout_name(c.token_scale_layout)
     << ' ' << c.token_scale_pad << '\n';
  os << "max_q_len " << c.max_q_len << '\n' << "q_lens";
  for (int n : c.q_lens) os << ' ' << n;
  // The tree masks: the flag and the packing seed, then each sequence's bits ('-' for none).
  os << '\n' << "tree_mask " << c.tree << ' ' << c.tree_pack_seed << '\n' << "tree_masks";
  for (const std::string& mask : c.tree_masks) os << ' ' << (mask.empty() ? "-" : mask);
  os << '\n'
     << "spare_blocks " << s.spare_blocks << '\n'
     << "table_padding " << s.table_padding << '\n'
     << "table_stride_extra " << s.table_stride_extra << '\n'
     << "fragmented " << s.fragmented << '\n'
     << "share_prefix " << s.share_prefix << '\n'
     << "fork_members " << s.fork_members << '\n'
     << "fork_prefix";
  for (int n : s.fork_prefix) os << ' ' << n;
  os << '\n'
     << "poison " << s.poison << '\n'
     << "magnitude " << s.magnitude << '\n'
     << "data_seed " << s.seed << '\n'
     << "snap " << c.snap << '\n'
     << "scale " << c.scale << '\n'
     << "threads " << c.threads << '\n'
     << "window_left " << c.window_left << '\n'
     << "logits_soft_cap " << c.soft_cap << '\n';
  list("alibi_slopes", c.alibi_slopes);  // per query head
  list("sinks", c.sinks);
  os << "malformation " << malformation_name(c.bad) << ' ' << c.bad_param << '\n';
  return os.str();
}

namespace {

// `cache`: the K/V dtype, which may be quantized (fp8 or int8) too.
DType parse_dtype(const std::string& t, bool cache) {
  for (DType d : kPlainDTypes) {
    if (t == dtype_name(d)) return d;
  }
  for (DType d : kQuantizedDTypes) {
    if (t != dtype_name(d)) continue;
    if (cache) return d;
    throw std::runtime_error("case file: dtype '" + t + "' is for kv_dtype only (" + t +
                             " stores K and V caches only)");
  }
  throw std::runtime_error("case file: unknown dtype '" + t + "'");
}

// A float as to_text writes it, "inf", "-inf" and "nan" included (operator>> takes none of them).
bool parse_float(const std::string& t, float& v) {
  char* end = nullptr;
  v = std::strtof(t.c_str(), &end);
  return !t.empty() && end == t.c_str() + t.size();
}

// One line of a case file being read: its key first, then its values; bad() names the line.
class LineReader {
 public:
  LineReader(const std::string& line, int line_no) : ls_(line), line_(line), line_no_(line_no) {
    ls_ >> key_;
  }
  const std::string& key() const { return key_; }
  std::istringstream& values() { return ls_; }

  [[noreturn]] void bad() const {
    throw std::runtime_error("case file line " + std::to_string(line_no_) + ": cannot parse '" +
                             line_ + "'");
  }
  template <class T>
  void read(T& v) {
    if (!(ls_ >> v)) bad();
  }
  void read_bool(bool& v) {
    int i;
    read(i);
    v = i != 0;
  }
  std::string word() {
    std::string w;
    read(w);
    return w;
  }
  void read_float(float& v) {
    if (!parse_float(word(), v)) bad();
  }
  // The rest of the line: floats as to_text writes them, or none.
  void read_floats(std::vector<float>& values) {
    values.clear();
    std::string w;
    float x;
    while (ls_ >> w) {
      if (!parse_float(w, x)) bad();
      values.push_back(x);
    }
  }

 private:
  std::istringstream ls_;
  std::string line_, key_;
  int line_no_;
};

// The names kv_layout, token_scales and malformation lines hold.
testing::KvLayout parse_layout(LineReader& in) {
  const std::string w = in.word();
  for (testing::KvLayout l : testing::kAllKvLayouts) {
    if (w == testing::kv_layout_name(l)) return l;
  }
  in.bad();
}
TokenScaleLayout parse_token_scale_layout(LineReader& in) {
  const std::string w = in.word();
  for (TokenScaleLayout l : kAllTokenScaleLayouts) {
    if (w == token_scale_layout_name(l)) return l;
  }
  in.bad();
}
Malformation parse_malformation(const std::string& w, LineReader& in) {
  for (int i = 0; i < static_cast<int>(Malformation::kCount); ++i) {
    if (w == malformation_name(static_cast<Malformation>(i))) return static_cast<Malformation>(i);
  }
  in.bad();
}

// The shapes, dtypes, strides, layout, scales, query tokens (and tree masks) and table of the
// spec; false for any other key.
bool read_shape_key(LineReader& in, FuzzCase& c) {
  testing::CaseSpec& s = c.spec;
  const std::string& key = in.key();
  if (key == "origin") {
    in.read(c.origin_seed);
    in.read(c.origin_index);
  } else if (key == "batch") {
    in.read(s.batch);
  } else if (key == "num_heads") {
    in.read(s.num_heads);
  } else if (key == "num_kv_heads") {
    in.read(s.num_kv_heads);
  } else if (key == "head_dim") {
    in.read(s.head_dim);
  } else if (key == "block_size") {
    in.read(s.block_size);
  } else if (key == "context_lens") {
    int L;
    while (in.values() >> L) s.context_lens.push_back(L);
  } else if (key == "q_dtype" || key == "kv_dtype" || key == "out_dtype") {
    const std::string w = in.word();
    (key == "q_dtype"    ? s.q_dtype
     : key == "kv_dtype" ? s.kv_dtype
                         : s.out_dtype) = parse_dtype(w, key == "kv_dtype");
  } else if (key == "q_row_stride" || key == "out_row_stride") {
    in.read(key == "q_row_stride" ? c.q_row_stride : c.out_row_stride);
  } else if (key == "kv_layout") {
    c.kv_layout = parse_layout(in);
  } else if (key == "kv_pad") {
    in.read(c.kv_pad);
  } else if (key == "k_scale" || key == "v_scale") {
    in.read_float(key == "k_scale" ? s.k_scale : s.v_scale);
  } else if (key == "k_scales" || key == "v_scales") {
    in.read_floats(key == "k_scales" ? c.k_scales : c.v_scales);
  } else if (key == "token_scales") {
    in.read_bool(s.token_scales);
    c.token_scale_layout = parse_token_scale_layout(in);
    in.read(c.token_scale_pad);
  } else if (key == "max_q_len") {
    in.read(c.max_q_len);
  } else if (key == "q_lens") {
    c.q_lens.clear();
    int n;
    while (in.values() >> n) c.q_lens.push_back(n);
    if (!in.values().eof()) in.bad();
  } else if (key == "tree_mask") {
    in.read_bool(c.tree);
    in.read(c.tree_pack_seed);
  } else if (key == "tree_masks") {
    c.tree_masks.clear();
    std::string mask;
    while (in.values() >> mask) c.tree_masks.push_back(mask == "-" ? "" : mask);
  } else if (key == "spare_blocks") {
    in.read(s.spare_blocks);
  } else if (key == "table_padding") {
    in.read(s.table_padding);
  } else if (key == "table_stride_extra") {
    in.read(s.table_stride_extra);
  } else if (key == "fragmented") {
    in.read_bool(s.fragmented);
  } else if (key == "share_prefix") {
    in.read_bool(s.share_prefix);
  } else if (key == "fork_members") {
    in.read(s.fork_members);
  } else if (key == "fork_prefix") {
    int n;
    while (in.values() >> n) s.fork_prefix.push_back(n);
  } else {
    return false;
  }
  return true;
}

// The values, the variants and the malformation; any other key is an error.
void read_value_key(LineReader& in, FuzzCase& c) {
  testing::CaseSpec& s = c.spec;
  const std::string& key = in.key();
  if (key == "poison") {
    in.read_bool(s.poison);
  } else if (key == "magnitude") {
    in.read(s.magnitude);
  } else if (key == "data_seed") {
    in.read(s.seed);
  } else if (key == "snap") {
    in.read_bool(c.snap);
  } else if (key == "scale") {
    in.read(c.scale);
  } else if (key == "threads") {
    in.read(c.threads);
  } else if (key == "window_left") {
    in.read(c.window_left);
  } else if (key == "logits_soft_cap") {
    in.read_float(c.soft_cap);
  } else if (key == "alibi_slopes" || key == "sinks") {
    in.read_floats(key == "sinks" ? c.sinks : c.alibi_slopes);
  } else if (key == "malformation") {
    const std::string w = in.word();
    in.read(c.bad_param);
    c.bad = parse_malformation(w, in);
  } else {
    in.bad();
  }
}

// The lists against the counts they follow.
void check_lists(const FuzzCase& c) {
  const testing::CaseSpec& s = c.spec;
  if (s.batch < 0 || static_cast<int>(s.context_lens.size()) != s.batch) {
    throw std::runtime_error("case file: context_lens must list batch values");
  }
  if (c.max_q_len < 0 || (c.max_q_len > 0 && static_cast<int>(c.q_lens.size()) != s.batch) ||
      (c.max_q_len == 0 && !c.q_lens.empty())) {
    throw std::runtime_error(
        "case file: q_lens must list batch values with a max_q_len of 1 or more, or none with "
        "max_q_len 0 (one query token per sequence)");
  }
  // Files written before tree masks have neither line: no tree mask.
  bool masks_fit =
      c.tree_masks.size() == (c.tree ? c.q_lens.size() : 0) && (!c.tree || c.max_q_len > 0);
  for (std::size_t b = 0; b < c.tree_masks.size() && masks_fit; ++b) {
    const std::string& mask = c.tree_masks[b];
    masks_fit = b < c.q_lens.size() &&
                mask.size() == static_cast<std::size_t>(c.q_lens[b]) * std::max(c.q_lens[b], 0) &&
                mask.find_first_not_of("01") == std::string::npos;
  }
  if (!masks_fit) {
    throw std::runtime_error(
        "case file: tree_mask 1 needs q_lens and a tree_masks line of one mask per sequence, "
        "q_lens[b]^2 characters of 0 and 1 ('-' for none); tree_mask 0 none");
  }
  for (const auto& [key, values] :
       {std::pair{"alibi_slopes", &c.alibi_slopes}, std::pair{"sinks", &c.sinks}}) {
    if (!values->empty() && static_cast<int>(values->size()) != s.num_heads) {
      throw std::runtime_error(std::string("case file: ") + key +
                               " must list num_heads values, or none");
    }
  }
  for (const auto& [key, values] :
       {std::pair{"k_scales", &c.k_scales}, std::pair{"v_scales", &c.v_scales}}) {
    if (!values->empty() && static_cast<int>(values->size()) != s.num_kv_heads) {
      throw std::runtime_error(std::string("case file: ") + key +
                               " must list num_kv_heads values, or none");
    }
  }
}

}  // namespace

FuzzCase from_text(const std::string& text) {
  FuzzCase c;
  c.spec.context_lens.clear();
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    LineReader reader(line, line_no);
    if (!read_shape_key(reader, c)) read_value_key(reader, c);
  }
  check_lists(c);
  return c;
}

void save_case(const FuzzCase& c, const std::string& path) {
  std::ofstream f(path);
  f << to_text(c);
  if (!f) throw std::runtime_error("cannot write " + path);
}

FuzzCase load_case(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_text(ss.str());
}

}  // namespace pagedattn::fuzz
