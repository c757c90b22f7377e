// Case files: the full description of a fuzz case as "key value..." lines, '#' comments, so that
// a saved (shrunk) case replays alone (pagedattn-fuzz --replay FILE). A key left out keeps the
// FuzzCase default.
#pragma once

#include <string>

#include "fuzz_case.hpp"

namespace pagedattn::fuzz {

// save throws std::runtime_error on I/O errors, load and from_text on I/O or parse errors.
std::string to_text(const FuzzCase& c);
FuzzCase from_text(const std::string& text);
void save_case(const FuzzCase& c, const std::string& path);
FuzzCase load_case(const std::string& path);

}  // namespace pagedattn::fuzz
