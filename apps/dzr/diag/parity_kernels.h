#pragma once
/// `dzr parity attention|linear|conv3d|bmm|op`: one bf16 op on .npy operands (bf16 values stored as float32, as
/// PyTorch writes a bf16 tensor converted to f32) through the CUDA backend, the output written as float32
/// .npy. scripts/parity/kernel_probe.py runs the same ops in PyTorch and counts the elements that differ.
#include <CLI/CLI.hpp>

#include <functional>

namespace dzr::app {

/// Adds the five subcommands to `parity` (the `dzr parity` command).
void add_parity_kernel_commands(CLI::App& parity, std::function<int()>& run);

}  // namespace dzr::app
