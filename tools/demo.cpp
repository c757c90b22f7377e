// pagedattn-demo: builds a random paged cache (fragmented block table, mixed context lengths),
// runs one decode step on the chosen backend and checks it against the f64 reference.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "pagedattn/cli/args.hpp"
#include "pagedattn/testing/random_case.hpp"

using namespace pagedattn;

namespace {

int run(int argc, char** argv) {
  Backend backend = Backend::kAuto;
  cli::Args args(argc, argv);
  while (args.next()) {
    if (args.is_help()) {
      std::printf(
          "usage: %s [flags]\n"
          "Runs one decode step over a random paged cache (8 sequences of 0 to 4096 tokens, 32\n"
          "heads over 8 kv heads, head dim 128, bf16) and checks it against the f64 reference.\n"
          "Exit status: 0 a match, 1 a mismatch, 2 a bad flag or an unavailable backend.\n\n"
          "  --backend B   auto, cpu or cuda (default auto: cuda when built and a device is\n"
          "                present, else cpu; PAGEDATTN_BACKEND overrides auto)\n"
          "  --help, -h    this text\n",
          argv[0]);
      return 0;
    } else if (args.is("--backend")) {
      backend = args.choice<Backend>(
          {{"auto", Backend::kAuto}, {"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}});
    } else {
      args.unknown();
    }
  }
  DecodeOptions options;
  options.backend = backend;
  testing::CaseSpec spec;
  spec.batch = 8;
  spec.num_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.context_lens = {0, 1, 15, 16, 17, 1000, 4096, 2500};
  spec.q_dtype = spec.kv_dtype = spec.out_dtype = DType::kBF16;
  spec.seed = 2026;
  testing::HostCase c = testing::make_case(spec);
  std::printf("pagedattn-demo: %s, %d-block pool, fragmented table\n",
              testing::describe(spec).c_str(), c.num_blocks);
  const Backend used = testing::run_decode(c, options);
  const testing::Comparison cmp = testing::compare_with_reference(c);
  const double tol = testing::out_tolerance(spec.out_dtype);
  const bool ok =
      cmp.all_finite && cmp.rel_err() <= tol && cmp.max_abs_err_lse <= testing::lse_tolerance();
  std::printf(
      "backend %s: rel_err %.3g (tolerance %.3g), lse max abs err %.3g (tolerance %.3g)%s%s\n",
      backend_name(used), cmp.rel_err(), tol, cmp.max_abs_err_lse, testing::lse_tolerance(),
      cmp.all_finite ? "" : ", non-finite output at ", cmp.first_bad.c_str());
  std::printf("%s\n", ok ? "OK: matches the f64 reference" : "FAILED: mismatch");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("pagedattn-demo", [&] { return run(argc, argv); });
}
