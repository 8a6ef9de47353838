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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; any usage error (unknown flag, bad value, --target-ratio
    // with --target-tokens) exits 2, like a bad argument found after parsing.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
