// One sequence of two tokens, one head: checks that the library, installed (tests/consumer) or
// added with add_subdirectory (tests/subproject), computes softmax attention. An oracle: the
// expected out and lse are worked by hand, so it builds its arguments without the test helpers.
#include <cmath>
#include <cstdio>
#include <pagedattn/block_manager.hpp>
#include <pagedattn/pagedattn.hpp>
#include <pagedattn/reference.hpp>
#include <vector>

int main() {
  const int D = 64, BS = 16;
  std::vector<float> q(D, 0.f), k(BS * D, 0.f), v(BS * D, 0.f), out(D, -1.f);
  q[0] = 1.f;
  k[0] = 8.f;      // token 0: logit 8 / sqrt(64) = 1
  v[0] = 1.f;      // token 0 value: e_0
  v[D + 1] = 1.f;  // token 1 value: e_1 (logit 0)
  std::vector<int> table{0}, lens{2};
  float lse = 0.f;
  pagedattn::DecodeArgs a;
  a.batch = 1;
  a.num_heads = a.num_kv_heads = 1;
  a.head_dim = D;
  a.block_size = BS;
  a.num_blocks = 1;
  a.max_blocks_per_seq = 1;
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  // One kv head: NHD places the rows as HND does (the installed cache_layout.hpp is usable).
  a.kv_strides = pagedattn::CacheStrides::nhd(1, BS, D);
  a.block_table = table.data();
  a.context_lens = lens.data();
  a.out = out.data();
  a.lse = &lse;
  pagedattn::DecodeOptions o;
  o.backend = pagedattn::Backend::kCpu;
  pagedattn::decode(a, o);
  const double w0 = std::exp(1.0) / (std::exp(1.0) + 1.0);
  const bool ok = std::fabs(out[0] - w0) < 1e-5 && std::fabs(out[1] - (1 - w0)) < 1e-5 &&
                  std::fabs(lse - std::log(std::exp(1.0) + 1.0)) < 1e-5;
  std::printf("consumer: out[0]=%f out[1]=%f lse=%f %s\n", out[0], out[1], lse,
              ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}
