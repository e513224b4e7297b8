// The CLI end to end: `kda run` on golden inputs writes the expected tensors;
// bad input exits 1..125 with one line on stderr and writes no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/io/safetensors.h"
#include "tests/checkpoint_util.h"
#include "tests/cli_util.h"
#include "tests/golden.h"
#include "tests/json_nesting.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;

CliResult RunCli(const std::string& args) { return testing::RunKda("", args); }

// A benchmark run that succeeded, with its last JSON line.
struct BenchRun {
  CliResult r;
  std::string last;
  bool Has(const std::string& text) const { return last.find(text) != std::string::npos; }
  // The number after "key": (a failure, and 0, when the line has no such field).
  double Number(const std::string& key) const {
    const size_t at = last.find("\"" + key + "\": ");
    EXPECT_NE(at, std::string::npos) << key << " in " << last;
    return at == std::string::npos ? 0.0 : std::stod(last.substr(at + key.size() + 4));
  }
};

// Runs `kda ARGS` (for ASSERT_NO_FATAL_FAILURE): it must succeed and print a JSON line.
void RunBench(const std::string& args, BenchRun* run) {
  run->r = RunCli(args);
  ASSERT_EQ(run->r.status, 0) << run->r.err;
  const size_t at = run->r.out.rfind('{');
  ASSERT_NE(at, std::string::npos) << run->r.out;
  run->last = run->r.out.substr(at);
}

class CliTest : public testing::CliTestBase {
 protected:
  // Expects a clean refusal: status in [1, 125], one stderr line containing
  // `needle`, no output file.
  void ExpectRefused(const std::string& args, const std::string& needle, bool with_output = true) {
    const fs::path out = dir_ / "out.safetensors";
    const CliResult r = RunCli(args + (with_output ? " --output " + out.string() : ""));
    EXPECT_GE(r.status, 1) << args;
    EXPECT_LE(r.status, 125) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
    EXPECT_FALSE(fs::exists(out)) << args;
    fs::remove(out);  // keep one failure from masking the next case
    for (const auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "leftover " << e.path();
    }
  }

  const std::string mini_ = testing::GoldenDir() + "/kda-mini";
};

// Runs `prefix kda run` on the golden case `in` (its model is the golden
// directory that holds it), in both pipelines, and checks the written tensors
// against the golden ones. Returns what the runs printed (each names the
// kernel that ran).
std::string ExpectRunMatchesGolden(const std::string& prefix, const std::string& in, const fs::path& dir) {
  const SafetensorsFile want = SafetensorsFile::Open(in);
  std::string printed;
  for (const std::string dtype : {"float32", "bfloat16"}) {
    SCOPED_TRACE(prefix + " " + dtype);
    const fs::path out = dir / ("out_" + dtype + ".safetensors");
    const CliResult r = testing::RunKda(prefix, "run --model " + in.substr(0, in.rfind('/')) + " --input " + in +
                                                    " --output " + out.string() + " --dtype " + dtype + " --threads 2");
    EXPECT_EQ(r.status, 0) << r.err;
    if (r.status != 0) continue;
    printed += r.out;
    const SafetensorsFile got = SafetensorsFile::Open(out.string());
    EXPECT_EQ(got.Get("final_conv_state").shape, want.Get("final_conv_state").shape);
    testing::ExpectRunOutputMatchesGolden(got, want, dtype == "bfloat16");
  }
  return printed;
}

TEST_F(CliTest, RunMatchesGoldenFp32AndBf16) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  ExpectRunMatchesGolden("", mini_ + "/varlen_initstate.safetensors", dir_);
}

// Any x86-64 CPU: on an emulated CPU without AVX-512 (Haswell: AVX2 + FMA) and
// on a baseline x86-64 CPU (qemu64: SSE2 only), the program picks the AVX2 and
// generic kernels by itself (no KDA_ISA) and gives the golden results; an
// instruction the CPU lacks would end it with SIGILL. Emulation (Debian's
// qemu-user) is slow, so this runs the smallest multi-token case.
TEST_F(CliTest, RunsOnCpusWithoutAvx512) {
#ifdef KDA_SANITIZED
  GTEST_SKIP() << "sanitizer runtimes do not run under qemu-user; the plain build runs this test";
#endif
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  ASSERT_EQ(std::system("command -v qemu-x86_64 >/dev/null 2>&1"), 0)
      << "qemu-x86_64 not found: scripts/install-deps.sh installs qemu-user";
  const std::pair<const char*, const char*> cpus[] = {{"Haswell", "optimized/avx2"}, {"qemu64", "optimized/generic"}};
  for (const auto& [cpu, kernel] : cpus) {
    const std::string printed = ExpectRunMatchesGolden(
        std::string("env -u KDA_ISA -u KDA_KERNEL qemu-x86_64 -cpu ") + cpu, mini_ + "/single_T8.safetensors", dir_);
    EXPECT_NE(printed.find(std::string("kernel ") + kernel), std::string::npos) << cpu << ": " << printed;
  }
}

// Served through the pool in chunks, with decode steps and fewer slots than
// sequences: the same output file as the one-shot run, within tolerance.
TEST_F(CliTest, ServingFlagsKeepTheOutputs) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const std::string in = mini_ + "/varlen_initstate.safetensors";
  const SafetensorsFile want = SafetensorsFile::Open(in);
  const fs::path out = dir_ / "served.safetensors";
  const CliResult r = RunCli("run --model " + mini_ + " --input " + in + " --output " + out.string() +
                             " --prefill-chunk 7 --decode-last 9 --max-running 2");
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsFile got = SafetensorsFile::Open(out.string());
  const std::vector<float> o = ToFloatVector(got.Get("out"));
  const std::vector<float> s = ToFloatVector(got.Get("final_recurrent_state"));
  const std::vector<float> c = ToFloatVector(got.Get("final_conv_state"));
  EXPECT_TRUE(testing::AllCloseF32(o.data(), ToFloatVector(want.Get("out_fp32")).data(), o.size()));
  EXPECT_TRUE(testing::AllCloseF32(s.data(), ToFloatVector(want.Get("final_recurrent_state")).data(), s.size()));
  EXPECT_TRUE(testing::AllCloseF32(c.data(), ToFloatVector(want.Get("final_conv_state")).data(), c.size()));
}

// --weights int8: the output equals the dense run on the dequantized weights
// (fp32 rule; bf16 rule v2 with the dense bf16 run as reference and the dense
// fp32 run as the exact output), served in chunks and decode steps too; an
// int8 checkpoint written by `kda quantize` gives the same file bit for bit.
TEST_F(CliTest, Int8WeightsEqualTheDenseRunOnDequantizedWeights) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const std::string in = mini_ + "/varlen_initstate.safetensors";
  const std::string deq = (dir_ / "deq").string();
  testing::WriteDequantizedCheckpoint(mini_, deq);
  auto run = [&](const std::string& model, const std::string& flags, const std::string& name) {
    const fs::path out = dir_ / (name + ".safetensors");
    const CliResult r = RunCli("run --model " + model + " --input " + in + " --output " + out.string() + " " + flags);
    EXPECT_EQ(r.status, 0) << flags << ": " << r.err;
    return out.string();
  };
  auto tensor = [](const std::string& file, const char* name) {
    return ToFloatVector(SafetensorsFile::Open(file).Get(name));
  };
  const std::string x32 = run(deq, "--dtype float32", "deq32");
  const std::string r16 = run(deq, "--dtype bfloat16", "deq16");
  for (const std::string serve : {"", " --prefill-chunk 7 --decode-last 9 --max-running 2"}) {
    SCOPED_TRACE(serve);
    const std::string a32 = run(mini_, "--weights int8 --dtype float32" + serve, "int8_32");
    const std::string a16 = run(mini_, "--weights int8 --dtype bfloat16" + serve, "int8_16");
    for (const char* name : {"out", "final_recurrent_state"}) {
      const std::vector<float> a = tensor(a32, name);
      const std::vector<float> x = tensor(x32, name);
      EXPECT_TRUE(testing::AllCloseF32(a.data(), x.data(), x.size(), 1e-5, 1e-5)) << name;
      const std::vector<float> b = tensor(a16, name);
      EXPECT_TRUE(testing::AllCloseBF16(b.data(), tensor(r16, name).data(), x.data(), x.size())) << name;
    }
  }
  const std::string q8 = (dir_ / "q8").string();
  const CliResult qr = RunCli("quantize --model " + mini_ + " --output " + q8);
  ASSERT_EQ(qr.status, 0) << qr.err;
  const std::string from_q8 = run(q8, "--weights int8 --dtype bfloat16", "from_q8");
  const std::string at_load = run(mini_, "--weights int8 --dtype bfloat16", "at_load");
  EXPECT_EQ(tensor(from_q8, "out"), tensor(at_load, "out"));
  EXPECT_EQ(tensor(from_q8, "final_recurrent_state"), tensor(at_load, "final_recurrent_state"));
  ExpectRefused("run --model " + q8 + " --input " + in, "load them with --weights int8");
  ExpectRefused("run --model " + mini_ + " --input " + in + " --weights int4", "unknown weight format 'int4'");
  ExpectRefused("quantize --model " + mini_ + " --output " + q8, "exists and is not empty", false);
}

// The serving benchmark's JSON line on a small workload of the embedded model.
TEST_F(CliTest, BenchPrintsItsJsonLine) {
  BenchRun b;
  ASSERT_NO_FATAL_FAILURE(
      RunBench("bench --requests 3 --min-prompt 5 --max-prompt 70 --decode-steps 3 --layers 2 --prefill-chunk 16 "
               "--max-running 2 --json",
               &b));
  for (const char* key : {"\"prefill_tokens_per_s\"", "\"decode_tokens_per_s\"", "\"state_bytes_per_request\"",
                          "\"requests\": 3", "\"layers\": 2"}) {
    EXPECT_TRUE(b.Has(key)) << key << " in " << b.last;
  }
  const double ratio = b.Number("self_check_max_ratio");
  EXPECT_LE(ratio, 1.0);
  EXPECT_GT(ratio, 0.0);  // the check compared something
  // Real shapes (hidden 2304, 32 x 128): 39,460,864 projection weights per layer.
  EXPECT_TRUE(b.Has("\"weights\": \"bf16\", \"weight_bytes_per_layer\": 78921728")) << b.last;
}

// --vs-one-shot: the served prefill per layer next to one layer's one-shot
// prefill of --max-prompt tokens, in the text and the JSON line, consistent
// with the served rate; refused where the comparison would not be like for like.
TEST_F(CliTest, BenchComparesServedPrefillWithOneShot) {
  BenchRun b;
  ASSERT_NO_FATAL_FAILURE(
      RunBench("bench --requests 3 --min-prompt 5 --max-prompt 70 --decode-steps 2 --layers 2 --prefill-chunk 16 "
               "--vs-one-shot --json",
               &b));
  EXPECT_NE(b.r.out.find("us/token one-shot (one sequence of 70 tokens)"), std::string::npos) << b.r.out;
  const double served = b.Number("prefill_us_per_token_per_layer");
  const double one_shot = b.Number("one_shot_layer_us_per_token");
  EXPECT_GT(one_shot, 0.0);
  EXPECT_NEAR(served, 1e6 / (b.Number("prefill_tokens_per_s") * 2), 1e-3 * served);
  EXPECT_NEAR(b.Number("prefill_ratio_to_one_shot"), served / one_shot, 1e-4 * served / one_shot);
  ExpectRefused("bench --vs-one-shot --weights int8", "use --weights bf16", false);
  ExpectRefused("bench --vs-one-shot --workload multi-turn", "--vs-one-shot needs the default workload", false);
  // Without the flag the line has none of these fields.
  BenchRun plain;
  ASSERT_NO_FATAL_FAILURE(
      RunBench("bench --requests 2 --min-prompt 5 --max-prompt 20 --decode-steps 1 --layers 1 --json", &plain));
  EXPECT_EQ(plain.r.out.find("one_shot"), std::string::npos) << plain.r.out;
}

// With int8 weights: the self-check passes and the JSON line names the format
// and its bytes (1 + 2/32 bytes per weight).
TEST_F(CliTest, BenchWithInt8Weights) {
  BenchRun b;
  ASSERT_NO_FATAL_FAILURE(
      RunBench("bench --weights int8 --requests 3 --min-prompt 5 --max-prompt 70 --decode-steps 3 --layers 1 "
               "--prefill-chunk 16 --max-running 2 --json",
               &b));
  EXPECT_TRUE(b.Has("\"weights\": \"int8\", \"weight_bytes_per_layer\": 41927168")) << b.last;
  EXPECT_NE(b.r.out.find("-> PASS"), std::string::npos) << b.r.out;
}

// The multi-turn benchmark's JSON line: cache off and on, both pipelines and
// weight formats, on a small workload.
TEST_F(CliTest, MultiTurnBenchPrintsItsJsonLine) {
  for (const auto& [dtype, weights] : std::vector<std::pair<std::string, std::string>>{
           {"float32", "bf16"}, {"bfloat16", "bf16"}, {"bfloat16", "int8"}}) {
    SCOPED_TRACE(dtype + " " + weights);
    BenchRun b;
    ASSERT_NO_FATAL_FAILURE(
        RunBench("bench --workload multi-turn --layers 1 --conversations 2 --turns 3 --system-prompt 130 --min-user 8 "
                 "--max-user 40 --decode-steps 4 --snapshot-interval 64 --json --dtype " +
                     dtype + " --weights " + weights,
                 &b));
    EXPECT_TRUE(b.Has("\"weights\": \"" + weights + "\"")) << b.last;
    EXPECT_NE(b.r.out.find(", " + weights + " weights,"), std::string::npos) << b.r.out;
    EXPECT_GT(b.Number("prompt_tokens"), 0.0);
    EXPECT_GT(b.Number("cache_hit_tokens"), 0.0);
    EXPECT_GT(b.Number("prefill_s_cache_off"), 0.0);
    EXPECT_GT(b.Number("prefill_s_cache_on"), 0.0);
    EXPECT_GT(b.Number("snapshot_bytes_peak"), 0.0);
    EXPECT_LE(b.Number("self_check_max_ratio"), 1.0);
    EXPECT_GT(b.Number("self_check_max_ratio"), 0.0);
  }
  ExpectRefused("bench --workload chat", "--workload", false);
}

// The speculative benchmark: one JSON line per (weights, batch, k, alpha)
// with exactly the fields of its report, and a passing self-check.
TEST_F(CliTest, SpeculativeBenchPrintsAJsonLinePerConfiguration) {
  BenchRun b;
  ASSERT_NO_FATAL_FAILURE(
      RunBench("bench --workload speculative --layers 1 --batches 2 --weights-list bf16,int8 --k 1,3 --alphas 0.7 "
               "--spec-prompt 2 --decode-steps 6 --json",
               &b));
  const CliResult& r = b.r;
  EXPECT_NE(r.out.find("self-check (committed states vs token-by-token decode): PASS"), std::string::npos) << r.out;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 4U) << r.out;
  const std::vector<std::string> keys = {"batch",
                                         "weights",
                                         "k",
                                         "alpha",
                                         "accepted_per_step",
                                         "verify_step_ms",
                                         "decode_step_ms",
                                         "committed_tokens_per_s",
                                         "decode_tokens_per_s",
                                         "self_check_max_ratio"};
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    EXPECT_EQ(std::count(l.begin(), l.end(), ':'), static_cast<std::ptrdiff_t>(keys.size())) << l;
    for (const std::string& key : keys) EXPECT_NE(l.find("\"" + key + "\": "), std::string::npos) << key << " in " << l;
    const auto number = [&](const std::string& key) { return std::stod(l.substr(l.find(key) + key.size() + 3)); };
    EXPECT_NE(l.find(i < 2 ? "\"weights\": \"bf16\"" : "\"weights\": \"int8\""), std::string::npos) << l;
    EXPECT_EQ(number("\"k"), i % 2 == 0 ? 1.0 : 3.0) << l;
    EXPECT_EQ(number("\"batch"), 2.0) << l;
    EXPECT_GE(number("accepted_per_step"), 0.0);
    EXPECT_LE(number("accepted_per_step"), number("\"k"));
    EXPECT_GT(number("verify_step_ms"), 0.0);
    EXPECT_GT(number("decode_step_ms"), 0.0);
    EXPECT_GT(number("committed_tokens_per_s"), 0.0);
    EXPECT_LE(number("self_check_max_ratio"), 1.0);
  }
  ExpectRefused("bench --workload speculative --k 0", "--k", false);
  ExpectRefused("bench --workload speculative --alphas 0.5,x", "--alphas", false);
}

TEST_F(CliTest, RefusesBadArgumentsAndModels) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const std::string in = " --input " + mini_ + "/single_T8.safetensors";
  ExpectRefused("run --model " + mini_ + in + " --dtype float16", "dtype");
  ExpectRefused("run --model " + mini_ + in + " --kernel fast", "kernel");
  ExpectRefused("run --model " + mini_ + in + " --layer 3", "layer 3 is not a KimiDeltaAttention layer");
  ExpectRefused("run --model " + mini_ + in + " --layer 7", "out of range");
  ExpectRefused("run --model " + mini_ + in + " --layer -1", "out of range");
  ExpectRefused("run --model " + mini_ + in + " --bogus-flag", "bogus");
  ExpectRefused("run --model " + mini_ + in + " --prefill-chunk -3", "prefill-chunk");
  ExpectRefused("run --model " + mini_ + in + " --max-running -1", "max-running");
  ExpectRefused("bench --requests 0", "requests", false);
  ExpectRefused("bench --dtype float16", "dtype", false);
  ExpectRefused("run --model " + dir_.string() + in, "config.json");
  ExpectRefused("run --model " + mini_ + " --input " + (dir_ / "missing.safetensors").string(), "missing.safetensors");
  ExpectRefused("bench --model-type jamba", "unsupported model_type \"jamba\"", false);
  // A config.json of a model type kda does not serve, and a Gated DeltaNet one whose value heads are not a
  // multiple of its key heads.
  const std::string gdn = testing::GoldenSetDir("gdn-mini");
  KDA_REQUIRE_GOLDEN_PATH(gdn);
  const std::filesystem::path other = dir_ / "other";
  std::filesystem::create_directories(other);
  std::ofstream(other / "config.json") << R"({"model_type": "jamba", "hidden_size": 64, "num_hidden_layers": 2})";
  ExpectRefused("run --model " + other.string() + " --input " + gdn + "/single_T8.safetensors",
                "unsupported model_type \"jamba\"");
  std::ofstream(other / "config.json")
      << R"({"model_type": "qwen3_next", "hidden_size": 256, "num_hidden_layers": 4, "linear_num_key_heads": 4,
            "linear_num_value_heads": 6, "linear_key_head_dim": 32, "linear_value_head_dim": 32})";
  ExpectRefused("run --model " + other.string() + " --input " + gdn + "/single_T8.safetensors",
                "must be a multiple of");
}

// Writes an input file with the given tensors and expects `kda run` to refuse it.
TEST_F(CliTest, RefusesBadInputFiles) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const std::vector<float> x(8 * 512, 0.5F);
  const std::vector<float> x_short(8 * 100, 0.5F);
  const std::vector<int32_t> cu_ok = {0, 3, 8};
  const std::vector<int32_t> cu_start = {1, 3, 8};
  const std::vector<int32_t> cu_dec = {0, 5, 3, 8};
  const std::vector<int32_t> cu_end = {0, 3, 7};
  const std::vector<float> rec_bad(2 * 4 * 128 * 127, 0.0F);
  const TensorToWrite hidden = {"hidden_states", DType::kF32, {8, 512}, x.data()};
  // cu_seqlens as I32 [n].
  auto cu_seqlens = [](const std::vector<int32_t>& cu) {
    return TensorToWrite{"cu_seqlens", DType::kI32, {static_cast<int64_t>(cu.size())}, cu.data()};
  };
  struct Case {
    std::string name;
    std::vector<TensorToWrite> tensors;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"no_cu", {hidden}, "cu_seqlens"},
      {"wrong_hidden", {{"hidden_states", DType::kF32, {8, 100}, x_short.data()}, cu_seqlens(cu_ok)}, "hidden_states"},
      {"cu_start", {hidden, cu_seqlens(cu_start)}, "start at 0"},
      {"cu_decreasing", {hidden, cu_seqlens(cu_dec)}, "non-decreasing"},
      {"cu_end", {hidden, cu_seqlens(cu_end)}, "end at T"},
      {"cu_dtype", {hidden, {"cu_seqlens", DType::kF32, {3}, x.data()}}, "cu_seqlens"},
      {"bad_init_state",
       {hidden, cu_seqlens(cu_ok), {"initial_recurrent_state", DType::kF32, {2, 4, 128, 127}, rec_bad.data()}},
       "initial_recurrent_state"},
  };
  for (const Case& c : cases) {
    const fs::path in = dir_ / (c.name + ".safetensors");
    WriteSafetensors(in.string(), c.tensors);
    ExpectRefused("run --model " + mini_ + " --input " + in.string(), c.needle);
  }
  // A truncated file.
  const fs::path trunc = dir_ / "truncated.safetensors";
  fs::copy_file(mini_ + "/single_T8.safetensors", trunc);
  fs::resize_file(trunc, fs::file_size(trunc) / 2);
  ExpectRefused("run --model " + mini_ + " --input " + trunc.string(), "truncated");
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

using testing::Nested;

// Found by fuzzing: deeply nested JSON in an input header or config.json crashed `kda run` with SIGSEGV (exit
// 139, no message); a zero-element shape with huge other dimensions overflowed the element count.
TEST_F(CliTest, RefusesDeeplyNestedJsonAndHugeShapes) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const std::string deep = Nested(66000, "1");
  auto write_raw = [&](const std::string& name, const std::string& header, const std::string& data) {
    const fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff));
    out << header << data;
    return path.string();
  };
  const std::string shape_in =
      write_raw("deep_shape.safetensors",
                R"({"hidden_states":{"dtype":"F32","shape":[)" + deep + R"(],"data_offsets":[0,4]}})", "abcd");
  ExpectRefused("run --model " + mini_ + " --input " + shape_in, "deeper than 64 levels");
  const std::string offsets_in =
      write_raw("deep_offsets.safetensors",
                R"({"hidden_states":{"dtype":"F32","shape":[1],"data_offsets":[)" + deep + R"(,4]}})", "abcd");
  ExpectRefused("run --model " + mini_ + " --input " + offsets_in, "deeper than 64 levels");
  const std::string zero_in =
      write_raw("zero_dim.safetensors",
                R"({"cu_seqlens":{"dtype":"I64","shape":[4294967296,2147483649,0],"data_offsets":[0,0]},)"
                R"("hidden_states":{"dtype":"F32","shape":[1,512],"data_offsets":[0,2048]}})",
                std::string(2048, '\0'));
  ExpectRefused("run --model " + mini_ + " --input " + zero_in, "cu_seqlens must be 1-D");

  const std::string good_in = mini_ + "/single_T8.safetensors";
  const std::string config = testing::Slurp(mini_ + "/config.json");
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"\"hidden_size\": 512", "\"hidden_size\": " + deep},
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": " + deep},
      {"      1,\n", deep + ",\n"},  // the first kda_layers entry
  };
  const fs::path model = dir_ / "model";
  fs::create_directories(model);
  fs::copy_file(mini_ + "/model.safetensors", model / "model.safetensors");
  for (const auto& [from, to] : fields) {
    SCOPED_TRACE(from);
    std::string text = config;
    ASSERT_NE(text.find(from), std::string::npos);
    text.replace(text.find(from), from.size(), to);
    std::ofstream(model / "config.json", std::ios::trunc) << text;
    ExpectRefused("run --model " + model.string() + " --input " + good_in, "config.json: config nests arrays");
  }
}

// NaN or infinity in an input tensor is refused before any work, naming the tensor and the element.
TEST_F(CliTest, RefusesNonFiniteInputs) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(8 * 512, 0.5F);
  const std::vector<int64_t> cu = {0, 3, 8};
  std::vector<float> rec(2 * 4 * 128 * 128, 0.0F);
  std::vector<BF16> conv(2 * 3 * 1536, ToBF16(0.25F));
  const fs::path in = dir_ / "in.safetensors";
  auto write = [&] {
    WriteSafetensors(in.string(), {{"hidden_states", DType::kF32, {8, 512}, x.data()},
                                   {"cu_seqlens", DType::kI64, {3}, cu.data()},
                                   {"initial_recurrent_state", DType::kF32, {2, 4, 128, 128}, rec.data()},
                                   {"initial_conv_state", DType::kBF16, {2, 3, 1536}, conv.data()}});
  };
  const std::string args = "run --model " + mini_ + " --input " + in.string();
  x[3 * 512 + 7] = nan;
  x[5 * 512] = inf;  // only the first is named
  write();
  ExpectRefused(args, "input tensor hidden_states has a non-finite value (nan) at element [3, 7] (flat index 1543)");
  x[3 * 512 + 7] = 0.5F;
  x[5 * 512] = 0.5F;
  rec[128 * 128 * 1 + 128 * 2 + 9] = -inf;  // [0, 1, 2, 9] of [2, 4, 128, 128]
  write();
  ExpectRefused(args,
                "input tensor initial_recurrent_state has a non-finite value (-inf) at element [0, 1, 2, 9] "
                "(flat index 16649)");
  rec.assign(rec.size(), 0.0F);
  conv[3 * 1536 + 1535] = ToBF16(inf);  // [1, 0, 1535]
  write();
  ExpectRefused(args, "input tensor initial_conv_state has a non-finite value (+inf) at element [1, 0, 1535]");
  // All finite again: runs.
  conv[3 * 1536 + 1535] = ToBF16(0.25F);
  write();
  const CliResult ok = RunCli(args + " --output " + (dir_ / "ok.safetensors").string());
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// NaN or infinity in the checkpoint's weights is refused at load, naming the key and the element.
TEST_F(CliTest, RefusesNonFiniteWeights) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const fs::path model = dir_ / "nan_model";
  testing::CopyCheckpointWithValue(mini_, model.string(), "model.layers.0.self_attn.k_proj.weight", 1030,
                                   std::numeric_limits<float>::quiet_NaN());
  ExpectRefused("run --model " + model.string() + " --input " + mini_ + "/single_T8.safetensors",
                "checkpoint tensor model.layers.0.self_attn.k_proj.weight has a non-finite value (nan) at element "
                "[2, 6] (flat index 1030)");
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

// `kda run --prefix-cache`: sequences sharing prefixes (their rows determined
// by input_ids), one at a time: the later ones start from the earlier ones'
// snapshots; reused rows are zeros with computed = 0, the rest and the final
// states match the uncached run.
TEST_F(CliTest, RunWithPrefixCacheReusesSharedPrefixes) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  constexpr int64_t kHidden = 512;
  const fs::path in = dir_ / "prefix.safetensors";
  const int64_t T = testing::WritePrefixCacheInput(in.string());
  const SafetensorsFile input = SafetensorsFile::Open(in.string());
  const std::vector<float> x = ToFloatVector(input.Get("hidden_states"));
  const std::vector<int32_t> cu = {0, 300, 680, 980};
  // KDA, and Gated DeltaNet (gdn-loud: hidden 512 too).
  const std::string loud = testing::GoldenSetDir("gdn-loud");
  KDA_REQUIRE_GOLDEN_PATH(loud);
  for (const auto& [model, weights] : std::vector<std::pair<std::string, std::string>>{
           {mini_, "bf16"}, {mini_, "int8"}, {loud, "bf16"}, {loud, "int8"}}) {
    SCOPED_TRACE(model + " " + weights);
    const std::string base = "run --model " + model + " --input " + in.string() +
                             " --max-running 1 --prefill-chunk 100 --weights " + weights;
    const std::string tag = (model == mini_ ? "kda_" : "gdn_") + weights;
    const fs::path plain_out = dir_ / ("plain_" + tag + ".safetensors");
    const fs::path cached_out = dir_ / ("cached_" + tag + ".safetensors");
    const CliResult plain = RunCli(base + " --output " + plain_out.string());
    ASSERT_EQ(plain.status, 0) << plain.err;
    EXPECT_EQ(plain.out.find("prefix cache"), std::string::npos);
    const CliResult cached =
        RunCli(base + " --output " + cached_out.string() + " --prefix-cache --snapshot-interval 64");
    ASSERT_EQ(cached.status, 0) << cached.err;
    EXPECT_NE(cached.out.find(weights + " weights"), std::string::npos) << cached.out;
    // b reuses a's 256 snapshot, the repeat of a all of a's 300 rows.
    EXPECT_NE(cached.out.find("prefix cache: 556 of 980 prompt tokens reused"), std::string::npos) << cached.out;
    const SafetensorsFile want = SafetensorsFile::Open(plain_out.string());
    const SafetensorsFile got = SafetensorsFile::Open(cached_out.string());
    EXPECT_FALSE(want.Has("computed"));
    const TensorInfo& computed = got.Get("computed");
    ASSERT_EQ(computed.dtype, DType::kU8);
    ASSERT_EQ(computed.shape, std::vector<int64_t>{T});
    const auto* mask = static_cast<const uint8_t*>(computed.data);
    const std::vector<float> o = ToFloatVector(got.Get("out"));
    const std::vector<float> w = ToFloatVector(want.Get("out"));
    for (int64_t t = 0; t < T; ++t) {
      const bool reused = (t >= 300 && t < 556) || t >= 680;
      ASSERT_EQ(mask[t], reused ? 0 : 1) << "row " << t;
      const float* got_row = o.data() + t * kHidden;
      if (reused) {
        for (int64_t i = 0; i < kHidden; ++i) ASSERT_EQ(got_row[i], 0.0F) << "row " << t;
      } else {
        ASSERT_TRUE(testing::AllCloseF32(got_row, w.data() + t * kHidden, kHidden)) << "row " << t;
      }
    }
    for (const char* state : {"final_recurrent_state", "final_conv_state"}) {
      const std::vector<float> s = ToFloatVector(got.Get(state));
      EXPECT_TRUE(testing::AllCloseStateF32(s.data(), ToFloatVector(want.Get(state)).data(), s.size())) << state;
    }
  }
  // Without input_ids nothing is reused; bad ids and intervals are refused.
  const fs::path cached_out = dir_ / "cached.safetensors";
  const CliResult no_ids = RunCli("run --model " + mini_ + " --input " + mini_ +
                                  "/varlen_initstate.safetensors --prefix-cache --output " + cached_out.string());
  ASSERT_EQ(no_ids.status, 0) << no_ids.err;
  EXPECT_NE(no_ids.out.find("prefix cache: 0 of"), std::string::npos) << no_ids.out;
  fs::remove(cached_out);
  const std::vector<float> big = {3e9F};
  const std::vector<int64_t> huge(static_cast<size_t>(T), int64_t{1} << 40);
  const fs::path bad_dtype = dir_ / "bad_ids_dtype.safetensors";
  WriteSafetensors(bad_dtype.string(), {{"hidden_states", DType::kF32, {T, kHidden}, x.data()},
                                        {"cu_seqlens", DType::kI32, {4}, cu.data()},
                                        {"input_ids", DType::kF32, {1}, big.data()}});
  ExpectRefused("run --prefix-cache --model " + mini_ + " --input " + bad_dtype.string(), "input_ids");
  const fs::path bad_range = dir_ / "bad_ids_range.safetensors";
  WriteSafetensors(bad_range.string(), {{"hidden_states", DType::kF32, {T, kHidden}, x.data()},
                                        {"cu_seqlens", DType::kI32, {4}, cu.data()},
                                        {"input_ids", DType::kI64, {T}, huge.data()}});
  ExpectRefused("run --prefix-cache --model " + mini_ + " --input " + bad_range.string(), "int32 range");
  ExpectRefused("run --prefix-cache --snapshot-interval 100 --model " + mini_ + " --input " + in.string(),
                "--snapshot-interval");
}

}  // namespace
}  // namespace kda
