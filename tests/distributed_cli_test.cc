// `kda run` and `kda bench` under mpirun with --tp / --dp (2 and 4 ranks,
// oversubscribed): world rank 0 writes the same tensors as the one-process
// run (within the design §5 tolerances), over shared memory and over TCP
// (the transport between hosts); the refusals: --tp without mpirun, a
// world size other than tp x dp, heads that --tp does not divide; and faults
// on one rank (KDA_FAULT_INJECT, SIGKILL), which end the whole job promptly.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kda/io/safetensors.h"
#include "tests/cli_util.h"
#include "tests/golden.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::RunKda;

// mpirun with the flags this machine needs (root, 2 cores).
std::string Mpirun() {
  const char* env = std::getenv("KDA_MPIRUN");
  return env != nullptr ? env : "mpirun --allow-run-as-root --oversubscribe";
}

std::string Np(int n, bool tcp = false) {
  return Mpirun() + " -np " + std::to_string(n) + (tcp ? " --mca btl tcp,self" : "");
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class DistCliTest : public testing::CliTestBase {
 protected:
  // `kda run` on a golden case under `launcher`; the output file must match the
  // case's expected tensors.
  void ExpectRunMatches(const std::string& launcher, const std::string& model, const std::string& file,
                        const std::string& flags, bool bf16) {
    const std::string dir = testing::GoldenSetDir(model);
    const std::string in = dir + "/" + file + ".safetensors";
    KDA_REQUIRE_GOLDEN_PATH(in);
    const fs::path out = dir_ / "out.safetensors";
    fs::remove(out);
    const CliResult r = RunKda(launcher, "run --model " + dir + " --input " + in + " --output " + out.string() +
                                             " --dtype " + (bf16 ? "bfloat16" : "float32") + " " + flags);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(CountOf(r.out, "layer 0"), 1) << "only rank 0 reports: " << r.out;
    const SafetensorsFile want = SafetensorsFile::Open(in);
    const SafetensorsFile got = SafetensorsFile::Open(out.string());
    for (const char* name : {"out", "final_recurrent_state", "final_conv_state"}) {
      EXPECT_EQ(got.Get(name).shape, want.Get(std::string(name) == "out" ? "out_fp32" : name).shape) << name;
    }
    testing::ExpectRunOutputMatchesGolden(got, want, bf16);
    if (bf16) {
      const std::vector<float> c = ToFloatVector(got.Get("final_conv_state"));
      // The bf16 conv tail: the same layout and values as one process.
      const fs::path one = dir_ / "one.safetensors";
      const CliResult r1 = RunKda("", "run --model " + dir + " --input " + in + " --output " + one.string() +
                                          " --dtype bfloat16 --kernel reference");
      ASSERT_EQ(r1.status, 0) << r1.err;
      const std::vector<float> c1 = ToFloatVector(SafetensorsFile::Open(one.string()).Get("final_conv_state"));
      EXPECT_TRUE(
          testing::AllCloseBF16(c.data(), c1.data(), ToFloatVector(want.Get("final_conv_state")).data(), c.size()));
    }
  }

  // A refusal: nonzero status within the time limit, `needle` in stderr on
  // `ranks` lines (one per rank), no output file.
  void ExpectRefused(const std::string& launcher, const std::string& args, const std::string& needle, int ranks) {
    const fs::path out = dir_ / "refused.safetensors";
    const bool run = args.rfind("run ", 0) == 0;
    const CliResult r = RunKda(launcher, run ? args + " --output " + out.string() : args);
    EXPECT_GE(r.status, 1) << args;
    EXPECT_LE(r.status, 123) << args << " (124: timed out)";
    EXPECT_EQ(CountOf(r.err, "kda: error: "), ranks) << r.err;
    EXPECT_EQ(CountOf(r.err, needle), ranks) << r.err;
    EXPECT_FALSE(fs::exists(out)) << args;
  }

  const std::string golden_ = testing::GoldenDir();
};

TEST_F(DistCliTest, TensorParallelRunMatchesGolden) {
  ExpectRunMatches(Np(2), "kda-mini", "varlen_initstate", "--tp 2", false);
  ExpectRunMatches(Np(2), "kda-mini", "varlen_initstate", "--tp 2 --kernel reference", true);
  ExpectRunMatches(Np(4), "kda-stress", "stress_varlen_initstate", "--tp 4", false);
  // Gated DeltaNet: Qwen3.5's layout with GVA 3 and K != V, and gates to -55.
  ExpectRunMatches(Np(2), "gdn-gva3", "varlen_initstate", "--tp 2", false);
  ExpectRunMatches(Np(2), "gdn-loud", "loud_varlen_initstate", "--tp 2 --kernel reference", true);
  ExpectRunMatches(Np(4), "gdn-mini", "varlen_initstate", "--tp 4", false);
  // A Mamba2 mixer of two groups: each rank one group of B and C with its heads.
  ExpectRunMatches(Np(2), "mamba2-groups", "varlen_initstate", "--tp 2", false);
  ExpectRunMatches(Np(2), "mamba2-groups", "varlen_initstate", "--tp 2 --kernel reference", true);
  ExpectRunMatches(Np(2), "mamba2-falcon", "varlen_initstate", "--tp 2", false);
}

// More ranks than key heads: each shares one, with a part of its value heads (q and k, B and C whole on
// each); a Mamba2 group's gated norm sums its squares across the ranks sharing it. One group (Nemotron-H's
// and Granite-4.0-H's layout, loud decays; Zamba2's, a head a rank), two groups over four ranks (the norm after and,
// Falcon-H1's, before the gate), a Gated DeltaNet key head's two value heads over two ranks.
TEST_F(DistCliTest, TensorParallelSplitsAKeyHeadsValueHeads) {
  struct Case {
    int ranks;
    const char* set;
    const char* input;
    bool bf16;
    const char* more = "";
  };
  const std::string serve = " --prefill-chunk 7 --decode-last 9 --max-running 1";
  for (const Case& c :
       {Case{2, "mamba2-mini", "varlen_initstate", false},
        Case{2, "mamba2-mini", "varlen_initstate", true, " --kernel reference"},
        Case{2, "mamba2-loud", "loud_varlen_initstate", false}, Case{4, "mamba2-groups", "varlen_initstate", false},
        Case{4, "mamba2-falcon", "varlen_initstate", true}, Case{4, "gdn-loud", "loud_varlen_initstate", false},
        Case{4, "mamba2-zamba", "varlen_initstate", false},  // one head a rank
        // Chunked prefill, decode steps and slot reuse on the split path.
        Case{2, "mamba2-mini", "varlen_initstate", false, serve.c_str()}}) {
    SCOPED_TRACE(std::string(c.set) + " over " + std::to_string(c.ranks) + c.more);
    ExpectRunMatches(Np(c.ranks), c.set, c.input, "--tp " + std::to_string(c.ranks) + c.more, c.bf16);
  }
}

// The variants of the other families (sets from tools/delta_rule_ref.py), each split over two ranks:
// the lower-bound gate (GLM-5 Next under the multimodal prefix; Bailing's full-rank gates and bf16
// gate), OLMo hybrid's separate projections and convs with V = 2K and beta in [0, 2], Lara's fused
// in_proj, Qwen4-Exp's sigmoid output gate.
TEST_F(DistCliTest, TensorParallelRunMatchesGeneratedSets) {
  for (const char* set : {"glm5-mini", "bailing-mini", "olmo-mini", "lara-mini", "qwen4-mini"}) {
    SCOPED_TRACE(set);
    ExpectRunMatches(Np(2), std::string("generated/") + set, "varlen_initstate", "--tp 2", false);
  }
  ExpectRunMatches(Np(2), "generated/bailing-mini", "varlen_initstate", "--tp 2", true);
}

// Chunked prefill, decode steps and fewer slots than sequences, every layout.
TEST_F(DistCliTest, ServingFlagsWorkWithTpAndDp) {
  const std::string serve = " --prefill-chunk 7 --decode-last 9 --max-running 1";
  ExpectRunMatches(Np(2), "kda-mini", "varlen_initstate", "--dp 2" + serve, false);
  ExpectRunMatches(Np(4), "kda-mini", "varlen_initstate", "--tp 2 --dp 2" + serve + " --kernel reference", true);
  ExpectRunMatches(Np(2), "kda-mini", "single_T128", "--dp 2" + serve, false);  // one rank serves nothing
}

// Prefix caching under --tp (each rank caches its heads: the same hits as one
// process) and --dp (each data-parallel rank its own cache: rank 0 serves a
// and its repeat, rank 1 b, which finds nothing): outputs of the computed rows
// and final states as without the cache.
TEST_F(DistCliTest, PrefixCacheWithTpAndDp) {
  const std::string mini = golden_ + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(mini);
  const fs::path in = dir_ / "prefix.safetensors";
  const int64_t T = testing::WritePrefixCacheInput(in.string());
  const std::string base = "run --model " + mini + " --input " + in.string() + " --max-running 1 --prefill-chunk 100";
  const fs::path plain = dir_ / "plain.safetensors";
  ASSERT_EQ(RunKda("", base + " --output " + plain.string()).status, 0);
  const SafetensorsFile want = SafetensorsFile::Open(plain.string());
  const std::vector<float> w = ToFloatVector(want.Get("out"));
  for (const auto& [layout, reused] : {std::pair<std::string, int>{"--tp 2", 556}, {"--dp 2", 300}}) {
    SCOPED_TRACE(layout);
    const fs::path out = dir_ / "cached.safetensors";
    const CliResult r =
        RunKda(Np(2), base + " " + layout + " --prefix-cache --snapshot-interval 64 --output " + out.string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(CountOf(r.out, "prefix cache: " + std::to_string(reused) + " of 980 prompt tokens reused"), 1) << r.out;
    const SafetensorsFile got = SafetensorsFile::Open(out.string());
    const auto* mask = static_cast<const uint8_t*>(got.Get("computed").data);
    const std::vector<float> o = ToFloatVector(got.Get("out"));
    int64_t computed = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (mask[t] == 0) continue;
      ++computed;
      ASSERT_TRUE(testing::AllCloseF32(o.data() + t * 512, w.data() + t * 512, 512)) << "row " << t;
    }
    EXPECT_EQ(computed, T - reused);
    for (const char* state : {"final_recurrent_state", "final_conv_state"}) {
      const std::vector<float> s = ToFloatVector(got.Get(state));
      EXPECT_TRUE(testing::AllCloseStateF32(s.data(), ToFloatVector(want.Get(state)).data(), s.size())) << state;
    }
  }
}

// The transport between hosts: Open MPI forced onto TCP.
TEST_F(DistCliTest, RunsOverTcp) {
  ExpectRunMatches(Np(2, true), "kda-stress", "stress_varlen_initstate", "--tp 2 --prefill-chunk 16", false);
  ExpectRunMatches(Np(4, true), "kda-mini", "varlen_initstate", "--tp 2 --dp 2 --decode-last 9", true);
}

TEST_F(DistCliTest, RefusesLayoutsThatDoNotFit) {
  const std::string mini = golden_ + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(mini);
  const std::string run = "run --model " + mini + " --input " + mini + "/varlen_initstate.safetensors";
  // --tp 2 in one process: refused before MPI starts, one line.
  ExpectRefused("", run + " --tp 2", "not started by mpirun", 1);
  ExpectRefused("", run + " --dp 0", "--dp must be >= 1", 1);
  ExpectRefused("", "bench --tp 2 --requests 2", "mpirun -np 2", 1);
  // World size other than tp x dp: every rank says so and exits.
  ExpectRefused(Np(3), run + " --tp 2", "mpirun started 3 processes", 3);
  ExpectRefused(Np(2), run + " --tp 2 --dp 2", "mpirun started 2 processes", 2);
  ExpectRefused(Np(2), run, "--tp 1 x --dp 1 = 1 ranks", 2);
  // 4 heads over 3 ranks; a Mamba2 mixer's one group of 8 heads over 3.
  ExpectRefused(Np(3), run + " --tp 3", "cannot be split evenly over --tp 3", 3);
  const std::string one_group = testing::GoldenSetDir("mamba2-mini");
  ExpectRefused(Np(3), "run --model " + one_group + " --input " + one_group + "/varlen_initstate.safetensors --tp 3",
                "cannot be split evenly over --tp 3", 3);
  // A problem every rank meets after MPI started.
  ExpectRefused(Np(2), "run --model " + mini + " --input " + (dir_ / "missing.safetensors").string() + " --tp 2",
                "missing.safetensors", 2);
}

// --weights int8 with --tp 2: each rank quantizes its slices; the output equals
// the one-process int8 run (fp32 rule; bf16 rule against it with the fp32 one
// as the exact output), also from a `kda quantize` checkpoint.
TEST_F(DistCliTest, Int8WeightsWithTensorParallelism) {
  const std::string mini = golden_ + "/kda-mini";
  const std::string in = mini + "/varlen_initstate.safetensors";
  KDA_REQUIRE_GOLDEN_PATH(in);
  const std::string q8 = (dir_ / "q8").string();
  ASSERT_EQ(RunKda("", "quantize --model " + mini + " --output " + q8).status, 0);
  auto run = [&](const std::string& launcher, const std::string& model, const std::string& flags,
                 const std::string& name) {
    const fs::path out = dir_ / (name + ".safetensors");
    const CliResult r = RunKda(
        launcher, "run --model " + model + " --input " + in + " --output " + out.string() + " --weights int8 " + flags);
    EXPECT_EQ(r.status, 0) << flags << ": " << r.err;
    return out.string();
  };
  auto tensor = [](const std::string& file, const char* name) {
    return ToFloatVector(SafetensorsFile::Open(file).Get(name));
  };
  const std::string one32 = run("", mini, "--dtype float32", "one32");
  const std::string one16 = run("", mini, "--dtype bfloat16", "one16");
  for (const std::string& model : {mini, q8}) {
    SCOPED_TRACE(model);
    const std::string tp32 = run(Np(2), model, "--tp 2 --dtype float32 --decode-last 9", "tp32");
    const std::string tp16 = run(Np(2), model, "--tp 2 --dtype bfloat16 --decode-last 9", "tp16");
    for (const char* name : {"out", "final_recurrent_state"}) {
      const std::vector<float> x = tensor(one32, name);
      const std::vector<float> a = tensor(tp32, name);
      EXPECT_TRUE(testing::AllCloseF32(a.data(), x.data(), x.size())) << name;
      const std::vector<float> b = tensor(tp16, name);
      EXPECT_TRUE(testing::AllCloseBF16(b.data(), tensor(one16, name).data(), x.data(), x.size())) << name;
    }
  }
}

// bench --tp 2 reports per-rank state bytes and the all-reduce time share.
TEST_F(DistCliTest, BenchReportsPerRankStateAndAllReduceShare) {
  const std::string mini = golden_ + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(mini);
  const CliResult r = RunKda(Np(2), "bench --tp 2 --model " + mini +
                                        " --requests 3 --min-prompt 5 --max-prompt 40 --decode-steps 3 --layers 2 "
                                        "--prefill-chunk 16 --json");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("all-reduce share"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("state MiB/req"), std::string::npos) << r.out;
  std::string last;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);) {
    if (!line.empty()) last = line;
  }
  for (const char* key : {"\"tp\": 2", "\"dp\": 1", "\"rank_state_bytes_per_request\"", "\"allreduce_time_share\"",
                          "\"self_check_max_ratio\"", "\"requests\": 3", "\"layers\": 2"}) {
    EXPECT_NE(last.find(key), std::string::npos) << key << " in " << last;
  }
  // Each rank holds half the heads: half the state bytes per request.
  const auto number_after = [&](const std::string& key) {
    const size_t at = last.find("\"" + key + "\": ");
    return at == std::string::npos ? -1.0 : std::stod(last.substr(at + key.size() + 4));
  };
  EXPECT_EQ(number_after("rank_state_bytes_per_request") * 2, number_after("state_bytes_per_request"));
  const double share = number_after("allreduce_time_share");
  EXPECT_GT(share, 0.0);
  EXPECT_LT(share, 1.0);
  const double ratio = number_after("self_check_max_ratio");
  EXPECT_LE(ratio, 1.0);
  EXPECT_GT(ratio, 0.0);
  // Data parallel too: the requests split, both ranks' self-checks pass.
  const CliResult d =
      RunKda(Np(2), "bench --dp 2 --model " + mini +
                        " --requests 3 --min-prompt 5 --max-prompt 40 --decode-steps 3 --layers 1 --json");
  ASSERT_EQ(d.status, 0) << d.err << d.out;
  EXPECT_NE(d.out.find("\"dp\": 2"), std::string::npos) << d.out;
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

// ------------------------------------------------------------------ faults

// What a job with a fault on one rank did, and how long it took.
struct FaultRun {
  testing::CliResult r;
  double seconds = 0.0;
};

class DistFaultTest : public DistCliTest {
 protected:
  // `kda args` under `ranks` processes with KDA_FAULT_INJECT=spec. The limit
  // (60 s) is well above the 30 s the job must end in, so a hang fails here
  // as status 124 instead of blocking the suite.
  FaultRun RunWithFault(int ranks, const std::string& spec, const std::string& args) {
    const auto t0 = std::chrono::steady_clock::now();
    FaultRun f;
    f.r = RunKda("env KDA_FAULT_INJECT=" + spec + " " + Np(ranks), args, 60);
    f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return f;
  }

  // `kda run` of kda-mini under `ranks` processes with `flags` and a fault.
  FaultRun RunMiniWithFault(int ranks, const std::string& spec, const std::string& flags) {
    const std::string mini = golden_ + "/kda-mini";
    return RunWithFault(ranks, spec,
                        "run --model " + mini + " --input " + mini + "/varlen_initstate.safetensors --output " +
                            (dir_ / "fault.safetensors").string() + " --prefill-chunk 7 --decode-last 9 " + flags);
  }

  // Non-zero status, well within 30 s, exactly one error line, from `rank`,
  // holding `needle`; no output file.
  void ExpectEndedByRank(const FaultRun& f, int rank, const std::string& needle) {
    EXPECT_NE(f.r.status, 0) << f.r.err;
    EXPECT_NE(f.r.status, 124) << "timed out: " << f.r.err;
    EXPECT_LT(f.seconds, 30.0) << f.r.err;
    EXPECT_EQ(CountOf(f.r.err, "kda: "), 1) << f.r.err;
    const std::string line = "kda: error: rank " + std::to_string(rank) + ": ";
    const size_t at = f.r.err.find(line);
    ASSERT_NE(at, std::string::npos) << f.r.err;
    const std::string text = f.r.err.substr(at, f.r.err.find('\n', at) - at);
    EXPECT_NE(text.find(needle), std::string::npos) << text;
    EXPECT_FALSE(fs::exists(dir_ / "fault.safetensors"));
  }
};

// A shard that one rank fails to read: agreed, so every rank stops cleanly;
// only the failing rank speaks, and the job's status is 1.
TEST_F(DistFaultTest, LoadFailureOnOneRank) {
  KDA_REQUIRE_GOLDEN_PATH(golden_ + "/kda-mini");
  const FaultRun f = RunMiniWithFault(2, "rank:1,at:load", "--tp 2");
  ExpectEndedByRank(f, 1, "fault injected by KDA_FAULT_INJECT (at:load on rank 1)");
  EXPECT_EQ(f.r.status, 1) << f.r.err;
  const FaultRun d = RunMiniWithFault(4, "rank:2,at:load", "--tp 2 --dp 2");
  ExpectEndedByRank(d, 2, "at:load on rank 2");
}

// An error inside a layer forward while the other tp rank waits in that
// layer's all-reduce: the failing rank aborts the job.
TEST_F(DistFaultTest, ForwardFailureMidRun) {
  KDA_REQUIRE_GOLDEN_PATH(golden_ + "/kda-mini");
  ExpectEndedByRank(RunMiniWithFault(2, "rank:1,at:forward", "--tp 2"), 1, "at:forward on rank 1");
  // Late in the run (the 6th layer forward), and on the root.
  ExpectEndedByRank(RunMiniWithFault(2, "rank:0,at:forward,skip:5", "--tp 2"), 0, "at:forward on rank 0");
  // Data parallel: the other rank waits in the results gather.
  ExpectEndedByRank(RunMiniWithFault(2, "rank:1,at:forward", "--dp 2"), 1, "at:forward on rank 1");
  // The serving benchmark alike.
  const std::string mini = golden_ + "/kda-mini";
  ExpectEndedByRank(RunWithFault(2, "rank:1,at:forward,skip:3",
                                 "bench --tp 2 --model " + mini +
                                     " --requests 3 --min-prompt 5 --max-prompt 40 --decode-steps 3 --layers 2"),
                    1, "at:forward on rank 1");
}

// The state pool of one rank cannot be allocated: a clear error, the job ends.
TEST_F(DistFaultTest, AllocationFailureOnOneRank) {
  KDA_REQUIRE_GOLDEN_PATH(golden_ + "/kda-mini");
  const FaultRun f = RunMiniWithFault(2, "rank:1,at:alloc", "--tp 2");
  ExpectEndedByRank(f, 1, "state pool: cannot allocate");
  EXPECT_NE(f.r.err.find("out of memory"), std::string::npos) << f.r.err;
}

// A rank killed mid-run (SIGKILL to itself between layer forwards): Open MPI
// ends the job; the dead rank says nothing, the others neither.
TEST_F(DistFaultTest, RankKilledMidRun) {
  KDA_REQUIRE_GOLDEN_PATH(golden_ + "/kda-mini");
  const FaultRun f = RunMiniWithFault(2, "rank:1,at:kill", "--tp 2");
  EXPECT_NE(f.r.status, 0) << f.r.err;
  EXPECT_NE(f.r.status, 124) << "timed out: " << f.r.err;
  EXPECT_LT(f.seconds, 30.0) << f.r.err;
  EXPECT_EQ(CountOf(f.r.err, "kda: "), 0) << f.r.err;
  EXPECT_FALSE(fs::exists(dir_ / "fault.safetensors"));
}

// A malformed switch is refused by every rank, never ignored.
TEST_F(DistFaultTest, MalformedSwitchIsRefused) {
  KDA_REQUIRE_GOLDEN_PATH(golden_ + "/kda-mini");
  const FaultRun f = RunMiniWithFault(2, "rank:1,at:everywhere", "--tp 2");
  EXPECT_EQ(f.r.status, 1) << f.r.err;
  EXPECT_EQ(CountOf(f.r.err, "kda: error: rank "), 2) << f.r.err;
  EXPECT_EQ(CountOf(f.r.err, "KDA_FAULT_INJECT: bad entry 'at:everywhere'"), 2) << f.r.err;
}

}  // namespace
}  // namespace kda
