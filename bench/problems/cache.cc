#include "kda/bench/cache.h"

#include <algorithm>
#include <exception>
#include <fstream>
#include <string>

namespace kda::bench {

int64_t LastLevelCacheBytes() {
  int best_level = 0;
  int64_t best_bytes = 0;
  // index0..: L1d, L1i, L2, L3 on x86; a few more is harmless.
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level");
    std::ifstream size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty()) continue;
    // "32768K", "2M", or plain bytes.
    int64_t bytes = 0;
    size_t used = 0;
    try {
      bytes = std::stoll(size, &used);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = used < size.size() ? size[used] : '\0';
    if (unit == 'K') bytes <<= 10;
    if (unit == 'M') bytes <<= 20;
    if (unit == 'G') bytes <<= 30;
    if (level > best_level || (level == best_level && bytes > best_bytes)) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

int64_t DecodeStreamBytes() { return std::max<int64_t>(2 * LastLevelCacheBytes(), int64_t{256} << 20); }

}  // namespace kda::bench
