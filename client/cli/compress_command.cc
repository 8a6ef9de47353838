// `centroidkv compress`: reads keys.npy / values.npy / counts.npy ([H, n, d], float32 or
// float16; counts uint32), or a ragged layer (keys [total, dk], values [total, dv], counts
// [total] with offsets.npy [H + 1]: a previous result sent back as it is), compresses it on
// a server (--server) or in-process (--local), and writes out_keys / out_values /
// out_counts / out_offsets / assignment .npy files in the layout of ../shared/golden.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/client/shm_region.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/kernels/engine_factory.h"
#include "client/cli/commands.h"
#include "client/cli/compress_option_flags.h"
#include "client/cli/kind_flags.h"
#include "client/cli/security_flags.h"

namespace centroidkv::cli {
namespace {

struct CompressFlags {
  client::SecurityFlags security;
  std::string in_dir;
  std::string keys_path, values_path, counts_path, offsets_path;
  std::string out_dir;
  std::string server = "127.0.0.1:50051";
  bool local = false;
  bool shm = false;
  CompressOptions options;  // bound by AddCompressOptionFlags
  DType output_dtype = DType::kFloat32;
  // fp8 input: keys.npy / values.npy hold uint8 codes of this format, with these scales.
  DType input_dtype = DType::kFloat32;
  std::vector<float> key_scales, value_scales;
  BackendKind backend = BackendKind::kAuto;
  int32_t slab_kib = 256;
  uint32_t layer_index = 0;
  bool quiet = false;
  int64_t timeout_ms = 0;
  int32_t priority = 0;
};

// The input tensors, owned, plus the view the engine and the client borrow.
struct LoadedLayer {
  NpyArray keys, values, counts;
  bool has_counts = false;
  std::vector<uint32_t> converted_counts;
  std::vector<int64_t> head_offsets;  // ragged input: [H + 1]
  LayerView view;
};

// The dtype of an input file: float32 or float16, or uint8 codes of the fp8 format
// `input_dtype` names (--input-dtype).
absl::StatusOr<DType> NpyToDType(const NpyArray& array, const std::string& path,
                                 DType input_dtype) {
  if (IsFp8(input_dtype)) {
    if (array.type == NpyType::kUInt8) return input_dtype;
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": --input-dtype ", std::string(DTypeName(input_dtype)),
        " reads uint8 codes, got ", NpyDescr(array.type)));
  }
  if (array.type == NpyType::kFloat32) return DType::kFloat32;
  if (array.type == NpyType::kFloat16) return DType::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": keys and values must be float32 or float16 (or uint8 fp8 codes "
                         "with --input-dtype fp8_e4m3 / fp8_e5m2), got ",
                   NpyDescr(array.type)));
}

absl::Status CheckRank(const NpyArray& array, size_t rank, const std::string& path,
                       const char* expected) {
  if (array.shape.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected shape ", expected,
                                                   ", got ", array.shape.size(), " dimensions"));
  }
  for (int64_t dim : array.shape) {
    if (dim <= 0 || dim > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": every dimension must be in [1, 2^31)"));
    }
  }
  return absl::OkStatus();
}

// Counts as uint32; int32/int64/uint64 files are accepted when every value fits.
absl::Status ConvertCounts(LoadedLayer* layer, const std::string& path) {
  const NpyArray& counts = layer->counts;
  const int64_t n = counts.NumElements();
  layer->converted_counts.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t value = 0;
    switch (counts.type) {
      case NpyType::kUInt32:
        value = counts.As<uint32_t>()[i];
        break;
      case NpyType::kInt32:
        value = counts.As<int32_t>()[i];
        break;
      case NpyType::kInt64:
        value = counts.As<int64_t>()[i];
        break;
      case NpyType::kUInt64:
        value = static_cast<int64_t>(std::min<uint64_t>(counts.As<uint64_t>()[i], UINT32_MAX + 1ull));
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": counts must be integers (uint32), got ", NpyDescr(counts.type)));
    }
    if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": count ", value, " at index ", i, " does not fit uint32"));
    }
    layer->converted_counts[static_cast<size_t>(i)] = static_cast<uint32_t>(value);
  }
  return absl::OkStatus();
}

// Heads concatenated, as a result comes back: keys [total, dk], values [total, dv], counts
// [total] and offsets [H + 1] (int64 or int32, from 0 up to total).
absl::StatusOr<std::unique_ptr<LoadedLayer>> LoadRaggedLayer(const CompressFlags& flags) {
  if (flags.keys_path.empty() || flags.values_path.empty()) {
    return absl::InvalidArgumentError("give --in DIR, or both --keys and --values");
  }
  auto layer = std::make_unique<LoadedLayer>();
  CKV_ASSIGN_OR_RETURN(layer->keys, ReadNpy(flags.keys_path));
  CKV_ASSIGN_OR_RETURN(layer->values, ReadNpy(flags.values_path));
  CKV_RETURN_IF_ERROR(CheckRank(layer->keys, 2, flags.keys_path, "[total, dk]"));
  CKV_RETURN_IF_ERROR(CheckRank(layer->values, 2, flags.values_path, "[total, dv]"));
  CKV_ASSIGN_OR_RETURN(DType dtype, NpyToDType(layer->keys, flags.keys_path, flags.input_dtype));
  CKV_ASSIGN_OR_RETURN(DType value_dtype, NpyToDType(layer->values, flags.values_path, flags.input_dtype));
  const int64_t total = layer->keys.shape[0];
  if (value_dtype != dtype || layer->values.shape[0] != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        flags.values_path, ": values must have the keys' dtype and ", total, " rows"));
  }
  CKV_ASSIGN_OR_RETURN(NpyArray offsets, ReadNpy(flags.offsets_path));
  if (offsets.shape.size() != 1 || offsets.shape[0] < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(flags.offsets_path, ": offsets must be [H + 1] with H >= 1"));
  }
  for (int64_t i = 0; i < offsets.shape[0]; ++i) {
    int64_t value = 0;
    if (offsets.type == NpyType::kInt64) {
      value = offsets.As<int64_t>()[i];
    } else if (offsets.type == NpyType::kInt32) {
      value = offsets.As<int32_t>()[i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(flags.offsets_path, ": offsets must be int64 or int32"));
    }
    const int64_t previous = layer->head_offsets.empty() ? 0 : layer->head_offsets.back();
    if ((i == 0 && value != 0) || (i > 0 && value <= previous) || value > total) {
      return absl::InvalidArgumentError(absl::StrCat(
          flags.offsets_path, ": offsets must rise from 0 to ", total,
          " with at least one row per head (index ", i, " is ", value, ")"));
    }
    layer->head_offsets.push_back(value);
  }
  if (layer->head_offsets.back() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(flags.offsets_path, ": the last offset must be ", total));
  }
  LayerView& view = layer->view;
  view.dtype = dtype;
  view.num_heads = static_cast<int32_t>(layer->head_offsets.size() - 1);
  for (int32_t h = 0; h < view.num_heads; ++h) {
    view.num_tokens = std::max<int32_t>(
        view.num_tokens, static_cast<int32_t>(layer->head_offsets[h + 1] - layer->head_offsets[h]));
  }
  view.key_dim = static_cast<int32_t>(layer->keys.shape[1]);
  view.value_dim = static_cast<int32_t>(layer->values.shape[1]);
  view.keys = layer->keys.bytes.data();
  view.values = layer->values.bytes.data();
  view.head_offsets = layer->head_offsets.data();
  if (!flags.counts_path.empty()) {
    CKV_ASSIGN_OR_RETURN(layer->counts, ReadNpy(flags.counts_path));
    if (layer->counts.shape.size() != 1 || layer->counts.shape[0] != total) {
      return absl::InvalidArgumentError(
          absl::StrCat(flags.counts_path, ": counts must be [", total, "]"));
    }
    CKV_RETURN_IF_ERROR(ConvertCounts(layer.get(), flags.counts_path));
    view.counts = layer->converted_counts.data();
  }
  return layer;
}

absl::StatusOr<std::unique_ptr<LoadedLayer>> LoadLayer(CompressFlags& flags) {
  namespace fs = std::filesystem;
  if (!flags.in_dir.empty()) {
    if (flags.keys_path.empty()) flags.keys_path = (fs::path(flags.in_dir) / "keys.npy").string();
    if (flags.values_path.empty()) {
      flags.values_path = (fs::path(flags.in_dir) / "values.npy").string();
    }
    const std::string counts = (fs::path(flags.in_dir) / "counts.npy").string();
    if (flags.counts_path.empty() && fs::exists(counts)) flags.counts_path = counts;
    const std::string offsets = (fs::path(flags.in_dir) / "offsets.npy").string();
    if (flags.offsets_path.empty() && fs::exists(offsets)) flags.offsets_path = offsets;
  }
  if (!flags.offsets_path.empty()) return LoadRaggedLayer(flags);
  if (flags.keys_path.empty() || flags.values_path.empty()) {
    return absl::InvalidArgumentError("give --in DIR, or both --keys and --values");
  }
  auto layer = std::make_unique<LoadedLayer>();
  CKV_ASSIGN_OR_RETURN(layer->keys, ReadNpy(flags.keys_path));
  CKV_ASSIGN_OR_RETURN(layer->values, ReadNpy(flags.values_path));
  CKV_RETURN_IF_ERROR(CheckRank(layer->keys, 3, flags.keys_path, "[H, n, dk]"));
  CKV_RETURN_IF_ERROR(CheckRank(layer->values, 3, flags.values_path, "[H, n, dv]"));
  CKV_ASSIGN_OR_RETURN(DType key_dtype, NpyToDType(layer->keys, flags.keys_path, flags.input_dtype));
  CKV_ASSIGN_OR_RETURN(DType value_dtype, NpyToDType(layer->values, flags.values_path, flags.input_dtype));
  if (key_dtype != value_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        flags.values_path, ": values are ", std::string(DTypeName(value_dtype)),
        " but keys are ", std::string(DTypeName(key_dtype)), "; both must have the same dtype"));
  }
  const std::vector<int64_t>& ks = layer->keys.shape;
  const std::vector<int64_t>& vs = layer->values.shape;
  if (ks[0] != vs[0] || ks[1] != vs[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        flags.values_path, ": values have ", vs[0], " heads x ", vs[1], " tokens but keys have ",
        ks[0], " x ", ks[1]));
  }
  LayerView& view = layer->view;
  view.dtype = key_dtype;
  view.layout = TensorLayout::kHeadMajor;
  view.num_heads = static_cast<int32_t>(ks[0]);
  view.num_tokens = static_cast<int32_t>(ks[1]);
  view.key_dim = static_cast<int32_t>(ks[2]);
  view.value_dim = static_cast<int32_t>(vs[2]);
  view.keys = layer->keys.bytes.data();
  view.values = layer->values.bytes.data();
  if (!flags.counts_path.empty()) {
    CKV_ASSIGN_OR_RETURN(layer->counts, ReadNpy(flags.counts_path));
    CKV_RETURN_IF_ERROR(CheckRank(layer->counts, 2, flags.counts_path, "[H, n]"));
    if (layer->counts.shape[0] != ks[0] || layer->counts.shape[1] != ks[1]) {
      return absl::InvalidArgumentError(absl::StrCat(flags.counts_path, ": counts must be [",
                                                     ks[0], ", ", ks[1], "]"));
    }
    CKV_RETURN_IF_ERROR(ConvertCounts(layer.get(), flags.counts_path));
    view.counts = layer->converted_counts.data();
  }
  return layer;
}

client::LayerJob MakeJob(const CompressFlags& flags, const LayerView& view) {
  client::LayerJob job;
  job.layer_index = flags.layer_index;
  job.layer = view;
  job.options = flags.options;
  job.timeout = std::chrono::milliseconds(flags.timeout_ms);
  job.priority = flags.priority;
  job.output_dtype = flags.output_dtype;
  job.backend = flags.backend;
  return job;
}

absl::StatusOr<client::LayerResult> RunLocal(const client::LayerJob& job) {
  auto engines = EngineSet::CreateAvailable();
  CKV_ASSIGN_OR_RETURN(const ClusterEngine* engine, engines->Select(job.backend));
  CompressOptions options = job.options;
  if (IsFp8(*job.output_dtype)) options.result_dtype = *job.output_dtype;  // quantised there
  CKV_ASSIGN_OR_RETURN(CompressResult result, engine->Compress(job.layer, options));
  client::LayerResult packed =
      client::LayerResultFromEngine(job.layer_index, result, *job.output_dtype);
  packed.backend = std::string(engine->name());
  return packed;
}

// --shm: the layer copied into a registered shared memory region, the job sent by reference,
// and the result read back out of the region.
absl::StatusOr<client::LayerResult> RunOverSharedMemory(client::Client* connected,
                                                        const client::LayerJob& job) {
  if (job.layer.head_offsets != nullptr) {
    return absl::InvalidArgumentError("--shm: ragged input (--offsets) goes as slabs");
  }
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<client::ShmLayerStack> stack,
                       client::ShmLayerStack::Create(connected, job.layer, 1, job.options,
                                                     job.output_dtype));
  stack->Fill(0, job.layer);
  client::LayerJob by_reference = stack->Job(0);
  by_reference.layer_index = job.layer_index;
  by_reference.backend = job.backend;
  by_reference.timeout = job.timeout;
  by_reference.priority = job.priority;
  CKV_ASSIGN_OR_RETURN(std::vector<client::LayerResult> results,
                       connected->CompressLayers({by_reference}));
  client::LayerResult result = std::move(results[0]);
  if (!result.status.ok()) return result.status;
  if (result.in_region.has_value()) {
    const client::LayerResult::RegionTensors& region = *result.in_region;
    result.keys.assign(region.keys, region.keys + region.keys_bytes);
    result.values.assign(region.values, region.values + region.values_bytes);
    result.counts.assign(region.counts, region.counts + result.total_entries());
    result.assignment.assign(region.assignment, region.assignment + region.assignment_elements);
    result.in_region.reset();  // the region goes with `stack`
  }
  return result;
}

absl::StatusOr<client::LayerResult> RunRemote(const CompressFlags& flags,
                                              const client::LayerJob& job) {
  client::ClientOptions options;
  options.target = flags.server;
  options.slab_bytes = flags.slab_kib * 1024;
  client::ApplySecurityFlags(flags.security, &options);
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> connected,
                       client::ConnectTarget(options));
  if (flags.shm) return RunOverSharedMemory(connected.get(), job);
  CKV_ASSIGN_OR_RETURN(std::vector<client::LayerResult> results,
                       connected->CompressLayers({job}));
  if (!results[0].status.ok()) return results[0].status;
  return std::move(results[0]);
}

absl::Status WriteOutputs(const std::string& dir, const client::LayerResult& result) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat(dir, ": ", error.message()));
  const int64_t total = result.total_entries();
  auto path = [&dir](const char* name) { return (fs::path(dir) / name).string(); };
  if (IsFp8(result.dtype)) {
    // .npy has no fp8: the codes go out as uint8, each head's scales beside them.
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_keys.npy"), NpyType::kUInt8, {total, result.key_dim},
                                 result.keys.data()));
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_values.npy"), NpyType::kUInt8,
                                 {total, result.value_dim}, result.values.data()));
    const int64_t heads = result.num_heads;
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_key_scales.npy"), NpyType::kFloat32, {heads},
                                 result.key_scales.data()));
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_value_scales.npy"), NpyType::kFloat32, {heads},
                                 result.value_scales.data()));
  } else if (result.dtype == DType::kBFloat16) {
    // .npy has no bfloat16: the rows go out widened to float32, which holds them exactly.
    const std::vector<float> keys = result.KeysAsFloat(), values = result.ValuesAsFloat();
    CKV_RETURN_IF_ERROR(
        WriteNpy(path("out_keys.npy"), NpyType::kFloat32, {total, result.key_dim}, keys.data()));
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_values.npy"), NpyType::kFloat32,
                                 {total, result.value_dim}, values.data()));
  } else {
    const NpyType rows = result.dtype == DType::kFloat16 ? NpyType::kFloat16 : NpyType::kFloat32;
    CKV_RETURN_IF_ERROR(
        WriteNpy(path("out_keys.npy"), rows, {total, result.key_dim}, result.keys.data()));
    CKV_RETURN_IF_ERROR(WriteNpy(path("out_values.npy"), rows, {total, result.value_dim},
                                 result.values.data()));
  }
  CKV_RETURN_IF_ERROR(
      WriteNpy(path("out_counts.npy"), NpyType::kUInt32, {total}, result.counts.data()));
  CKV_RETURN_IF_ERROR(WriteNpy(path("out_offsets.npy"), NpyType::kInt64,
                               {static_cast<int64_t>(result.offsets.size())},
                               result.offsets.data()));
  if (!result.assignment.empty()) {
    std::vector<int64_t> wide(result.assignment.begin(), result.assignment.end());
    // [H, n], or [total] for ragged input (one entry per input row, -1 for padding).
    const std::vector<int64_t> shape =
        result.assignment.size() == static_cast<size_t>(result.num_heads) * result.num_tokens
            ? std::vector<int64_t>{result.num_heads, result.num_tokens}
            : std::vector<int64_t>{static_cast<int64_t>(result.assignment.size())};
    CKV_RETURN_IF_ERROR(WriteNpy(path("assignment.npy"), NpyType::kInt64, shape, wide.data()));
  }
  return absl::OkStatus();
}

void PrintSummary(const CompressFlags& flags, const LayerView& view,
                  const client::LayerResult& result, double seconds) {
  const int64_t entries_in = view.TotalRows();
  const int64_t entries_out = result.total_entries();
  const double ratio = static_cast<double>(entries_out) / static_cast<double>(entries_in);
  const double bytes_in = static_cast<double>(entries_in) * (view.key_dim + view.value_dim) *
                          DTypeSize(view.dtype);
  std::cout << std::fixed << std::setprecision(3) << "compressed layer " << result.layer_index
            << " (" << view.num_heads << " heads x " << view.num_tokens << " tokens, dk "
            << view.key_dim << ", dv " << view.value_dim << ", " << DTypeName(view.dtype)
            << ") on " << (flags.local ? "local " : "") << result.backend
            << (flags.local ? "" : absl::StrCat(" at ", flags.server)) << ":\n"
            << "  tokens in " << entries_in << ", entries out " << entries_out << ", ratio "
            << ratio << " (" << std::setprecision(1) << 100.0 * (1.0 - ratio)
            << "% less KV), passes " << result.passes_run << "\n"
            << std::setprecision(2) << "  time " << seconds * 1e3 << " ms end to end";
  if (!flags.local) std::cout << ", " << result.compute_seconds * 1e3 << " ms clustering";
  std::cout << ", " << bytes_in / seconds / 1e6 << " MB/s of KV\n";
  if (!result.stop_reasons.empty()) {  // an older server sends no account
    std::cout << "  target " << result.target_length << (result.target_reached ? " reached" : " MISSED")
              << "; entries per head";
    for (size_t h = 0; h < result.head_entries.size(); ++h) {
      std::cout << (h == 0 ? " " : ", ") << result.head_entries[h] << " ("
                << StopReasonName(result.stop_reasons[h]) << ")";
    }
    if (result.padded_length > 0) std::cout << "; padded to " << result.padded_length;
    std::cout << "\n";
  }
}

void RunCompress(CompressFlags& flags, int* exit_code) {
  auto fail = [exit_code](const absl::Status& status) {
    std::cerr << "centroidkv compress: " << status.ToString() << "\n";
    *exit_code = status.code() == absl::StatusCode::kInvalidArgument ||
                         status.code() == absl::StatusCode::kNotFound
                     ? 2
                     : 1;
  };
  auto layer = LoadLayer(flags);
  if (!layer.ok()) return fail(layer.status());
  (*layer)->view.key_scales = flags.key_scales;
  (*layer)->view.value_scales = flags.value_scales;
  const client::LayerJob job = MakeJob(flags, (*layer)->view);
  const auto start = std::chrono::steady_clock::now();
  auto result = flags.local ? RunLocal(job) : RunRemote(flags, job);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) return fail(result.status());
  if (!flags.out_dir.empty()) {
    if (absl::Status written = WriteOutputs(flags.out_dir, *result); !written.ok()) {
      return fail(written);
    }
  }
  if (!flags.quiet) PrintSummary(flags, (*layer)->view, *result, seconds);
}

}  // namespace

void AddCompressCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<CompressFlags>();
  CLI::App* cmd = app.add_subcommand(
      "compress", "Compress one layer's KV cache ([H, n, d] .npy files) and write the result");
  cmd->add_option("--in", flags->in_dir, "Folder with keys.npy, values.npy and optional counts.npy");
  cmd->add_option("--keys", flags->keys_path, "keys.npy, [H, n, dk] float32 or float16");
  cmd->add_option("--values", flags->values_path, "values.npy, [H, n, dv], same dtype as keys");
  cmd->add_option("--counts", flags->counts_path, "counts.npy, [H, n] uint32 (default: all 1)");
  cmd->add_option("--offsets", flags->offsets_path,
                  "offsets.npy [H + 1]: ragged input, keys [total, dk], values [total, dv], "
                  "counts [total] (a result's out_* files sent back; --in finds offsets.npy)");
  cmd->add_option("--out", flags->out_dir,
                  "Folder for out_keys/out_values/out_counts/out_offsets/assignment .npy");
  auto* server = cmd->add_option("--server", flags->server,
                                 "Server address (HOST:PORT or unix:///path), or replicas to "
                                 "balance over: HOST:PORT,HOST:PORT,... or dns:///NAME:PORT")
                     ->capture_default_str();
  cmd->add_flag("--shm", flags->shm,
                "Send the layer by reference to shared memory (a server on unix://): only "
                "the job's description crosses the socket");
  cmd->add_flag("--local", flags->local, "Compress in this process instead of on a server")
      ->excludes(server);
  AddCompressOptionFlags(cmd, &flags->options);
  AddDTypeOption(cmd, "--output-dtype", &flags->output_dtype,
                 "Element type of the result rows: float32 is exact, the others round once "
                 "(fp8: uint8 codes in out_keys/out_values.npy, scales in out_*_scales.npy)");
  AddDTypeOption(cmd, "--input-dtype", &flags->input_dtype,
                 "fp8_e4m3 or fp8_e5m2: keys.npy / values.npy hold uint8 fp8 codes");
  cmd->add_option("--key-scales", flags->key_scales,
                  "fp8 input: the keys' scale, one (per layer) or one per head, e.g. 0.02,0.03")
      ->delimiter(',');
  cmd->add_option("--value-scales", flags->value_scales, "fp8 input: the values' scales")
      ->delimiter(',');
  cmd->add_option("--output-key-scales", flags->options.result_key_scales,
                  "fp8 output: static key scales, one or one per head (default: per head, "
                  "from the result's largest magnitude)")
      ->delimiter(',');
  cmd->add_option("--output-value-scales", flags->options.result_value_scales,
                  "fp8 output: static value scales")
      ->delimiter(',');
  AddBackendOption(cmd, "--backend", &flags->backend,
                   "Engine of the server (or of --local); identity only measures transport");
  cmd->add_option("--slab-kib", flags->slab_kib, "Slab size sent to the server, KiB")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  cmd->add_option("--layer", flags->layer_index, "Layer index to tag the job with");
  cmd->add_option("--timeout-ms", flags->timeout_ms, "The job's deadline on the server (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--priority", flags->priority, "Higher runs first among queued jobs");
  cmd->add_flag("--quiet", flags->quiet, "Print nothing on success");
  client::AddSecurityFlags(cmd, &flags->security);
  cmd->callback([flags, exit_code] { RunCompress(*flags, exit_code); });
}

}  // namespace centroidkv::cli
