// MLA case files: to_mla_text writes every field of an MLA case, floats in hexadecimal so that
// they come back exactly; from_mla_text reads them back (a key left out keeps the default).
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mla_case.hpp"

namespace pagedattn::fuzz {
namespace {

std::string hex(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(x));
  return buf;
}

DType parse_dtype(const std::string& t) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2}) {
    if (t == dtype_name(d)) return d;
  }
  throw std::runtime_error("mla case file: unknown dtype '" + t + "'");
}

MlaMalformation parse_malformation(const std::string& t) {
  for (int i = 0; i < static_cast<int>(MlaMalformation::kCount); ++i) {
    const auto m = static_cast<MlaMalformation>(i);
    if (t == mla_malformation_name(m)) return m;
  }
  throw std::runtime_error("mla case file: unknown malformation '" + t + "'");
}

// The first key of a text's first line that is neither blank nor a comment.
std::string first_key(const std::string& text) {
  std::istringstream in(text);
  std::string line, key;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if ((ls >> key) && key[0] != '#') return key;
  }
  return "";
}

}  // namespace

std::string to_mla_text(const MlaFuzzCase& c) {
  std::ostringstream os;
  os << "# pagedattn-fuzz MLA case (replay: pagedattn-fuzz --replay FILE)\n"
     << "mla 1\n"
     << "origin " << c.origin_seed << ' ' << c.origin_index << '\n'
     << "num_heads " << c.num_heads << "\nkv_lora_rank " << c.kv_lora_rank << "\nrope_dim "
     << c.rope_dim << "\nblock_size " << c.block_size << "\ncontext_lens";
  for (int L : c.context_lens) os << ' ' << L;
  os << "\nq_lens";
  for (int n : c.q_lens) os << ' ' << n;
  os << "\nmax_q_len " << c.max_q_len << "\nq_dtype " << dtype_name(c.q_dtype) << "\nkv_dtype "
     << dtype_name(c.kv_dtype) << "\nout_dtype " << dtype_name(c.out_dtype) << "\nkv_scale "
     << hex(c.kv_scale) << "\nscale " << hex(c.scale) << "\nmagnitude " << hex(c.magnitude)
     << "\ncombined " << c.combined << "\nrow_pad " << c.row_pad << "\nblock_pad " << c.block_pad
     << "\nfused_q " << c.fused_q << "\nhead_pad " << c.head_pad << "\nq_row_pad " << c.q_row_pad
     << "\nout_row_pad " << c.out_row_pad << "\ntable_pad " << c.table_pad << "\nspare_blocks "
     << c.spare_blocks << "\nlse " << c.lse << "\nthreads " << c.threads << "\ndata_seed "
     << c.data_seed << "\nmalformation " << mla_malformation_name(c.bad) << ' ' << c.bad_param
     << '\n';
  return os.str();
}

bool is_mla_text(const std::string& text) { return first_key(text) == "mla"; }

namespace {

// Reads one line's values into a field; throws std::runtime_error("") when they do not parse.
using Reader = std::function<void(std::istringstream&)>;

Reader ints(std::vector<int>& v) {
  return [&v](std::istringstream& ls) {
    v.clear();
    for (int x; ls >> x;) v.push_back(x);
    if (!ls.eof()) throw std::runtime_error("");
  };
}

template <typename T>
Reader one(T& v) {
  return [&v](std::istringstream& ls) {
    if (!(ls >> v)) throw std::runtime_error("");
  };
}

// A float as to_mla_text writes it (hexadecimal), or any form strtof takes.
Reader real(float& v) {
  return [&v](std::istringstream& ls) {
    std::string w;
    char* end = nullptr;
    if (!(ls >> w) || (v = std::strtof(w.c_str(), &end), end != w.c_str() + w.size())) {
      throw std::runtime_error("");
    }
  };
}

Reader flag(bool& v) {
  return [&v](std::istringstream& ls) {
    int i = 0;
    if (!(ls >> i)) throw std::runtime_error("");
    v = i != 0;
  };
}

Reader dtype(DType& v) {
  return [&v](std::istringstream& ls) {
    std::string w;
    if (!(ls >> w)) throw std::runtime_error("");
    v = parse_dtype(w);
  };
}

// Each key of an MLA case file and the field it reads into.
std::map<std::string, Reader> readers(MlaFuzzCase& c, int& mla) {
  return {
      {"mla", one(mla)},
      {"origin",
       [&c](std::istringstream& ls) {
         if (!(ls >> c.origin_seed >> c.origin_index)) throw std::runtime_error("");
       }},
      {"num_heads", one(c.num_heads)},
      {"kv_lora_rank", one(c.kv_lora_rank)},
      {"rope_dim", one(c.rope_dim)},
      {"block_size", one(c.block_size)},
      {"context_lens", ints(c.context_lens)},
      {"q_lens", ints(c.q_lens)},
      {"max_q_len", one(c.max_q_len)},
      {"q_dtype", dtype(c.q_dtype)},
      {"kv_dtype", dtype(c.kv_dtype)},
      {"out_dtype", dtype(c.out_dtype)},
      {"kv_scale", real(c.kv_scale)},
      {"scale", real(c.scale)},
      {"magnitude", real(c.magnitude)},
      {"combined", flag(c.combined)},
      {"row_pad", one(c.row_pad)},
      {"block_pad", one(c.block_pad)},
      {"fused_q", flag(c.fused_q)},
      {"head_pad", one(c.head_pad)},
      {"q_row_pad", one(c.q_row_pad)},
      {"out_row_pad", one(c.out_row_pad)},
      {"table_pad", one(c.table_pad)},
      {"spare_blocks", one(c.spare_blocks)},
      {"lse", flag(c.lse)},
      {"threads", one(c.threads)},
      {"data_seed", one(c.data_seed)},
      {"malformation",
       [&c](std::istringstream& ls) {
         std::string name;
         if (!(ls >> name >> c.bad_param)) throw std::runtime_error("");
         c.bad = parse_malformation(name);
       }},
  };
}

}  // namespace

MlaFuzzCase from_mla_text(const std::string& text) {
  MlaFuzzCase c;
  int mla = 0;
  const std::map<std::string, Reader> keys = readers(c, mla);
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key) || key[0] == '#') continue;
    const auto it = keys.find(key);
    const std::string where = "mla case file line " + std::to_string(line_no) + ": ";
    if (it == keys.end()) throw std::runtime_error(where + "unknown key '" + key + "'");
    try {
      it->second(ls);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(where + (*e.what() ? e.what() : "cannot parse '" + line + "'"));
    }
  }
  if (!c.q_lens.empty() && c.q_lens.size() != c.context_lens.size()) {
    throw std::runtime_error("mla case file: q_lens has " + std::to_string(c.q_lens.size()) +
                             " entries for " + std::to_string(c.context_lens.size()) +
                             " sequences");
  }
  return c;
}

void save_mla_case(const MlaFuzzCase& c, const std::string& path) {
  std::ofstream f(path);
  if (!(f << to_mla_text(c))) throw std::runtime_error("cannot write " + path);
}

}  // namespace pagedattn::fuzz
