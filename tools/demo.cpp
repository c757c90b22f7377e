// pagedattn-demo: builds a random paged cache (fragmented block table, mixed context lengths),
// runs one decode step on the chosen backend and checks it against the f64 reference.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "random_case.hpp"

using namespace pagedattn;

int main(int argc, char** argv) {
  std::string backend_text = "auto";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend_text = argv[++i];
    } else {
      const bool help = std::strcmp(argv[i], "--help") == 0;
      std::fprintf(help ? stdout : stderr,
                   "usage: %s [--backend auto|cpu|cuda]\n"
                   "Runs one decode step over a random paged cache and checks it against the f64 "
                   "reference.\n",
                   argv[0]);
      return help ? 0 : 2;
    }
  }
  try {
    DecodeOptions options;
    options.backend = parse_backend(backend_text);
    testkit::CaseSpec spec;
    spec.batch = 8;
    spec.num_heads = 32;
    spec.num_kv_heads = 8;
    spec.head_dim = 128;
    spec.block_size = 16;
    spec.context_lens = {0, 1, 15, 16, 17, 1000, 4096, 2500};
    spec.q_dtype = spec.kv_dtype = spec.out_dtype = DType::kBF16;
    spec.seed = 2026;
    testkit::HostCase c = testkit::make_case(spec);
    std::printf("pagedattn-demo: %s, %d-block pool, fragmented table\n",
                testkit::describe(spec).c_str(), c.num_blocks);
    const Backend used = testkit::run_decode(c, options);
    const testkit::Comparison cmp = testkit::compare_with_reference(c);
    const double tol = testkit::out_tolerance(spec.out_dtype);
    const bool ok =
        cmp.all_finite && cmp.rel_err() <= tol && cmp.max_abs_err_lse <= testkit::lse_tolerance();
    std::printf(
        "backend %s: rel_err %.3g (tolerance %.3g), lse max abs err %.3g (tolerance %.3g)%s%s\n",
        backend_name(used), cmp.rel_err(), tol, cmp.max_abs_err_lse, testkit::lse_tolerance(),
        cmp.all_finite ? "" : ", non-finite output at ", cmp.first_bad.c_str());
    std::printf("%s\n", ok ? "OK: matches the f64 reference" : "FAILED: mismatch");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
