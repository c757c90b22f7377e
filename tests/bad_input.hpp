// What the argument tests share: the small case they break, the typed-error check, and the
// check that a rejected call wrote nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pagedattn/error.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn {

// Three sequences of 20, 0 and 9 tokens; 4 heads over 2 kv heads, head_dim 64, blocks of 8,
// table rows padded by two entries.
inline testing::CaseSpec bad_input_spec() {
  testing::CaseSpec spec = testing::shaped_spec(DType::kF32, 4, 2, 64, 8, {20, 0, 9});
  spec.table_padding = 2;
  return spec;
}

inline testing::HostCase small_case() { return testing::make_case(bad_input_spec()); }

// Runs `call`, which must throw an Error with `code` whose argument() is `argument` and whose
// message holds each of `parts`; `what` names the call and its input when it is accepted.
inline void expect_error(const std::function<void()>& call, ErrorCode code,
                         const std::string& argument, const std::vector<std::string>& parts,
                         const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

// A case's out and lse as they were when taken; check() fails where a call wrote either.
class Unwritten {
 public:
  explicit Unwritten(const testing::HostCase& c) : c_(c), out_(c.out), lse_(c.lse) {}
  void check() const {
    EXPECT_EQ(c_.out, out_) << "out was written despite the error";
    ASSERT_EQ(c_.lse.size(), lse_.size());
    EXPECT_EQ(std::memcmp(c_.lse.data(), lse_.data(), lse_.size() * sizeof(float)), 0)
        << "lse was written despite the error";
  }

 private:
  const testing::HostCase& c_;
  const std::vector<std::uint8_t> out_;
  const std::vector<float> lse_;
};

}  // namespace pagedattn
