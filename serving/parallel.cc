#include "kda/serving/parallel.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/kernels/gemm_route.h"

namespace kda {
namespace {

// A part of a row of states: `units` elements per key head, heads in order; a key head's own (its conv
// channels of q and k, Mamba2's B and C: whole on every rank sharing the key head) or its value heads'.
struct StatePart {
  int64_t units = 0;
  bool per_key_head = false;
};

// Copies the shard's blocks between a full and a shard layout of `rows` rows, each the concatenation of
// `parts` over H key heads (the shard's rows: its part of each, HeadShard::Range), elements of `esz` bytes.
void CopyHeads(const uint8_t* src, uint8_t* dst, int64_t rows, const std::vector<StatePart>& parts, int H, size_t esz,
               const HeadShard& s, bool to_shard) {
  Check(s.total == H && s.begin >= 0 && s.count >= 1 && s.begin + s.count <= H && s.split >= 1,
        "head shard does not fit the states");
  int64_t full_row = 0;
  int64_t shard_row = 0;
  for (const StatePart& p : parts) {
    const auto [b, e] = s.Range(p.units, p.per_key_head);
    full_row += H * p.units;
    shard_row += e - b;
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t full_base = r * full_row;
    int64_t shard_base = r * shard_row;
    for (const StatePart& p : parts) {
      const auto [b, e] = s.Range(p.units, p.per_key_head);
      const size_t full_off = static_cast<size_t>(full_base + b) * esz;
      const size_t shard_off = static_cast<size_t>(shard_base) * esz;
      const auto run = static_cast<size_t>(e - b) * esz;
      if (to_shard) {
        std::memcpy(dst + shard_off, src + full_off, run);
      } else {
        std::memcpy(dst + full_off, src + shard_off, run);
      }
      full_base += H * p.units;
      shard_base += e - b;
    }
  }
}

// A key head's recurrent block (its value heads' states) and conv channels per part.
std::vector<StatePart> RecurrentParts(const DeltaRuleGeometry& g) { return {{int64_t{g.group()} * g.K * g.V}}; }
// The conv channels' parts per key head, in channel order: q|k|v, or a Mamba2 mixer's x|B|C (v|k|q).
std::vector<StatePart> ConvParts(const DeltaRuleGeometry& g) {
  const StatePart v = {int64_t{g.group()} * g.V, false};
  const StatePart k = {g.K, true};
  return g.ssd ? std::vector<StatePart>{v, k, k} : std::vector<StatePart>{k, k, v};
}

// Byte serialization of request results for the gathers.
class Writer {
 public:
  template <typename T>
  void Put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void PutBytes(const void* data, size_t n) {
    Put(static_cast<int64_t>(n));
    const auto* p = static_cast<const uint8_t*>(data);
    buf_.insert(buf_.end(), p, p + n);
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& buf) : buf_(buf) {}
  template <typename T>
  T Get() {
    T v{};
    Take(&v, sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const auto n = Get<int64_t>();
    Check(n >= 0 && n % static_cast<int64_t>(sizeof(T)) == 0, "gather: corrupt result stream");
    std::vector<T> v(static_cast<size_t>(n) / sizeof(T));
    Take(v.data(), static_cast<size_t>(n));
    return v;
  }
  bool done() const { return pos_ == buf_.size(); }

 private:
  void Take(void* dst, size_t n) {
    Check(n <= buf_.size() - pos_, "gather: truncated result stream");
    if (n > 0) std::memcpy(dst, buf_.data() + pos_, n);
    pos_ += n;
  }
  const std::vector<uint8_t>& buf_;
  size_t pos_ = 0;
};

void SortById(std::vector<RequestResult>& v) {
  std::sort(v.begin(), v.end(), [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
}

// Collective over `tp`: the results (the same requests, by id, on every tp
// rank) with the states of every head, at tp rank 0 (empty elsewhere).
std::vector<RequestResult> GatherTpStates(Communicator& tp, std::vector<RequestResult> local, int L,
                                          const DeltaRuleGeometry& full, size_t esz) {
  if (tp.size() == 1) return local;
  Writer w;
  for (const RequestResult& r : local) {
    w.Put(r.id);
    w.PutBytes(r.final_recurrent.data(), r.final_recurrent.size() * sizeof(float));
    w.PutBytes(r.final_conv.data(), r.final_conv.size());
  }
  const std::vector<std::vector<uint8_t>> parts =
      tp.Gather(w.bytes().data(), static_cast<int64_t>(w.bytes().size()), 0);
  if (tp.rank() != 0) return {};
  std::vector<RequestResult> out = std::move(local);
  for (RequestResult& r : out) {
    r.final_recurrent.assign(static_cast<size_t>(L * full.state_spec().recurrent_size()), 0.0F);
    r.final_conv.assign(static_cast<size_t>(L * full.state_spec().conv_size()) * esz, 0);
  }
  for (int rank = 0; rank < tp.size(); ++rank) {
    const HeadShard shard = MakeHeadShard(full.H, rank, tp.size(), full.group());
    const RecurrentStateSpec part = full.Shard(shard.begin, shard.count, shard.split).state_spec();
    Reader rd(parts[rank]);
    for (RequestResult& r : out) {
      Check(rd.Get<int64_t>() == r.id, "tensor-parallel ranks finished different requests");
      const std::vector<float> rec = rd.GetVector<float>();
      const std::vector<uint8_t> conv = rd.GetVector<uint8_t>();
      Check(rec.size() == static_cast<size_t>(L * part.recurrent_size()) &&
                conv.size() == static_cast<size_t>(L * part.conv_size()) * esz,
            "tensor-parallel rank " + std::to_string(rank) + " sent states of the wrong size");
      PlaceRecurrentShard(rec.data(), r.final_recurrent.data(), L, full, shard);
      PlaceConvShard(conv.data(), r.final_conv.data(), esz, L, full, shard);
    }
    Check(rd.done(), "tensor-parallel ranks finished different requests");
  }
  return out;
}

// Collective over `dp`: every rank's results at dp rank 0, by id (empty elsewhere).
std::vector<RequestResult> GatherDpResults(Communicator& dp, std::vector<RequestResult> local) {
  if (dp.size() == 1) return local;
  Writer w;
  for (const RequestResult& r : local) {
    w.Put(r.id);
    w.Put(r.cached_tokens);
    w.PutBytes(r.out.data(), r.out.size());
    w.PutBytes(r.final_recurrent.data(), r.final_recurrent.size() * sizeof(float));
    w.PutBytes(r.final_conv.data(), r.final_conv.size());
  }
  const std::vector<std::vector<uint8_t>> parts =
      dp.Gather(w.bytes().data(), static_cast<int64_t>(w.bytes().size()), 0);
  if (dp.rank() != 0) return {};
  std::vector<RequestResult> all;
  for (const std::vector<uint8_t>& part : parts) {
    Reader rd(part);
    while (!rd.done()) {
      RequestResult r;
      r.id = rd.Get<int64_t>();
      r.cached_tokens = rd.Get<int64_t>();
      r.out = rd.GetVector<uint8_t>();
      r.final_recurrent = rd.GetVector<float>();
      r.final_conv = rd.GetVector<uint8_t>();
      all.push_back(std::move(r));
    }
  }
  SortById(all);
  return all;
}

}  // namespace

std::vector<int> AssignRequestsToDpRanks(const std::vector<int64_t>& tokens, int dp_size) {
  Check(dp_size >= 1, "data-parallel size must be >= 1");
  std::vector<int64_t> load(static_cast<size_t>(dp_size), 0);
  std::vector<int> owner;
  owner.reserve(tokens.size());
  for (int64_t t : tokens) {
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner.push_back(r);
    // Every request counts at least one token, so empty requests spread too.
    load[r] += std::max<int64_t>(t, 1);
  }
  return owner;
}

std::vector<float> ExtractRecurrentShard(const float* full, int L, const DeltaRuleGeometry& geometry,
                                         const HeadShard& shard) {
  std::vector<float> out(
      static_cast<size_t>(L * geometry.Shard(shard.begin, shard.count, shard.split).state_spec().recurrent_size()));
  CopyHeads(reinterpret_cast<const uint8_t*>(full), reinterpret_cast<uint8_t*>(out.data()), L, RecurrentParts(geometry),
            geometry.H, sizeof(float), shard, true);
  return out;
}

std::vector<uint8_t> ExtractConvShard(const void* full, size_t elem_size, int L, const DeltaRuleGeometry& geometry,
                                      const HeadShard& shard) {
  std::vector<uint8_t> out(
      static_cast<size_t>(L * geometry.Shard(shard.begin, shard.count, shard.split).state_spec().conv_size()) *
      elem_size);
  CopyHeads(static_cast<const uint8_t*>(full), out.data(), static_cast<int64_t>(L) * (geometry.W - 1),
            ConvParts(geometry), geometry.H, elem_size, shard, true);
  return out;
}

void PlaceRecurrentShard(const float* shard_states, float* full, int L, const DeltaRuleGeometry& geometry,
                         const HeadShard& shard) {
  CopyHeads(reinterpret_cast<const uint8_t*>(shard_states), reinterpret_cast<uint8_t*>(full), L,
            RecurrentParts(geometry), geometry.H, sizeof(float), shard, false);
}

void PlaceConvShard(const void* shard_states, void* full, size_t elem_size, int L, const DeltaRuleGeometry& geometry,
                    const HeadShard& shard) {
  CopyHeads(static_cast<const uint8_t*>(shard_states), static_cast<uint8_t*>(full),
            static_cast<int64_t>(L) * (geometry.W - 1), ConvParts(geometry), geometry.H, elem_size, shard, false);
}

GemmPlan AgreeGemmPlan(Communicator& world) {
  // Each rank's routes (0: its KDA_GEMM_ROUTE is bad) and which routes it can
  // run, gathered as exact small floats so that no rank leaves before the
  // others have answered.
  constexpr GemmRows kRows[] = {GemmRows::kDecode, GemmRows::kBatch, GemmRows::kPrefill};
  constexpr int kFields = kGemmRowClasses + 2;
  const int n = world.size();
  std::string error;
  GemmPlan own;
  try {
    own = ActiveGemmPlan();
  } catch (const Error& e) {
    error = e.what();
  }
  std::vector<float> info(static_cast<size_t>(kFields) * static_cast<size_t>(n), 0.0F);
  // Field f of rank r.
  const auto at = [&](int r, int f) { return info[static_cast<size_t>(r) * kFields + static_cast<size_t>(f)]; };
  float* mine = &info[static_cast<size_t>(kFields) * static_cast<size_t>(world.rank())];
  for (int c = 0; c < kGemmRowClasses; ++c) mine[c] = static_cast<float>(own.For(kRows[c]));
  mine[kGemmRowClasses] = CpuSupportsGemmRoute(GemmRoute::kBf16Dot) ? 1.0F : 0.0F;
  mine[kGemmRowClasses + 1] = CpuSupportsGemmRoute(GemmRoute::kAmx) ? 1.0F : 0.0F;
  if (n > 1) world.AllReduceSum(info.data(), kFields * n);
  for (int r = 0; r < n; ++r) {
    Check(at(r, 0) != 0.0F, [&] {
      return error.empty() ? "the GEMM route of rank " + std::to_string(r) + " is not valid (KDA_GEMM_ROUTE)" : error;
    });
  }
  bool dot_everywhere = true;
  bool tiles_everywhere = true;
  for (int r = 0; r < n; ++r) {
    dot_everywhere = dot_everywhere && at(r, kGemmRowClasses) != 0.0F;
    tiles_everywhere = tiles_everywhere && at(r, kGemmRowClasses + 1) != 0.0F;
  }
  GemmPlan plan;
  for (int c = 0; c < kGemmRowClasses; ++c) {
    auto route = static_cast<GemmRoute>(static_cast<int>(at(0, c)));
    // A route some rank cannot run falls back: the tiles to the bf16 dot, the
    // bf16 dot to fp32 FMAs.
    if (route == GemmRoute::kAmx && !tiles_everywhere) route = GemmRoute::kBf16Dot;
    if (route == GemmRoute::kBf16Dot && !dot_everywhere) route = GemmRoute::kF32Fma;
    plan.At(kRows[c]) = route;
  }
  if (plan != own) SetGemmPlan(plan);
  return plan;
}

ParallelServeResult ServeParallel(const DeltaRuleModel& model, const ParallelGroups& groups,
                                  const std::vector<ServeRequest>& requests, const ParallelServeOptions& options) {
  ValidateServingOptions(options);  // on every rank alike, before the first collective
  AgreeGemmPlan(groups.world());
  const int L = model.num_layers();
  const DeltaRuleGeometry full = model.full_geometry();
  const HeadShard want = MakeHeadShard(full.H, groups.tp_rank(), groups.tp_size(), full.group());
  Check(model.heads.begin == want.begin && model.heads.count == want.count && model.heads.total == want.total &&
            model.heads.split == want.split && model.heads.part == want.part,
        "the model is not this rank's tensor-parallel shard");
  const bool sharded = groups.tp_size() > 1;
  const size_t esz = DTypeSize(model.act_dtype);

  // This rank's share, with its heads' part of any initial state (the
  // storage lives until the scheduler has admitted every request).
  std::vector<int64_t> tokens;
  tokens.reserve(requests.size());
  for (const ServeRequest& r : requests) tokens.push_back(r.length);
  const std::vector<int> owner = AssignRequestsToDpRanks(tokens, groups.dp_size());
  std::vector<ServeRequest> mine;
  std::vector<std::vector<float>> rec_parts;
  std::vector<std::vector<uint8_t>> conv_parts;
  rec_parts.reserve(requests.size());
  conv_parts.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (owner[i] != groups.dp_rank()) continue;
    ServeRequest r = requests[i];
    if (sharded && r.initial_recurrent != nullptr) {
      rec_parts.push_back(ExtractRecurrentShard(r.initial_recurrent, L, full, model.heads));
      r.initial_recurrent = rec_parts.back().data();
    }
    if (sharded && r.initial_conv != nullptr) {
      conv_parts.push_back(ExtractConvShard(r.initial_conv, esz, L, full, model.heads));
      r.initial_conv = conv_parts.back().data();
    }
    mine.push_back(r);
  }

  ParallelServeResult res;
  if (!mine.empty()) {
    // This rank's own pool and prefix cache, over its heads' states: the tensor-parallel ranks of one
    // data-parallel index see the same requests and snapshots of equal size, so they hit and snapshot alike.
    ServingStack stack(model, options, static_cast<int64_t>(mine.size()));
    Scheduler& sched = stack.scheduler();
    for (const ServeRequest& r : mine) sched.Submit(r);
    sched.RunToCompletion();
    res.local = sched.finished();
    SortById(res.local);
    res.steps = sched.steps();
    res.notes = sched.notes();
    res.pool_capacity = stack.capacity();
    res.pool_bytes = stack.pool().total_bytes();
    res.cache_hit_tokens = sched.cache_hit_tokens();
    if (const RadixStateCache* cache = stack.prefix_cache(); cache != nullptr) {
      res.snapshot_bytes_peak = cache->peak_bytes();
    }
  }
  if (options.gather) res.gathered = GatherResults(model, groups, res.local);
  return res;
}

std::vector<RequestResult> GatherResults(const DeltaRuleModel& model, const ParallelGroups& groups,
                                         std::vector<RequestResult> local) {
  SortById(local);
  // Full states at tp rank 0 of each data-parallel index, then those ranks'
  // results (the dp group of tp index 0) at world rank 0.
  std::vector<RequestResult> full = GatherTpStates(groups.tp(), std::move(local), model.num_layers(),
                                                   model.full_geometry(), DTypeSize(model.act_dtype));
  if (groups.tp_rank() != 0) return {};
  return GatherDpResults(groups.dp(), std::move(full));
}

}  // namespace kda
