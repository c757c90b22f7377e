#include "pagedattn/cli/args.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <sstream>

#include "pagedattn/error.hpp"

namespace pagedattn::cli {
namespace {

std::string range_text(long long lo, long long hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string number_text(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

}  // namespace

UsageError::UsageError(std::string flag, std::string value, const std::string& reason)
    : std::runtime_error(flag + " = '" + value + "': " + reason),
      flag_(std::move(flag)),
      value_(std::move(value)),
      reason_(reason) {}

UsageError::UsageError(std::string flag, const std::string& reason)
    : std::runtime_error(flag + ": " + reason), flag_(std::move(flag)), reason_(reason) {}

void bad_value(const std::string& flag, const std::string& value, const std::string& reason) {
  throw UsageError(flag, value, reason);
}

long long parse_int(const std::string& flag, const std::string& text, long long lo, long long hi) {
  const std::string expected = "expected an integer in " + range_text(lo, hi);
  long long v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec == std::errc::invalid_argument || end != last) {
    bad_value(flag, text, expected);
  }
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
    bad_value(flag, text, "out of range: " + expected);
  }
  return v;
}

std::uint64_t parse_u64(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, v);
  if (text.empty() || ec != std::errc() || end != last) {
    bad_value(flag, text, "expected an unsigned 64-bit integer");
  }
  return v;
}

double parse_number(const std::string& flag, const std::string& text, double lo, double hi,
                    bool lo_open) {
  const std::string expected = std::string("expected a number in ") + (lo_open ? "(" : "[") +
                               number_text(lo) + ", " + number_text(hi) + "]";
  // Decimal only: strtod alone would also take leading blanks, hex floats, "nan" and "inf".
  const bool decimal =
      !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
  char* end = nullptr;
  errno = 0;
  const double v = decimal ? std::strtod(text.c_str(), &end) : 0.0;
  if (!decimal || end != text.c_str() + text.size()) bad_value(flag, text, expected);
  if (errno == ERANGE || !std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
    bad_value(flag, text, "out of range: " + expected);
  }
  return v;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) bad_value(flag, text, "expected a comma-separated list without empty items");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

bool Args::next() {
  if (i_ + 1 >= argc_) return false;
  flag_ = argv_[++i_];
  return true;
}

std::string Args::value() {
  if (i_ + 1 >= argc_) throw UsageError(flag_, "needs a value");
  return argv_[++i_];
}

std::string Args::text() {
  std::string v = value();
  if (v.empty()) bad_value(flag_, v, "must not be empty");
  return v;
}

void Args::unknown() const {
  if (flag_.rfind("--", 0) == 0 || flag_.rfind("-", 0) == 0) {
    throw UsageError(flag_, "unknown flag");
  }
  throw UsageError(flag_, "unexpected argument (not a flag)");
}

int guarded_main(const char* prog, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(%s --help lists the flags)\n", prog, e.what(), prog);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory\n", prog);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "%s: error: an unknown exception\n", prog);
    return 1;
  }
}

}  // namespace pagedattn::cli
