#include "kda/distributed/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kda/base/error.h"

namespace kda {
namespace {

// MPI counts are int: larger buffers go in pieces of at most this many elements.
constexpr int64_t kMaxCount = INT_MAX / 2;
constexpr int kGatherTag = 7301;

void CheckMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

}  // namespace

struct MpiCommunicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;  // made by Split: freed with the communicator
};

bool LaunchedByMpiLauncher() { return EnvSet("OMPI_COMM_WORLD_SIZE") || EnvSet("PMIX_RANK") || EnvSet("PMI_SIZE"); }

bool MpiRunning() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::World() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = 0;
    CheckMpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  Check(MpiRunning(), "MPI was already finalized in this process");
  auto h = std::make_unique<Handle>();
  h->comm = MPI_COMM_WORLD;
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(h)));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Handle> handle) : handle_(std::move(handle)) {
  CheckMpi(MPI_Comm_rank(handle_->comm, &rank_), "MPI_Comm_rank");
  CheckMpi(MPI_Comm_size(handle_->comm, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  if (handle_->owned && handle_->comm != MPI_COMM_NULL && MpiRunning()) MPI_Comm_free(&handle_->comm);
}

void MpiCommunicator::AllReduceSum(float* data, int64_t n) {
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, kMaxCount));
    CheckMpi(MPI_Allreduce(MPI_IN_PLACE, data + done, count, MPI_FLOAT, MPI_SUM, handle_->comm), "MPI_Allreduce");
    done += count;
  }
}

// Point to point, root receiving from each rank in turn: sizes may differ by
// rank and exceed an int, and the results are small next to a forward pass.
std::vector<std::vector<uint8_t>> MpiCommunicator::Gather(const void* data, int64_t nbytes, int root) {
  Check(root >= 0 && root < size_, "Gather: root " + std::to_string(root) + " out of range");
  Check(nbytes >= 0 && (nbytes == 0 || data != nullptr), "Gather: bad buffer");
  const auto* src = static_cast<const uint8_t*>(data);
  if (rank_ != root) {
    CheckMpi(MPI_Send(&nbytes, 1, MPI_INT64_T, root, kGatherTag, handle_->comm), "MPI_Send");
    for (int64_t done = 0; done < nbytes;) {
      const int count = static_cast<int>(std::min(nbytes - done, kMaxCount));
      CheckMpi(MPI_Send(src + done, count, MPI_BYTE, root, kGatherTag, handle_->comm), "MPI_Send");
      done += count;
    }
    return {};
  }
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (r == root) {
      all[r].assign(src, src + nbytes);
      continue;
    }
    int64_t n = 0;
    CheckMpi(MPI_Recv(&n, 1, MPI_INT64_T, r, kGatherTag, handle_->comm, MPI_STATUS_IGNORE), "MPI_Recv");
    all[r].resize(static_cast<size_t>(n));
    for (int64_t done = 0; done < n;) {
      const int count = static_cast<int>(std::min(n - done, kMaxCount));
      CheckMpi(MPI_Recv(all[r].data() + done, count, MPI_BYTE, r, kGatherTag, handle_->comm, MPI_STATUS_IGNORE),
               "MPI_Recv");
      done += count;
    }
  }
  return all;
}

void MpiCommunicator::Broadcast(void* data, int64_t nbytes, int root) {
  Check(root >= 0 && root < size_, "Broadcast: root " + std::to_string(root) + " out of range");
  auto* p = static_cast<uint8_t*>(data);
  for (int64_t done = 0; done < nbytes;) {
    const int count = static_cast<int>(std::min(nbytes - done, kMaxCount));
    CheckMpi(MPI_Bcast(p + done, count, MPI_BYTE, root, handle_->comm), "MPI_Bcast");
    done += count;
  }
}

void MpiCommunicator::Barrier() { CheckMpi(MPI_Barrier(handle_->comm), "MPI_Barrier"); }

std::unique_ptr<Communicator> MpiCommunicator::Split(int color, int key) {
  auto h = std::make_unique<Handle>();
  CheckMpi(MPI_Comm_split(handle_->comm, color, key, &h->comm), "MPI_Comm_split");
  h->owned = true;
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(h)));
}

void MpiCommunicator::Abort(int code) {
  std::fflush(nullptr);  // this rank's last words before mpirun kills the job
  if (MpiRunning()) MPI_Abort(handle_->comm, code);
  std::_Exit(code);
}

void FinalizeMpi() {
  if (MpiRunning()) MPI_Finalize();
}

void AbortMpi(int code) {
  std::fflush(nullptr);
  if (MpiRunning()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace kda
