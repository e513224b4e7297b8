#include "base/fault_inject.h"

#include <csignal>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <string>

#include <unistd.h>

#include "kda/base/error.h"

namespace kda {
namespace {

enum class Action { kThrowError, kBadAlloc, kKill };

struct Fault {
  int rank = -1;
  FaultPoint point = FaultPoint::kLoad;
  Action action = Action::kThrowError;
  const char* name = "";
  long long skip = 0;
  long long passed = 0;
};

struct State {
  std::mutex mu;
  bool loaded = false;
  std::string spec;
  std::optional<Fault> fault;
  std::string parse_error;
};

State& GetState() {
  static State s;
  return s;
}

int ThisRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

bool ToInt(const std::string& s, long long* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) return false;
  *out = std::stoll(s);
  return true;
}

// "rank:R,at:POINT[,skip:N]" -> the fault, or an error message.
std::optional<Fault> Parse(const std::string& spec, std::string* error) {
  Fault f;
  bool have_rank = false;
  bool have_at = false;
  bool have_skip = false;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    const std::string value = colon == std::string::npos ? "" : item.substr(colon + 1);
    long long n = 0;
    if (key == "rank" && ToInt(value, &n)) {
      f.rank = static_cast<int>(n);
      have_rank = true;
    } else if (key == "skip" && ToInt(value, &n)) {
      f.skip = n;
      have_skip = true;
    } else if (key == "at" && (value == "load" || value == "alloc" || value == "forward" || value == "kill")) {
      have_at = true;
      if (value == "load") f = {f.rank, FaultPoint::kLoad, Action::kThrowError, "load", f.skip, 0};
      if (value == "alloc") f = {f.rank, FaultPoint::kAlloc, Action::kBadAlloc, "alloc", f.skip, 0};
      if (value == "forward") f = {f.rank, FaultPoint::kForward, Action::kThrowError, "forward", f.skip, 0};
      if (value == "kill") f = {f.rank, FaultPoint::kForward, Action::kKill, "kill", f.skip, 0};
    } else {
      *error = "KDA_FAULT_INJECT: bad entry '" + item + "' in '" + spec +
               "' (expected rank:R,at:load|alloc|forward|kill[,skip:N])";
      return std::nullopt;
    }
  }
  if (!have_rank || !have_at) {
    *error = "KDA_FAULT_INJECT: '" + spec + "' needs rank:R and at:load|alloc|forward|kill";
    return std::nullopt;
  }
  if (!have_skip && f.point == FaultPoint::kForward) f.skip = 1;
  return f;
}

void Load(State& s, const std::string& spec) {
  s.loaded = true;
  s.spec = spec;
  s.fault.reset();
  s.parse_error.clear();
  if (!spec.empty()) s.fault = Parse(spec, &s.parse_error);
}

}  // namespace

void SetFaultInjection(const std::string& spec) {
  State& s = GetState();
  const std::lock_guard<std::mutex> lock(s.mu);
  Load(s, spec);
}

void MaybeInjectFault(FaultPoint point) {
  State& s = GetState();
  Action action = Action::kThrowError;
  std::string what;
  {
    const std::lock_guard<std::mutex> lock(s.mu);
    if (!s.loaded) {
      const char* env = std::getenv("KDA_FAULT_INJECT");
      Load(s, env != nullptr ? env : "");
    }
    if (!s.parse_error.empty()) throw Error(s.parse_error);
    if (!s.fault || s.fault->point != point) return;
    Fault& f = *s.fault;
    const int rank = ThisRank();
    if (f.rank != rank || f.passed++ < f.skip) return;
    action = f.action;
    what = "fault injected by KDA_FAULT_INJECT (at:" + std::string(f.name) + " on rank " + std::to_string(rank) + ")";
    s.fault.reset();  // once
  }
  switch (action) {
    case Action::kKill:
      ::kill(::getpid(), SIGKILL);
      std::_Exit(137);  // not reached
    case Action::kBadAlloc:
      throw std::bad_alloc();
    case Action::kThrowError:
      throw Error(what);
  }
}

}  // namespace kda
