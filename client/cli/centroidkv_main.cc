// centroidkv: the command-line client. `centroidkv --help` lists the subcommands.
#include <CLI/CLI.hpp>

#include "client/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"CentroidKV client: compress KV caches through a CentroidKV server"};
  app.require_subcommand(1);
  int exit_code = 0;
  centroidkv::cli::AddCompressCommand(app, &exit_code);
  centroidkv::cli::AddInfoCommand(app, &exit_code);
  centroidkv::cli::AddGenerateCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
