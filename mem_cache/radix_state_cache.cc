#include "kda/mem_cache/radix_state_cache.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/mem_cache/recurrent_state_pool.h"

namespace kda {

RadixStateCache::RadixStateCache(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype, int64_t budget_bytes)
    : num_layers_(num_layers),
      spec_(spec),
      conv_dtype_(conv_dtype),
      snapshot_bytes_(SnapshotBytes(num_layers, spec, conv_dtype)),
      capacity_(0) {
  Check(budget_bytes >= 0, "prefix cache: the budget must be >= 0 bytes, got " + std::to_string(budget_bytes));
  Check(snapshot_bytes_ > 0, "prefix cache: empty state shape");
  capacity_ = budget_bytes / snapshot_bytes_;
  nodes_.emplace_back();
  nodes_[0].live = true;
}

RadixStateCache::~RadixStateCache() = default;

int64_t RadixStateCache::SnapshotBytes(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype) {
  return RecurrentStatePool::BytesPerRequest(num_layers, spec, conv_dtype);
}

RadixStateCache::Node& RadixStateCache::At(int32_t id, const char* who) {
  Check(id > 0 && static_cast<size_t>(id) < nodes_.size() && nodes_[id].live && nodes_[id].data != nullptr,
        [&] { return std::string("prefix cache: ") + who + ": no snapshot " + std::to_string(id); });
  return nodes_[id];
}

int32_t RadixStateCache::NewNode(int32_t parent, std::vector<int32_t> edge, int64_t depth) {
  int32_t id = 0;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n = Node{};
  n.parent = parent;
  n.edge = std::move(edge);
  n.depth = depth;
  n.live = true;
  return id;
}

int32_t RadixStateCache::Find(const int32_t* tokens, int64_t n) const {
  int32_t cur = 0;
  int64_t pos = 0;
  while (pos < n) {
    const Node& node = nodes_[cur];
    const auto it = node.children.find(tokens[pos]);
    if (it == node.children.end()) return -1;
    const Node& child = nodes_[it->second];
    const auto len = static_cast<int64_t>(child.edge.size());
    if (pos + len > n || !std::equal(child.edge.begin(), child.edge.end(), tokens + pos)) return -1;
    pos += len;
    cur = it->second;
  }
  return cur;
}

int32_t RadixStateCache::FindOrInsert(const int32_t* tokens, int64_t n) {
  int32_t cur = 0;
  int64_t pos = 0;
  while (pos < n) {
    const auto it = nodes_[cur].children.find(tokens[pos]);
    if (it == nodes_[cur].children.end()) {
      const int32_t leaf = NewNode(cur, std::vector<int32_t>(tokens + pos, tokens + n), n);
      nodes_[cur].children.emplace(tokens[pos], leaf);
      return leaf;
    }
    const int32_t child = it->second;
    const std::vector<int32_t>& edge = nodes_[child].edge;
    const int64_t limit = std::min<int64_t>(static_cast<int64_t>(edge.size()), n - pos);
    int64_t m = 0;
    while (m < limit && edge[m] == tokens[pos + m]) ++m;
    if (m == static_cast<int64_t>(edge.size())) {
      pos += m;
      cur = child;
      continue;
    }
    // Split the edge after m tokens: cur -> mid -> child.
    std::vector<int32_t> head(edge.begin(), edge.begin() + m);
    std::vector<int32_t> tail(edge.begin() + m, edge.end());
    const int32_t mid = NewNode(cur, std::move(head), nodes_[cur].depth + m);
    nodes_[mid].children.emplace(tail[0], child);
    nodes_[child].edge = std::move(tail);
    nodes_[child].parent = mid;
    nodes_[cur].children[tokens[pos]] = mid;
    pos += m;
    cur = mid;
  }
  return cur;
}

std::optional<RadixStateCache::Snapshot> RadixStateCache::Match(const int32_t* tokens, int64_t n) {
  if (!enabled() || n <= 0 || tokens == nullptr) return std::nullopt;
  int32_t cur = 0;
  int64_t pos = 0;
  int32_t best = -1;
  while (pos < n) {
    const auto it = nodes_[cur].children.find(tokens[pos]);
    if (it == nodes_[cur].children.end()) break;
    const Node& child = nodes_[it->second];
    const auto len = static_cast<int64_t>(child.edge.size());
    if (pos + len > n || !std::equal(child.edge.begin(), child.edge.end(), tokens + pos)) break;
    pos += len;
    cur = it->second;
    if (child.data != nullptr && child.committed) best = cur;
  }
  if (best < 0) return std::nullopt;
  Node& node = nodes_[best];
  ++node.locks;
  node.last_use = ++clock_;
  const int64_t rs = static_cast<int64_t>(num_layers_) * spec_.recurrent_size();
  return Snapshot{best, node.depth, node.data.get(), reinterpret_cast<uint8_t*>(node.data.get() + rs)};
}

void RadixStateCache::Unlock(int32_t id) {
  Node& node = At(id, "Unlock");
  Check(node.locks > 0, "prefix cache: Unlock of snapshot " + std::to_string(id) + ", which is not locked");
  --node.locks;
}

bool RadixStateCache::EvictOne() {
  int32_t victim = -1;
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.live || n.data == nullptr || n.locks > 0) continue;
    if (victim < 0 || n.last_use < nodes_[victim].last_use) victim = static_cast<int32_t>(i);
  }
  if (victim < 0) return false;
  DropSnapshot(victim);
  ++evictions_;
  return true;
}

void RadixStateCache::DropSnapshot(int32_t id) {
  Node& node = nodes_[id];
  node.data.reset();
  node.committed = false;
  node.locks = 0;
  --num_snapshots_;
  PruneUp(id);
}

void RadixStateCache::PruneUp(int32_t id) {
  // A tombstone leaf leads to no snapshot: remove it, and its parent if that becomes one.
  while (id > 0) {
    Node& node = nodes_[id];
    if (node.data != nullptr || !node.children.empty()) return;
    const int32_t parent = node.parent;
    nodes_[parent].children.erase(node.edge[0]);
    node = Node{};
    free_nodes_.push_back(id);
    id = parent;
  }
}

std::optional<RadixStateCache::Snapshot> RadixStateCache::Reserve(const int32_t* tokens, int64_t n) {
  if (!enabled() || n <= 0 || tokens == nullptr) return std::nullopt;
  const int32_t existing = Find(tokens, n);
  if (existing > 0 && nodes_[existing].data != nullptr) {
    nodes_[existing].last_use = ++clock_;
    return std::nullopt;
  }
  if (num_snapshots_ >= capacity_ && !EvictOne()) return std::nullopt;
  const int32_t id = FindOrInsert(tokens, n);  // after eviction: pruning may have removed part of the path
  Node& node = nodes_[id];
  const int64_t rs = static_cast<int64_t>(num_layers_) * spec_.recurrent_size();
  const int64_t floats =
      (snapshot_bytes_ + static_cast<int64_t>(sizeof(float)) - 1) / static_cast<int64_t>(sizeof(float));
  try {
    node.data = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(floats));
  } catch (const std::bad_alloc&) {
    PruneUp(id);
    throw Error("prefix cache: cannot allocate a snapshot of " + std::to_string(snapshot_bytes_) +
                " bytes: out of memory");
  }
  node.committed = false;
  node.locks = 1;
  node.last_use = ++clock_;
  ++num_snapshots_;
  peak_snapshots_ = std::max(peak_snapshots_, num_snapshots_);
  return Snapshot{id, node.depth, node.data.get(), reinterpret_cast<uint8_t*>(node.data.get() + rs)};
}

void RadixStateCache::Commit(int32_t id) {
  Node& node = At(id, "Commit");
  Check(!node.committed && node.locks == 1,
        "prefix cache: Commit of snapshot " + std::to_string(id) + ", which is not a reserved one");
  node.committed = true;
  node.locks = 0;
}

void RadixStateCache::Abandon(int32_t id) {
  Node& node = At(id, "Abandon");
  Check(!node.committed, "prefix cache: Abandon of snapshot " + std::to_string(id) + ", which is committed");
  DropSnapshot(id);
}

int64_t RadixStateCache::num_locked() const {
  int64_t n = 0;
  for (const Node& node : nodes_) n += node.live && node.data != nullptr && node.locks > 0 ? 1 : 0;
  return n;
}

int64_t RadixStateCache::num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_nodes_.size()); }

bool RadixStateCache::Contains(const int32_t* tokens, int64_t n) const {
  const int32_t id = n > 0 ? Find(tokens, n) : -1;
  return id > 0 && nodes_[id].data != nullptr && nodes_[id].committed;
}

}  // namespace kda
