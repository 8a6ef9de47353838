// Subcommands of the `centroidkv` CLI. Each Add*Command registers its flags on `app` and
// a callback that runs it; the callback stores the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace centroidkv::cli {

void AddCompressCommand(CLI::App& app, int* exit_code);
void AddInfoCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);

}  // namespace centroidkv::cli
