// Error type of the component: every refusal of bad input is a kda::Error
// whose message names what is wrong.
#pragma once

#include <concepts>
#include <stdexcept>
#include <string>

namespace kda {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The refusal of an argument's element type (Python front ends raise it as
// TypeError, every other kda::Error as ValueError).
class DTypeError : public Error {
 public:
  explicit DTypeError(const std::string& what) : Error(what) {}
};

// Throws kda::Error(message) when `ok` is false.
inline void Check(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

// As above, with the message built only on failure: for checks on hot paths
// (a kernel call's validation must not allocate when the input is good).
template <class MessageFn>
requires std::invocable<MessageFn&>
inline void Check(bool ok, MessageFn&& message) {
  if (!ok) throw Error(message());
}

}  // namespace kda
