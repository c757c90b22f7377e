#include "sim/workload.hpp"

namespace pagedattn::sim {

Request Workload::next() {
  Request r;
  r.prompt = o_.prompt_len.sample(rng_);
  r.output = o_.output_len.sample(rng_);
  if (o_.system_prompts > 0 && std::bernoulli_distribution(o_.system_prob)(rng_)) {
    r.system = std::uniform_int_distribution<int>(0, o_.system_prompts - 1)(rng_);
    r.prompt += o_.system_len;
  }
  if (o_.n_way > 1 && std::bernoulli_distribution(o_.n_way_prob)(rng_)) {
    r.samples_left = o_.n_way - 1;
  }
  if (r.output > 1 && std::bernoulli_distribution(o_.fork_prob)(rng_)) {
    r.fork_at = std::uniform_int_distribution<int>(1, r.output - 1)(rng_);
  }
  return r;
}

}  // namespace pagedattn::sim
