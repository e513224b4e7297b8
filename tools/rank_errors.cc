#include "tools/rank_errors.h"

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "kda/base/error.h"

namespace kda::cli {
namespace {

std::string RankPrefix(int rank) { return rank >= 0 ? "rank " + std::to_string(rank) + ": " : ""; }

}  // namespace

int ReportException(const std::exception_ptr& e, int rank) {
  const std::string where = RankPrefix(rank);
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    std::fprintf(stderr, "kda: error: %s%s\n", where.c_str(), err.what());
    return 1;
  } catch (const std::bad_alloc& err) {
    std::fprintf(stderr, "kda: error: %sout of memory (%s)\n", where.c_str(), err.what());
    return 1;
  } catch (const std::exception& err) {
    std::fprintf(stderr, "kda: internal error: %s%s\n", where.c_str(), err.what());
    return 3;
  } catch (...) {
    std::fprintf(stderr, "kda: internal error: %sunknown exception\n", where.c_str());
    return 3;
  }
}

int RunOnRanks(ParallelRuntime& rt, const std::function<int()>& work) {
  if (!rt.multi_rank()) return work();
  const int rank = rt.groups().world().rank();
  try {
    return work();
  } catch (const CollectiveError& e) {
    // Every rank is here: no one waits. Only the failing ranks speak.
    if (e.failed_here()) std::fprintf(stderr, "kda: error: %s%s\n", RankPrefix(rank).c_str(), e.own_message().c_str());
    return 1;
  } catch (...) {
    const int status = ReportException(std::current_exception(), rank);
    rt.Abort(status);
  }
}

}  // namespace kda::cli
