// main() of the MPI test program, run under mpirun (see CMakeLists.txt): MPI
// for the whole run, every rank runs every test, rank 0 prints gtest's
// report, other ranks print only their failures (tagged with the rank), and
// every rank exits with the job's verdict.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "kda/distributed/mpi_communicator.h"
#include "tests/distributed_mpi_world.h"

namespace kda::testing {
namespace {

MpiCommunicator* g_world = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.message());
  }

 private:
  int rank_;
};

}  // namespace

Communicator& MpiWorld() { return *g_world; }

}  // namespace kda::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<kda::MpiCommunicator> world = kda::MpiCommunicator::World();
  kda::testing::g_world = world.get();
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new kda::testing::RankFailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0F : 0.0F;
  world->AllReduceSum(&failed, 1);
  if (world->rank() == 0 && failed > 0.0F && rc == 0) std::fprintf(stderr, "FAILED on another rank (see above)\n");
  kda::testing::g_world = nullptr;
  world.reset();
  kda::FinalizeMpi();
  return failed > 0.0F ? 1 : 0;
}
