// A setting chosen by name (a CLI flag, an environment variable): parsing and
// naming an enum through the table of its names, and an environment variable
// read once whose bad value is kept and thrown whenever the setting is needed
// (a kda::Error, never an abort at startup).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kda/base/error.h"

namespace kda {

// names[i] names the enum value i.
template <class E, size_t N>
E ParseNamed(const std::string& name, const char* const (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  std::string expected;
  for (size_t i = 0; i < N; ++i) expected += std::string(i == 0 ? "" : (i + 1 == N ? " or " : ", ")) + names[i];
  throw Error(std::string("unknown ") + what + " '" + name + "' (expected " + expected + ")");
}

template <class E, size_t N>
const char* NameOf(E value, const char* const (&names)[N]) {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : "?";
}

// A process-wide setting: the value given to Set if any (read without a
// lock: the kernels' dispatch reads it on every call), else environment
// variable `var` as `parse` reads it (`fallback` when unset or empty), parsed
// on first use and after Reset.
template <class E>
class EnvSetting {
 public:
  EnvSetting(const char* var, E fallback) : var_(var), fallback_(fallback) {}

  void Set(E value) { set_.store(static_cast<int>(value)); }
  void Unset() { set_.store(kUnset); }

  template <class ParseFn>
  E Get(ParseFn&& parse) {
    const int set = set_.load();
    if (set != kUnset) return static_cast<E>(set);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!parsed_) {
      parsed_ = true;
      value_ = fallback_;
      error_.clear();
      const char* text = std::getenv(var_);
      if (text != nullptr && text[0] != '\0') {
        try {
          value_ = parse(text);
        } catch (const Error& e) {
          error_ = std::string(var_) + " environment variable: " + e.what();
        }
      }
    }
    if (!error_.empty()) throw Error(error_);
    return value_;
  }
  // Unset, and the variable read again at the next Get (tests).
  void Reset() {
    Unset();
    std::lock_guard<std::mutex> lock(mutex_);
    parsed_ = false;
  }

 private:
  static constexpr int kUnset = -1;
  std::atomic<int> set_{kUnset};
  const char* var_;
  E fallback_;
  std::mutex mutex_;
  bool parsed_ = false;
  E value_{};
  std::string error_;
};

}  // namespace kda
