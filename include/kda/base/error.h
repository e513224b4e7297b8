// Error type of the component: every refusal of bad input is a kda::Error
// whose message names what is wrong.
#pragma once

#include <stdexcept>
#include <string>

namespace kda {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws kda::Error(message) when `ok` is false.
inline void Check(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

}  // namespace kda
