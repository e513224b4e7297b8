// kda._core layer and engine: one delta-rule layer of a checkpoint (Kimi-Linear's
// KDA, Qwen3-Next's or Qwen3.5's Gated DeltaNet: the family comes from
// config.json's model_type) over a packed batch (Layer), the serving loop over
// every delta-rule layer (Engine: the state pool, model runner and scheduler),
// and a checkpoint's parsed config (model_config). Outputs are returned as
// numpy arrays owning C++ memory; bf16 ones as uint16 bit views
// (kda/_arrays.py views them as ml_dtypes.bfloat16). Computation runs without
// the GIL; kda::Error becomes ValueError (module.cc).
//
// States per sequence and layer (H key heads of K, HV value heads of V, conv
// width W): recurrent [HV, K, V] fp32 (K-major per value head), conv tail
// [W-1, C] in the activation dtype, C = 2*H*K + HV*V channels q|k|v (the raw
// projections before the conv and SiLU, oldest row first); a Mamba2 mixer's
// (DeltaRuleGeometry::ssd): recurrent [H, P, N_state] (transformers' cache),
// conv channels x|B|C.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kda/io/config.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/q8.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/mem_cache/recurrent_state_spec.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/serving/model_runner.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/seeded_drafts.h"
#include "kda/serving/serving_stack.h"
#include "python/src/array_util.h"
#include "python/src/bindings.h"

namespace kda::python {
namespace {

using NumpyArray = nb::ndarray<nb::numpy>;

// A numpy array owning `bytes` (moved), of `shape` and element type `dtype`
// (BF16 as uint16).
NumpyArray ToNumpy(std::vector<uint8_t>&& bytes, const std::vector<int64_t>& shape, DType dtype) {
  auto* owned = new std::vector<uint8_t>(std::move(bytes));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  std::vector<size_t> s(shape.begin(), shape.end());
  nb::dlpack::dtype dt = dtype == DType::kBF16 ? nb::dtype<uint16_t>() : nb::dtype<float>();
  return NumpyArray(owned->data(), s.size(), s.data(), owner, nullptr, dt);
}

NumpyArray ToNumpy(std::vector<float>&& values, const std::vector<int64_t>& shape) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return ToNumpy(std::move(bytes), shape, DType::kF32);
}

// An activation array: the model's dtype, on the CPU, C-contiguous, of `shape`.
const void* CheckAct(const InArray& a, DType act, const std::vector<int64_t>& shape, const char* name,
                     const char* layout) {
  RequireNdim(a, shape.size(), name, layout);
  RequireShape(a, shape, name, layout);
  RequireDType(a, act, name);
  RequireCpuContiguous(a, name);
  return a.data();
}

const float* CheckF32(const InArray& a, const std::vector<int64_t>& shape, const char* name, const char* layout) {
  return static_cast<const float*>(CheckAct(a, DType::kF32, shape, name, layout));
}

// One delta-rule layer of a checkpoint, of any supported model type.
// The recurrent state's layout in messages: [N, HV, K, V], or a Mamba2 mixer's [N, H, P, N_state]
// (transformers' cache: value heads, head dim, state size).
const char* StateLayout(const DeltaRuleGeometry& g, const char* lead) {
  if (g.ssd) return std::string(lead) == "N" ? "[N, H, P, N_state]" : "[L, H, P, N_state]";
  return std::string(lead) == "N" ? "[N, HV, K, V]" : "[L, HV, K, V]";
}

class Layer {
 public:
  Layer(const std::string& path, int layer, const std::string& dtype, const std::string& kernel,
        const std::string& weights)
      : kernel_(ParseKernelImpl(kernel)) {
    const DType act = ParseActivationDType(dtype);
    const WeightFormat format = ParseWeightFormat(weights);
    nb::gil_scoped_release release;
    model_ = DeltaRuleModel::Load(path, act, layer, nullptr, format);
  }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // (out [T, hidden], final_recurrent_state [N, HV, K, V] fp32, final_conv_state [N, W-1, C]).
  std::tuple<NumpyArray, NumpyArray, NumpyArray> Forward(const InArray& x, const InArray& cu_seqlens,
                                                         const std::optional<InArray>& init_rec,
                                                         const std::optional<InArray>& init_conv) const {
    const DeltaRuleGeometry& s = model_.geometry;
    const DType act = model_.act_dtype;
    const size_t esize = DTypeSize(act);
    RequireNdim(x, 2, "hidden_states", "[T, hidden]");
    const int64_t T = static_cast<int64_t>(x.shape(0));
    const void* xd = CheckAct(x, act, {T, s.hidden}, "hidden_states", "[T, hidden]");
    RequireDType(cu_seqlens, DType::kI64, "cu_seqlens");
    RequireCpuContiguous(cu_seqlens, "cu_seqlens");
    RequireNdim(cu_seqlens, 1, "cu_seqlens", "[N + 1]");
    const int64_t N = static_cast<int64_t>(cu_seqlens.shape(0)) - 1;
    if (N < 1) throw nb::value_error("cu_seqlens: expected shape [N + 1] with N >= 1, got [0]");
    const auto* cu = static_cast<const int64_t*>(cu_seqlens.data());
    if (cu[0] != 0) throw nb::value_error(("cu_seqlens[0] must be 0, got " + std::to_string(cu[0])).c_str());
    for (int64_t n = 0; n < N; ++n) {
      if (cu[n + 1] < cu[n]) {
        throw nb::value_error(("cu_seqlens must be non-decreasing, but cu_seqlens[" + std::to_string(n + 1) +
                               "] = " + std::to_string(cu[n + 1]) + " < cu_seqlens[" + std::to_string(n) +
                               "] = " + std::to_string(cu[n]))
                                  .c_str());
      }
    }
    if (cu[N] != T) {
      throw nb::value_error(
          ("cu_seqlens[N] must equal T = " + std::to_string(T) + " (hidden_states' rows), got " + std::to_string(cu[N]))
              .c_str());
    }
    const RecurrentStateSpec spec = s.state_spec();
    const int64_t rs = spec.recurrent_size();
    const int64_t cs = spec.conv_size();
    const auto dims = s.state_dims();
    const std::vector<int64_t> rec_shape = {N, dims[0], dims[1], dims[2]};
    const std::vector<int64_t> conv_shape = {N, s.W - 1, s.conv_channels()};
    const float* rec0 =
        init_rec ? CheckF32(*init_rec, rec_shape, "initial_recurrent_state", StateLayout(s, "N")) : nullptr;
    const void* conv0 =
        init_conv ? CheckAct(*init_conv, act, conv_shape, "initial_conv_state", "[N, W-1, C]") : nullptr;

    std::vector<uint8_t> out(static_cast<size_t>(T * s.hidden) * esize);
    std::vector<float> rec(static_cast<size_t>(N * rs));
    std::vector<uint8_t> conv(static_cast<size_t>(N * cs) * esize);
    {
      nb::gil_scoped_release release;
      // One EXTEND step of the packed batch through a server of N slots.
      ServingOptions options;
      options.kernel = kernel_;
      ServingStack stack(model_, options, N);
      RecurrentStatePool& pool = stack.pool();
      HybridReqToTokenPool& req_pool = stack.req_pool();
      const bool seeded = rec0 != nullptr || conv0 != nullptr;
      const std::vector<float> zero_rec(seeded && rec0 == nullptr ? rs : 0, 0.0F);
      const std::vector<uint8_t> zero_conv(seeded && conv0 == nullptr ? cs * esize : 0, 0);
      ForwardBatch batch;
      batch.mode = ForwardMode::kExtend;
      for (int64_t n = 0; n < N; ++n) {
        const int32_t slot = req_pool.Alloc(n);
        if (seeded) {
          pool.SetLayerState(0, slot, rec0 != nullptr ? rec0 + n * rs : zero_rec.data(),
                             conv0 != nullptr ? static_cast<const uint8_t*>(conv0) + n * cs * esize : zero_conv.data());
        }
        batch.req_ids.push_back(n);
        batch.req_pool_indices.push_back(slot);
        batch.extend_lens.push_back(cu[n + 1] - cu[n]);
        batch.prefix_lens.push_back(0);
        batch.state_seeded.push_back(seeded ? 1 : 0);
      }
      stack.runner().ForwardLayer(0, batch, {xd, act}, {out.data(), act});
      for (int64_t n = 0; n < N; ++n) {
        pool.GetLayerState(0, req_pool.SlotOf(n), rec.data() + n * rs, conv.data() + n * cs * esize);
      }
    }
    return {ToNumpy(std::move(out), {T, s.hidden}, act), ToNumpy(std::move(rec), rec_shape),
            ToNumpy(std::move(conv), conv_shape, act)};
  }

  const DeltaRuleModel& model() const { return model_; }

 private:
  KernelImpl kernel_;
  DeltaRuleModel model_;
};

// The serving loop over every delta-rule layer of a checkpoint.
class Engine {
 public:
  Engine(const std::string& path, const std::string& dtype, int64_t max_running, int64_t prefill_chunk,
         int64_t step_token_budget, const std::string& kernel, const std::string& weights, int64_t max_draft_tokens,
         const std::string& verify_method, int64_t state_budget_bytes, int64_t prefix_cache_bytes,
         int64_t snapshot_interval) {
    const DType act = ParseActivationDType(dtype);
    const WeightFormat format = ParseWeightFormat(weights);
    ServingOptions options;
    options.scheduler.max_running = max_running;
    options.scheduler.prefill_chunk = prefill_chunk;
    options.scheduler.step_token_budget = step_token_budget;
    options.scheduler.snapshot_interval = snapshot_interval;
    options.state_budget_bytes = state_budget_bytes;
    options.prefix_cache_bytes = prefix_cache_bytes;
    options.verify = {.max_draft_tokens = max_draft_tokens, .method = ParseVerifyMethod(verify_method)};
    options.kernel = ParseKernelImpl(kernel);
    ValidateServingOptions(options);  // before the checkpoint is read
    nb::gil_scoped_release release;
    model_ = std::make_unique<DeltaRuleModel>(DeltaRuleModel::Load(path, act, std::nullopt, nullptr, format));
    // Requests come over time: max_running (or, at 0, the state budget) sizes the pool.
    stack_ = std::make_unique<ServingStack>(*model_, options);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // draft(committed, max_k) -> rows [k, hidden] or None, accept(committed, k,
  // out [1 + k, hidden]) -> a (None: all accepted), or seeded = (k, alpha,
  // seed): SeededDraftSource. The callables are called with the GIL held.
  void Submit(int64_t id, const InArray& x, int64_t decode_tokens, const std::optional<InArray>& init_rec,
              const std::optional<InArray>& init_conv, const std::optional<nb::callable>& draft,
              const std::optional<nb::callable>& accept,
              const std::optional<std::tuple<int64_t, double, uint64_t>>& seeded,
              const std::optional<InArray>& token_ids) {
    const DeltaRuleGeometry& s = model_->geometry;
    const DType act = model_->act_dtype;
    const int64_t L = model_->num_layers();
    RequireNdim(x, 2, "hidden_states", "[T, hidden]");
    const int64_t T = static_cast<int64_t>(x.shape(0));
    if (T < 1) throw nb::value_error("hidden_states: a request needs at least one token, got T = 0");
    if (decode_tokens < 0) {
      throw nb::value_error(("decode_tokens must be >= 0, got " + std::to_string(decode_tokens)).c_str());
    }
    ServeRequest r;
    r.id = id;
    r.input = {CheckAct(x, act, {T, s.hidden}, "hidden_states", "[T, hidden]"), act};
    r.length = T;
    r.decode_tokens = decode_tokens;
    if (init_rec) {
      const auto dims = s.state_dims();
      r.initial_recurrent =
          CheckF32(*init_rec, {L, dims[0], dims[1], dims[2]}, "initial_recurrent_state", StateLayout(s, "L"));
    }
    if (init_conv) {
      r.initial_conv = CheckAct(*init_conv, act, {L, s.W - 1, s.conv_channels()}, "initial_conv_state", "[L, W-1, C]");
    }
    if (token_ids) {
      // The prefix cache's key: int32 [T] that determine the rows.
      RequireDType(*token_ids, DType::kI32, "token_ids");
      RequireCpuContiguous(*token_ids, "token_ids");
      RequireShape(*token_ids, {T}, "token_ids", "[T]");
      r.token_ids = static_cast<const int32_t*>(token_ids->data());
    }
    if (draft && seeded) throw nb::value_error("pass a draft callback or seeded drafts, not both");
    if (accept && !draft) throw nb::value_error("accept needs a draft callback");
    if (seeded) {
      const auto [k, alpha, seed] = *seeded;
      r.draft = SeededDraftSource(r.input, s.hidden, k, alpha, seed);
    }
    if (draft) {
      // Handles, not owners: the scheduler copies requests without the GIL; inputs_ keeps the callables alive.
      const nb::handle propose_fn = *draft;
      const size_t row = static_cast<size_t>(s.hidden) * DTypeSize(act);
      // The drafts' ids are left at -1: accepted drafts stand for the request's own next rows and ids.
      r.draft.propose = [propose_fn, act, hidden = s.hidden](int64_t committed, int64_t max_k, void* rows,
                                                             int32_t* /*ids*/) {
        const nb::gil_scoped_acquire gil;
        try {
          // The callable (kda/_model.py's wrapper) writes its rows into `out` and returns how many.
          const size_t shape[2] = {static_cast<size_t>(max_k), static_cast<size_t>(hidden)};
          const nb::dlpack::dtype dt = act == DType::kBF16 ? nb::dtype<uint16_t>() : nb::dtype<float>();
          const NumpyArray out(rows, 2, shape, nb::handle(), nullptr, dt);
          // A view, not a copy (the array has no owner): valid during the call only.
          const auto k = nb::cast<int64_t>(propose_fn(committed, max_k, nb::cast(out, nb::rv_policy::reference)));
          Check(k >= 0 && k <= max_k,
                "the draft callback gave " + std::to_string(k) + " rows, expected 0.." + std::to_string(max_k));
          return k;
        } catch (const nb::python_error& e) {
          throw Error(std::string("the draft callback raised: ") + e.what());
        } catch (const nb::cast_error&) {
          throw Error("the draft callback's wrapper must return an int");
        }
      };
      if (accept) {
        const nb::handle accept_fn = *accept;
        r.draft.accept = [accept_fn, act, hidden = s.hidden, row](int64_t committed, int64_t k, const void* out) {
          const nb::gil_scoped_acquire gil;
          try {
            const auto* p = static_cast<const uint8_t*>(out);
            NumpyArray rows =
                ToNumpy(std::vector<uint8_t>(p, p + static_cast<size_t>(1 + k) * row), {1 + k, hidden}, act);
            return nb::cast<int64_t>(accept_fn(committed, k, rows));
          } catch (const nb::python_error& e) {
            throw Error(std::string("the accept callback raised: ") + e.what());
          } catch (const nb::cast_error&) {
            throw Error("the accept callback must return an int");
          }
        };
      }
    }
    stack_->scheduler().Submit(r);
    // The scheduler reads the arrays in place: they are kept until the request ends.
    inputs_[id] = {x, init_rec, init_conv, token_ids, draft, accept};
  }

  // Runs every submitted request to its end: ([(id, out, final_recurrent, final_conv, cached_tokens)],
  // [(id, error)]).
  std::tuple<std::vector<std::tuple<int64_t, NumpyArray, NumpyArray, NumpyArray, int64_t>>,
             std::vector<std::tuple<int64_t, std::string>>>
  Run() {
    std::optional<std::string> error;
    {
      nb::gil_scoped_release release;
      try {
        stack_->scheduler().RunToCompletion();
      } catch (const Error& e) {
        error = e.what();
      }
    }
    const DeltaRuleGeometry& s = model_->geometry;
    const DType act = model_->act_dtype;
    const int64_t L = model_->num_layers();
    std::vector<std::tuple<int64_t, NumpyArray, NumpyArray, NumpyArray, int64_t>> done;
    for (RequestResult& r : stack_->scheduler().TakeFinished()) {
      const int64_t T = static_cast<int64_t>(r.out.size() / DTypeSize(act) / s.hidden);
      done.emplace_back(
          r.id, ToNumpy(std::move(r.out), {T, s.hidden}, act),
          ToNumpy(std::move(r.final_recurrent), {L, s.state_dims()[0], s.state_dims()[1], s.state_dims()[2]}),
          ToNumpy(std::move(r.final_conv), {L, s.W - 1, s.conv_channels()}, act), r.cached_tokens);
      inputs_.erase(r.id);
    }
    std::vector<std::tuple<int64_t, std::string>> failed;
    for (FailedRequest& f : stack_->scheduler().TakeFailed()) {
      failed.emplace_back(f.id, f.error);
      inputs_.erase(f.id);
    }
    if (error && done.empty() && failed.empty()) throw Error(*error);
    return {std::move(done), std::move(failed)};
  }

  const DeltaRuleModel& model() const { return *model_; }
  int64_t num_waiting() const { return stack_->scheduler().num_waiting(); }
  int64_t num_running() const { return stack_->scheduler().num_running(); }
  int64_t pool_capacity() const { return stack_->capacity(); }
  int64_t pool_bytes() const { return stack_->pool().total_bytes(); }

 private:
  struct Kept {
    InArray x;
    std::optional<InArray> rec, conv, ids;
    std::optional<nb::callable> draft, accept;
  };
  // Destroyed in reverse: the server first, the model last.
  std::unique_ptr<DeltaRuleModel> model_;
  std::unique_ptr<ServingStack> stack_;
  std::map<int64_t, Kept> inputs_;
};

// The model's family and geometry (KDA: num_heads = num_k_heads = num_v_heads, head_dim = head_k_dim =
// head_v_dim; num_heads and head_dim are the key heads' in every family).
template <class C>
void ShapeProperties(nb::class_<C>& c) {
  c.def_prop_ro("model_type", [](const C& l) { return l.model().model_type; });
  c.def_prop_ro("layer_class", [](const C& l) { return l.model().family().layer_class; });
  c.def_prop_ro("hidden_size", [](const C& l) { return l.model().geometry.hidden; });
  c.def_prop_ro("num_heads", [](const C& l) { return l.model().geometry.H; });
  c.def_prop_ro("head_dim", [](const C& l) { return l.model().geometry.K; });
  c.def_prop_ro("num_k_heads", [](const C& l) { return l.model().geometry.H; });
  c.def_prop_ro("num_v_heads", [](const C& l) { return l.model().geometry.HV; });
  c.def_prop_ro("head_k_dim", [](const C& l) { return l.model().geometry.K; });
  c.def_prop_ro("head_v_dim", [](const C& l) { return l.model().geometry.V; });
  c.def_prop_ro("conv_size", [](const C& l) { return l.model().geometry.W; });
  c.def_prop_ro("dtype", [](const C& l) { return std::string(ActivationDTypeName(l.model().act_dtype)); });
  c.def_prop_ro("weights", [](const C& l) { return std::string(WeightFormatName(l.model().weights_format)); });
  c.def_prop_ro("num_layers", [](const C& l) { return l.model().num_layers(); });
  c.def_prop_ro("layer_ids", [](const C& l) { return l.model().model_layer_ids; });
}

// config.json of a checkpoint directory as kda reads it (kda::LoadModelConfig): the text model's
// model_type, its family (the family's first model type) and layer class, and the delta-rule layers'
// geometry and variant settings (decay width, output gate, gate lower bound or None, beta scale, the gated
// norm's eps); linear_layers 0-based.
nb::dict ModelConfigDict(const std::string& path) {
  const ModelConfig c = LoadModelConfig(path);
  const LayerFamily& family = LayerFamilyFor(c.model_type);
  nb::dict d;
  d["model_type"] = c.model_type;
  d["family"] = family.name();
  d["layer_class"] = family.layer_class;
  d["hidden_size"] = c.hidden_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_k_heads"] = c.num_k_heads;
  d["num_v_heads"] = c.num_v_heads;
  d["head_k_dim"] = c.head_k_dim;
  d["head_v_dim"] = c.head_v_dim;
  d["conv_size"] = c.conv_size;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["linear_layers"] = c.linear_layers;
  // The layer's variant settings, as the family derives them from the config.
  const DeltaRuleGeometry g = family.geometry(c);
  d["decay"] = g.decay == DecayWidth::kPerKeyDim ? "per_key_dim" : "per_value_head";
  d["output_gate"] = GateActivationName(g.output_gate);
  d["gate_lower_bound"] = g.gate_lower_bound < 0.0F ? nb::cast(g.gate_lower_bound) : nb::none();
  d["beta_scale"] = g.beta_scale;
  d["norm_eps"] = g.rms_norm_eps;
  return d;
}

}  // namespace

void BindModel(nb::module_& m) {
  m.def("model_config", &ModelConfigDict, nb::arg("path"));
  // The layer families of the registry (kda/models/layer_family.h), kimi_linear first: the family's name (its
  // first model type), every model type it serves, its transformers class and a sentence on its layout.
  m.def("layer_families", [] {
    nb::list out;
    for (const LayerFamily& f : LayerFamilies()) {
      nb::dict d;
      d["name"] = f.name();
      nb::list types;
      for (const ModelTypeName& t : f.model_types) types.append(t.name);
      d["model_types"] = types;
      d["layer_class"] = f.layer_class;
      d["description"] = f.description;
      out.append(d);
    }
    return out;
  });

  nb::class_<Layer> layer(m, "Layer");
  layer.def(nb::init<const std::string&, int, const std::string&, const std::string&, const std::string&>(),
            nb::arg("path"), nb::arg("layer"), nb::arg("dtype"), nb::arg("kernel"), nb::arg("weights"));
  layer.def("forward", &Layer::Forward, nb::arg("hidden_states"), nb::arg("cu_seqlens"),
            nb::arg("initial_recurrent_state").none(), nb::arg("initial_conv_state").none());
  ShapeProperties(layer);

  nb::class_<Engine> engine(m, "Engine");
  engine.def(nb::init<const std::string&, const std::string&, int64_t, int64_t, int64_t, const std::string&,
                      const std::string&, int64_t, const std::string&, int64_t, int64_t, int64_t>(),
             nb::arg("path"), nb::arg("dtype"), nb::arg("max_running"), nb::arg("prefill_chunk"),
             nb::arg("step_token_budget"), nb::arg("kernel"), nb::arg("weights"), nb::arg("max_draft_tokens"),
             nb::arg("verify_method"), nb::arg("state_budget_bytes"), nb::arg("prefix_cache_bytes"),
             nb::arg("snapshot_interval"));
  engine.def("submit", &Engine::Submit, nb::arg("id"), nb::arg("hidden_states"), nb::arg("decode_tokens"),
             nb::arg("initial_recurrent_state").none(), nb::arg("initial_conv_state").none(), nb::arg("draft").none(),
             nb::arg("accept").none(), nb::arg("seeded").none(), nb::arg("token_ids").none());
  engine.def("run", &Engine::Run);
  engine.def_prop_ro("num_waiting", &Engine::num_waiting);
  engine.def_prop_ro("num_running", &Engine::num_running);
  engine.def_prop_ro("pool_capacity", &Engine::pool_capacity);
  engine.def_prop_ro("pool_bytes", &Engine::pool_bytes);
  ShapeProperties(engine);
}

}  // namespace kda::python
