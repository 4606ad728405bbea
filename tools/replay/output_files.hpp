// gpumem-replay — the files it writes besides its standard output: --convert, --timeline,
// --plot and --export-snapshot.
#pragma once

#include <vector>

#include "config_run.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/replay.hpp"
#include "options.hpp"

namespace gpumem_replay {

/// --convert: the trace as a gpumem trace, or for FILE.csv as an RMM log; says so on stderr.
void write_conversion(const options& o, const gpumem::allocation_trace& trace);

/// --timeline: requested, allocated and reserved bytes after each event, per configuration.
void write_timeline(const options& o, const std::vector<config_run>& runs,
                    const gpumem::compiled_trace& c);

/// --plot: memory over time per configuration and the segments at the peak (or at the
/// out-of-memory, replayed again to stop there) as an SVG image.
void write_plot(const options& o, const std::vector<config_run>& runs,
                const gpumem::compiled_trace& c, const gpumem::allocation_trace& t);

/// --export-snapshot: `run`'s configuration replayed again with its history, written as a PyTorch
/// memory snapshot.
void export_snapshot(const options& o, const config_run& run, const gpumem::compiled_trace& c);

}  // namespace gpumem_replay
