// The host's last-level cache, for benchmarks that must stream from memory: a
// decode step reads every layer's weights and states once, so a benchmark that
// cycles fewer bytes than the cache measures the cache, not the memory.
#pragma once

#include <cstdint>

namespace kda::bench {

// The size in bytes of the largest cache level of cpu0 (sysfs
// /sys/devices/system/cpu/cpu0/cache/index*/{level,size}); 0 where sysfs does
// not say.
int64_t LastLevelCacheBytes();

// The bytes a decode benchmark cycles through: twice the last-level cache, and
// at least 256 MiB (the size used where sysfs does not give the cache).
int64_t DecodeStreamBytes();

}  // namespace kda::bench
