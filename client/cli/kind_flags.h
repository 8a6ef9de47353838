// Command-line flags bound straight to the domain's kinds (DType, TensorLayout, BackendKind):
// CLI11 maps each name of the kind's table (types/kinds.h) to its value, so every tool (the
// CLI, the quality tool, the benchmarks) takes the same names, aliases included, and
// refuses others listing them. Header-only.
#pragma once

#include <map>
#include <span>
#include <string>

#include <CLI/CLI.hpp>

#include "centroidkv/types/kinds.h"

namespace centroidkv::cli {

// Adds --name bound to `*kind`, taking any name of `table` ("fp16", "float16", ...).
template <typename Kind>
CLI::Option* AddKindOption(CLI::App* app, const std::string& name, Kind* kind,
                           std::span<const KindName<Kind>> table, const std::string& help) {
  std::map<std::string, Kind> names;
  for (const KindName<Kind>& entry : table) names.emplace(std::string(entry.name), entry.kind);
  return app->add_option(name, *kind, help + " (" + KindNameList(table) + ")")
      ->transform(CLI::CheckedTransformer(names))
      ->default_str(std::string(KindNameOf(table, *kind)));
}

inline CLI::Option* AddDTypeOption(CLI::App* app, const std::string& name, DType* dtype,
                                   const std::string& help) {
  return AddKindOption<DType>(app, name, dtype, kDTypeNames, help);
}
inline CLI::Option* AddBackendOption(CLI::App* app, const std::string& name,
                                     BackendKind* backend, const std::string& help) {
  return AddKindOption<BackendKind>(app, name, backend, kBackendKindNames, help);
}

}  // namespace centroidkv::cli
