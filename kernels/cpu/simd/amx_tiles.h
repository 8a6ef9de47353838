// The AMX tile configuration the cpu backend uses (palette 1, tiles 0-7 each 16 rows of 64
// bytes), shared by its matching kernel (kernels_amx.cc) and the AMX peak measurement
// (bench/cpu_peak.cc). Only a plain aggregate and a constant: safe to include from a unit
// compiled without AMX flags (kernel_table.h says why that matters).
#pragma once

#include <cstdint>

namespace centroidkv::cpu {

// LDTILECFG's 64-byte operand.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

// Hand LDTILECFG this object in static storage: GCC 12 does not treat the instruction as a
// read of its operand, so a configuration built on the stack may lose stores (seen: all
// widths zero, then #GP at ldtilecfg).
inline constexpr TileConfig kTileConfig = {1,
                                           0,
                                           {},
                                           {64, 64, 64, 64, 64, 64, 64, 64},
                                           {16, 16, 16, 16, 16, 16, 16, 16}};

}  // namespace centroidkv::cpu
