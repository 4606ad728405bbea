// gpumem-replay — what it prints on standard output: the trace header, one configuration in
// detail, the table of configurations, the JSON records and the summary of several traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config_run.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/replay.hpp"
#include "json_text.hpp"
#include "options.hpp"

namespace gpumem_replay {

/// A byte count as gpumem::format_bytes writes it ("3.18 GiB").
std::string bytes(std::uint64_t b);

/// a / b with three decimals; "-" when b is 0.
std::string ratio(std::uint64_t a, std::uint64_t b);

/// What was read and on which device it is replayed, before the results.
void print_trace_header(const options& o, const gpumem::allocation_trace& t,
                        const gpumem::compiled_trace& c);

/// One configuration's replay in detail (one --config, or none).
void print_detail(const options& o, const config_run& run, const gpumem::compiled_trace& c);

/// A row per configuration (--compare), then each one's steps and out-of-memory.
void print_table(const options& o, const std::vector<config_run>& runs,
                 const gpumem::compiled_trace& c);

/// The JSON record of each configuration (README.md, "--json"): nlohmann-json objects, keys in
/// the order printed.
std::vector<json> json_records(const options& o, const std::vector<config_run>& runs,
                               const gpumem::compiled_trace& c, const gpumem::allocation_trace& t);

/// Records as one JSON array on standard output, a record per line.
void print_json_array(const std::vector<json>& records);

/// Several inputs: a row per input and configuration, the inputs worst first (out of memory,
/// then the highest minimum device, the least headroom, the highest peak reserved), then the
/// worst input per configuration. `given`: how many inputs there were, replayed or not.
void print_summary(const options& o, std::vector<replayed_input> inputs, std::size_t given);

}  // namespace gpumem_replay
