// gpumem — umbrella header: the allocator, its devices, configuration, statistics, reports and
// the trace tools.
#pragma once

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host/pinned_pool.hpp"
#include "gpumem/host/simulated_host_device.hpp"
#include "gpumem/report/memory_summary.hpp"
#include "gpumem/report/oom_report.hpp"
#include "gpumem/stats.hpp"
#include "gpumem/stats_io.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/recorder.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"
