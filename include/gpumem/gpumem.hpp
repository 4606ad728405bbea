// gpumem — umbrella header: the allocator, its devices, configuration, statistics and reports.
#pragma once

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/error.hpp"
#include "gpumem/host/pinned_pool.hpp"
#include "gpumem/report/memory_summary.hpp"
#include "gpumem/report/oom_report.hpp"
#include "gpumem/stats.hpp"
#include "gpumem/stats_io.hpp"
