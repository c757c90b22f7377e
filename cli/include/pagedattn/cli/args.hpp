// Strict command-line parsing shared by the pagedattn tools (pagedattn-bench, pagedattn-fuzz,
// pagedattn-demo, pagedattn-sim). A value is taken whole or not at all: no trailing characters, no
// leading blanks, no wrap-around, no NaN, and it must lie in the range the flag states. A bad flag
// is a UsageError whose message names the flag and the value:
//
//   --iters = 'abc': expected an integer in [1, 1000000000]
//
// and guarded_main() turns it into that message on stderr and exit status 2, so no input ends a
// tool with a signal or an uncaught exception.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pagedattn::cli {

class UsageError : public std::runtime_error {
 public:
  // "<flag> = '<value>': <reason>"
  UsageError(std::string flag, std::string value, const std::string& reason);
  // "<flag>: <reason>" (a flag without a value, flags that exclude each other, ...)
  UsageError(std::string flag, const std::string& reason);

  const std::string& flag() const noexcept { return flag_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string flag_, value_, reason_;
};

[[noreturn]] void bad_value(const std::string& flag, const std::string& value,
                            const std::string& reason);

// Integers in [lo, hi], decimal, an optional leading '-'.
long long parse_int(const std::string& flag, const std::string& text, long long lo, long long hi);
// Any unsigned 64-bit decimal (seeds).
std::uint64_t parse_u64(const std::string& flag, const std::string& text);
// Finite decimal numbers in [lo, hi]; `lo_open` excludes lo itself (a rate that must be > 0).
double parse_number(const std::string& flag, const std::string& text, double lo, double hi,
                    bool lo_open = false);
// A comma-separated list of non-empty items ("a,b"); an empty item or an empty list is an error.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);

// One of a fixed set of names.
template <typename T>
T parse_choice(const std::string& flag, const std::string& text,
               const std::vector<std::pair<std::string, T>>& choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names += (names.empty() ? "" : ", ") + name;
  }
  bad_value(flag, text, "expected one of " + names);
}

// A comma-separated list of names from a fixed set, each at most once.
template <typename T>
std::vector<T> parse_choice_list(const std::string& flag, const std::string& text,
                                 const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<T> out;
  std::vector<std::string> seen;
  for (const std::string& item : split_list(flag, text)) {
    for (const std::string& s : seen) {
      if (s == item) bad_value(flag, text, "'" + item + "' appears twice");
    }
    seen.push_back(item);
    out.push_back(parse_choice(flag, item, choices));
  }
  return out;
}

// Walks argv one flag at a time:
//   cli::Args args(argc, argv);
//   while (args.next()) {
//     if (args.is("--iters")) n = args.integer(1, 1000);
//     else if (args.is("--csv")) csv = true;
//     else args.unknown();
//   }
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}

  bool next();  // moves to the next flag; false when none is left
  const std::string& flag() const { return flag_; }
  bool is(const char* name) const { return flag_ == name; }
  bool is_help() const { return flag_ == "--help" || flag_ == "-h"; }

  std::string value();  // the flag's value: the next argument (an error when there is none)
  long long integer(long long lo, long long hi) { return parse_int(flag_, value(), lo, hi); }
  std::uint64_t u64() { return parse_u64(flag_, value()); }
  double number(double lo, double hi, bool lo_open = false) {
    return parse_number(flag_, value(), lo, hi, lo_open);
  }
  std::string text();  // a non-empty string value (a path, ...)
  template <typename T>
  T choice(const std::vector<std::pair<std::string, T>>& choices) {
    return parse_choice(flag_, value(), choices);
  }
  template <typename T>
  std::vector<T> choice_list(const std::vector<std::pair<std::string, T>>& choices) {
    return parse_choice_list(flag_, value(), choices);
  }
  [[noreturn]] void unknown() const;  // "unknown flag"

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};

// Runs body() and maps what escapes it to a message on stderr prefixed with `prog`, and an exit
// status: a UsageError or a pagedattn::Error 2 (with a pointer to --help for the former), any
// other exception 1. The body's own return value is returned otherwise.
int guarded_main(const char* prog, const std::function<int()>& body);

}  // namespace pagedattn::cli
