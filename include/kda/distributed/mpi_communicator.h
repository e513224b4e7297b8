// The MPI implementation of Communicator (Open MPI; any MPI-3 library works).
// Nothing else in the component includes <mpi.h>.
//
// MPI is started only on request (MpiCommunicator::World) and finalized by
// FinalizeMpi: a single-process run never touches the MPI runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kda/distributed/communicator.h"

namespace kda {

// True when an MPI launcher started this process (mpirun / mpiexec of Open
// MPI set OMPI_COMM_WORLD_SIZE; PMIx and PMI launchers PMIX_RANK / PMI_SIZE).
bool LaunchedByMpiLauncher();

class MpiCommunicator : public Communicator {
 public:
  // MPI_COMM_WORLD, initializing MPI (MPI_THREAD_FUNNELED: only the calling
  // thread communicates) on the first call.
  static std::unique_ptr<MpiCommunicator> World();
  // Frees a communicator made by Split (while MPI is still running).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(float* data, int64_t n) override;
  std::vector<std::vector<uint8_t>> Gather(const void* data, int64_t nbytes, int root) override;
  void Broadcast(void* data, int64_t nbytes, int root) override;
  void Barrier() override;
  std::unique_ptr<Communicator> Split(int color, int key) override;
  // MPI_Abort on this communicator: mpirun ends every process of the job.
  [[noreturn]] void Abort(int code) override;

 private:
  struct Handle;
  explicit MpiCommunicator(std::unique_ptr<Handle> handle);

  std::unique_ptr<Handle> handle_;  // the MPI_Comm
  int rank_ = 0;
  int size_ = 1;
};

// Whether MPI_Init has run and MPI_Finalize has not.
bool MpiRunning();
// Finalizes MPI if it is running (destroy every MpiCommunicator first). Every
// rank must call it: it waits for the others.
void FinalizeMpi();
// Ends every process of the job (MPI_Abort on the world) with `code`.
[[noreturn]] void AbortMpi(int code);

}  // namespace kda
