// Recurrent prefix caching: a radix tree over token ids whose nodes may hold a
// snapshot of every delta-rule layer's state after that prefix, so that requests
// sharing a prefix (a system prompt, the earlier turns of a conversation)
// start from the snapshot instead of recomputing it.
//
// The key is the token-id prefix: the ids must determine the layers' inputs
// (true in a model, where the hidden states of a position are a function of
// the ids up to it). A snapshot holds, for all L layers, the recurrent state
// [HV, K, V] fp32 and the conv tail [W-1, C] in the conv dtype, laid out as
// one request's states: recurrent [L, HV, K, V], then conv [L, W-1, C] (the
// layout of RecurrentStatePool::GetLayerState per layer). Snapshots live in a
// pool with its own byte budget (0: caching off). They are never written once
// committed (a request copies one into its slot: copy-on-write); a locked
// snapshot (being copied, or reserved and not yet filled) is never evicted;
// eviction is LRU over the unlocked ones. A node whose snapshot was evicted
// keeps its place in the tree (a tombstone), so deeper snapshots stay
// reachable; a tombstone leaf is removed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/mem_cache/recurrent_state_spec.h"

namespace kda {

class RadixStateCache {
 public:
  // Storage of one snapshot: recurrent [L, HV, K, V] fp32, conv [L, W-1, C]
  // (conv dtype). id names it in Unlock / Commit / Abandon.
  struct Snapshot {
    int32_t id = -1;
    int64_t length = 0;  // tokens of its prefix
    float* recurrent = nullptr;
    uint8_t* conv = nullptr;
  };

  // A pool of budget_bytes / SnapshotBytes(...) snapshots (none: disabled).
  RadixStateCache(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype, int64_t budget_bytes);
  ~RadixStateCache();
  RadixStateCache(const RadixStateCache&) = delete;
  RadixStateCache& operator=(const RadixStateCache&) = delete;

  // Bytes of one snapshot (one request's states, RecurrentStatePool::BytesPerRequest).
  static int64_t SnapshotBytes(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype);

  // The deepest committed snapshot whose prefix is a prefix of tokens[0, n),
  // locked (Unlock it once copied); empty when none.
  std::optional<Snapshot> Match(const int32_t* tokens, int64_t n);
  void Unlock(int32_t id);

  // Storage for a new snapshot of the prefix tokens[0, n) (n >= 1), locked and
  // invisible to Match until Commit; empty when that prefix already holds one
  // (its use time is refreshed) or no room can be made (budget 0, every
  // snapshot locked). May evict the least recently used unlocked snapshot.
  std::optional<Snapshot> Reserve(const int32_t* tokens, int64_t n);
  // The reserved snapshot is filled: unlocked and visible.
  void Commit(int32_t id);
  // The reserved snapshot was not filled: dropped.
  void Abandon(int32_t id);

  bool enabled() const { return capacity_ > 0; }
  int num_layers() const { return num_layers_; }
  const RecurrentStateSpec& spec() const { return spec_; }
  DType conv_dtype() const { return conv_dtype_; }
  int64_t capacity() const { return capacity_; }  // snapshots that fit in the budget
  int64_t snapshot_bytes() const { return snapshot_bytes_; }
  int64_t num_snapshots() const { return num_snapshots_; }  // committed or reserved
  int64_t bytes_in_use() const { return num_snapshots_ * snapshot_bytes_; }
  int64_t peak_bytes() const { return peak_snapshots_ * snapshot_bytes_; }
  int64_t num_locked() const;
  int64_t num_nodes() const;  // tree nodes, root and tombstones included
  int64_t evictions() const { return evictions_; }
  // Whether the prefix tokens[0, n) holds a committed snapshot (tests).
  bool Contains(const int32_t* tokens, int64_t n) const;

 private:
  struct Node {
    int32_t parent = -1;
    std::vector<int32_t> edge;            // tokens from the parent to this node
    std::map<int32_t, int32_t> children;  // by first edge token
    int64_t depth = 0;                    // prefix length
    std::unique_ptr<float[]> data;        // the snapshot, or null (tombstone / never held one)
    bool committed = false;
    int32_t locks = 0;
    uint64_t last_use = 0;
    bool live = false;  // the slot of nodes_ is in use
  };

  int32_t NewNode(int32_t parent, std::vector<int32_t> edge, int64_t depth);
  // The node of prefix tokens[0, n), created (splitting an edge) when missing.
  int32_t FindOrInsert(const int32_t* tokens, int64_t n);
  // The node of prefix tokens[0, n) if it exists, else -1.
  int32_t Find(const int32_t* tokens, int64_t n) const;
  bool EvictOne();
  void DropSnapshot(int32_t id);
  void PruneUp(int32_t id);
  Node& At(int32_t id, const char* who);

  int num_layers_;
  RecurrentStateSpec spec_;
  DType conv_dtype_;
  int64_t snapshot_bytes_;
  int64_t capacity_;
  std::vector<Node> nodes_;  // [0] the root (empty prefix, never a snapshot)
  std::vector<int32_t> free_nodes_;
  int64_t num_snapshots_ = 0;
  int64_t peak_snapshots_ = 0;
  int64_t evictions_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace kda
