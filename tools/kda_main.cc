// The kda command-line tool.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "kda/models/layer_family.h"
#include "kda/models/quantize.h"
#include "tools/bench_command.h"
#include "tools/bench_kernels_command.h"
#include "tools/rank_errors.h"
#include "tools/run_command.h"

int main(int argc, char** argv) {
  CLI::App app{"kda: delta-rule linear attention inference component (Kimi Delta Attention, Gated DeltaNet)"};
  app.require_subcommand(1);

  kda::cli::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Run one KDA layer over a packed batch");
  run_cmd->add_option("--model", run.model_dir,
                      "Model directory (config.json + safetensors); omit for the embedded default");
  run_cmd->add_option("--input", run.input, "Input safetensors: hidden_states, cu_seqlens[, initial states]");
  run_cmd->add_option("--output", run.output, "Output safetensors: out, final_recurrent_state, final_conv_state");
  CLI::Option* layer_opt =
      run_cmd->add_option("--layer", run.layer, "0-based layer index (default: the first KDA layer)");
  run_cmd->add_option("--dtype", run.dtype, "Pipeline dtype: float32 | bfloat16");
  run_cmd->add_option("--weights", run.weights, "Projection weights: bf16 (as the checkpoint) | int8 (Q8_0)");
  run_cmd->add_option("--kernel", run.kernel, "KDA kernels: auto | reference | optimized");
  run_cmd->add_option("--threads", run.threads, "Worker threads (0: OpenMP default)");
  run_cmd->add_option("--prefill-chunk", run.prefill_chunk,
                      "Prefill each sequence in EXTEND steps of at most N tokens");
  run_cmd->add_option("--decode-last", run.decode_last, "Feed the last K tokens of longer sequences as DECODE steps");
  run_cmd->add_option("--max-running", run.max_running, "At most R sequences hold a state slot at once");
  run_cmd->add_option("--lengths", run.lengths, "Embedded default only: comma-separated sequence lengths");
  run_cmd->add_flag("--prefix-cache", run.prefix_cache,
                    "Reuse the states of shared prefixes (input_ids [T] in the input; reused rows are not computed: "
                    "zeros, and a 'computed' [T] U8 mask in the output)");
  run_cmd->add_option("--prefix-cache-mib", run.prefix_cache_mib, "Prefix cache budget per rank in MiB (0: off)");
  run_cmd->add_option("--snapshot-interval", run.snapshot_interval,
                      "Prefix cache: a snapshot every N tokens inside prefills (a multiple of 64)");
  run_cmd->add_option("--tp", run.tp, "Tensor-parallel ranks (split the heads; under mpirun)");
  run_cmd->add_option("--dp", run.dp, "Data-parallel ranks (split the sequences; under mpirun)");

  kda::cli::BenchOptions bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "Serving benchmark: chunked prefill and batched decode");
  bench_cmd->add_option("--model", bench.model_dir, "Model directory; omit for the embedded default");
  bench_cmd->add_option("--model-type", bench.model_type,
                        "The embedded default's layer family, at its real model's shapes: " +
                            kda::SupportedModelTypesList() + " (default kimi_linear; ignored with --model)");
  bench_cmd->add_option("--layers", bench.layers, "Layers (embedded default: 4; with --model 0 = all)");
  bench_cmd->add_option("--requests", bench.requests, "Number of requests");
  bench_cmd->add_option("--min-prompt", bench.min_prompt, "Shortest prompt (tokens)");
  bench_cmd->add_option("--max-prompt", bench.max_prompt, "Longest prompt (tokens)");
  bench_cmd->add_option("--decode-steps", bench.decode_steps, "Decode steps per request");
  bench_cmd->add_option("--prefill-chunk", bench.prefill_chunk, "Max prefill tokens per request and step (0: none)");
  bench_cmd->add_option("--step-tokens", bench.step_token_budget, "Max tokens per EXTEND step");
  bench_cmd->add_option("--max-running", bench.max_running, "Max requests holding a slot (0: all)");
  bench_cmd->add_option("--state-budget-mib", bench.state_budget_mib,
                        "State pool budget per rank in MiB; the pool holds what fits (0: max-running)");
  bench_cmd->add_option("--dtype", bench.dtype, "Activation dtype: bfloat16 | float32");
  bench_cmd->add_option("--weights", bench.weights, "Projection weights: bf16 (as the checkpoint) | int8 (Q8_0)");
  bench_cmd->add_option("--kernel", bench.kernel, "KDA kernels: auto | reference | optimized");
  bench_cmd->add_option("--threads", bench.threads, "Worker threads (0: OpenMP default)");
  bench_cmd->add_option("--seed", bench.seed, "Workload seed");
  bench_cmd->add_flag("--json", bench.json, "End with one JSON line of the results");
  bench_cmd->add_flag("--vs-one-shot", bench.vs_one_shot,
                      "Also time one layer's one-shot prefill of --max-prompt tokens and compare the served prefill "
                      "per layer with it");
  bench_cmd->add_option("--tp", bench.tp, "Tensor-parallel ranks (split the heads; under mpirun)");
  bench_cmd->add_option("--dp", bench.dp, "Data-parallel ranks (split the requests; under mpirun)");
  bench_cmd->add_option("--workload", bench.workload,
                        "default | multi-turn (chats sharing a system prompt, prefix cache off and on) | speculative "
                        "(draft verification against plain decode)");
  bench_cmd->add_option("--conversations", bench.conversations, "multi-turn: conversations");
  bench_cmd->add_option("--turns", bench.turns, "multi-turn: turns per conversation");
  bench_cmd->add_option("--system-prompt", bench.system_prompt, "multi-turn: shared system prompt (tokens)");
  bench_cmd->add_option("--min-user", bench.min_user, "multi-turn: shortest user message (tokens)");
  bench_cmd->add_option("--max-user", bench.max_user, "multi-turn: longest user message (tokens)");
  bench_cmd->add_option("--prefix-cache-mib", bench.prefix_cache_mib, "multi-turn: the prefix cache budget in MiB");
  bench_cmd->add_option("--snapshot-interval", bench.snapshot_interval,
                        "multi-turn: a snapshot every N prefill tokens (a multiple of 64)");
  bench_cmd->add_option("--batches", bench.spec_batches, "speculative: comma-separated batch sizes");
  bench_cmd->add_option("--weights-list", bench.spec_weights, "speculative: comma-separated weights (bf16, int8)");
  bench_cmd->add_option("--k", bench.spec_k, "speculative: comma-separated draft counts k");
  bench_cmd->add_option("--alphas", bench.spec_alphas, "speculative: comma-separated acceptance probabilities");
  bench_cmd->add_option("--spec-prompt", bench.spec_prompt, "speculative: prompt rows per request");
  bench_cmd->add_option("--verify-method", bench.verify_method,
                        "speculative: what a verify step keeps: recompute | token_states");

  std::string quantize_model;
  std::string quantize_output;
  CLI::App* quantize_cmd =
      app.add_subcommand("quantize", "Write a checkpoint's KDA layers with int8 (Q8_0) projection weights");
  quantize_cmd->add_option("--model", quantize_model, "Model directory (config.json + safetensors)")->required();
  quantize_cmd->add_option("--output", quantize_output, "New directory for the int8 checkpoint")->required();

  kda::cli::BenchKernelsOptions bench_kernels;
  CLI::App* bench_kernels_cmd = kda::cli::AddBenchKernelsCommand(app, bench_kernels);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kda: %s\n", e.what());
    return 2;
  }
  try {
    if (bench_kernels_cmd->parsed()) return kda::cli::RunBenchKernelsCommand(bench_kernels);
    if (bench_cmd->parsed()) {
      // The speculative workload picks its layers from the last-level cache unless --layers is given.
      if (bench.workload == "speculative" && bench_cmd->count("--layers") == 0) bench.layers = 0;
      return kda::cli::RunBenchCommand(bench);
    }
    if (quantize_cmd->parsed()) {
      kda::QuantizeCheckpoint(quantize_model, quantize_output);
      std::printf("int8 checkpoint written to %s\n", quantize_output.c_str());
      return 0;
    }
    if (run_cmd->parsed()) {
      run.layer_given = layer_opt->count() > 0;
      return kda::cli::RunLayerCommand(run);
    }
  } catch (...) {
    return kda::cli::ReportException(std::current_exception());
  }
  return 0;
}
