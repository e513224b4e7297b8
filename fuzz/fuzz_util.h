// Shared by the fuzz harnesses: growing short fuzz inputs into large structured ones, and in-memory files.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace kda::fuzz {

// The escape bytes of Expand.
inline constexpr uint8_t kRepeat = 0xFE;
inline constexpr uint8_t kWrap = 0xFD;
// Expand never produces more than this (the 100 MiB header limit is tested by the unit tests, not here).
inline constexpr size_t kMaxExpanded = size_t{512} << 10;

// The input with every run-length macro expanded, n = 4 * (C1 * 256 + C0) (up to 262,140):
//   kRepeat, L, C1, C0, then L % 16 + 1 bytes of pattern: the pattern repeated n times;
//   kWrap, C1, C0, O, X: O n times, X, then the closer of O n times (']' for '[', '}' for '{', else O):
//     balanced nesting whose depth one mutated byte changes.
// A few bytes thus stand for 66,000-deep nesting ("\xFD\x40\x80[1") or a 100,000-element array
// ("\xFE\x01\x61\xA8" "0,"), which libFuzzer's short inputs never reach by plain mutation. Other bytes, and a
// truncated macro, are copied.
inline std::string Expand(const uint8_t* data, size_t size) {
  std::string out;
  size_t i = 0;
  while (i < size && out.size() < kMaxExpanded) {
    if (data[i] == kWrap && i + 5 <= size) {
      const size_t count = 4 * ((size_t{data[i + 1]} << 8) | data[i + 2]);
      const char open = static_cast<char>(data[i + 3]);
      const char close = open == '[' ? ']' : open == '{' ? '}' : open;
      const char inner = static_cast<char>(data[i + 4]);
      i += 5;
      const size_t room = (kMaxExpanded - out.size()) / 2;
      out.append(std::min(count, room), open);
      out += inner;
      out.append(std::min(count, room), close);
      continue;
    }
    if (data[i] != kRepeat || i + 4 > size) {
      out += static_cast<char>(data[i++]);
      continue;
    }
    const size_t len = data[i + 1] % 16 + 1;
    const size_t count = 4 * ((size_t{data[i + 2]} << 8) | data[i + 3]);
    i += 4;
    const std::string_view pattern(reinterpret_cast<const char*>(data + i), std::min(len, size - i));
    i += pattern.size();
    for (size_t r = 0; r < count && out.size() < kMaxExpanded; ++r) out += pattern;
  }
  if (out.size() > kMaxExpanded) out.resize(kMaxExpanded);
  return out;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// The harnesses' custom mutator. One time in four it works on Expand's macros: it sets the count of one already in
// the input, half the time past 65,536 (the nesting that overflowed the stack before depth was bounded), or
// inserts a balanced-nesting macro. Otherwise, and when that is not possible, libFuzzer's own mutations. Without
// it, libFuzzer rarely grows a count far enough: a count byte is one of many, and random values are mostly small.
inline size_t MutateWithMacros(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 4 != 0) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<size_t> counts;  // positions of the high count byte of each macro
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == kWrap && i + 5 <= size) counts.push_back(i + 1);
    if (data[i] == kRepeat && i + 4 <= size) counts.push_back(i + 2);
  }
  const auto count_byte = [&rng] { return static_cast<uint8_t>(rng() % 2 != 0 ? 0x40 + rng() % 0xC0 : rng() % 0x40); };
  if (!counts.empty() && rng() % 4 != 0) {
    const size_t at = counts[rng() % counts.size()];
    data[at] = count_byte();
    data[at + 1] = static_cast<uint8_t>(rng());
    return size;
  }
  if (size + 5 > max_size) return LLVMFuzzerMutate(data, size, max_size);
  const size_t at = size == 0 ? 0 : rng() % (size + 1);
  const uint8_t macro[5] = {kWrap, count_byte(), static_cast<uint8_t>(rng()),
                            static_cast<uint8_t>(rng() % 2 != 0 ? '[' : '{'), static_cast<uint8_t>('1')};
  std::copy_backward(data + at, data + size, data + size + 5);
  std::copy(macro, macro + 5, data + at);
  return size + 5;
}

// A safetensors file from its parts: the 8-byte little-endian header length, the header, the data section.
inline std::string FrameSafetensors(std::string_view header, std::string_view data) {
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file += header;
  file += data;
  return file;
}

// An anonymous in-memory file holding `content`, reachable by path (/proc/self/fd/N) for readers that open paths.
class MemFile {
 public:
  explicit MemFile(std::string_view content) : fd_(::memfd_create("kda_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < content.size()) {
      const ssize_t n = ::write(fd_, content.data() + done, content.size() - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// A private directory under the system temp directory, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "kda_fuzz_XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) std::abort();
    path_ = templ;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace kda::fuzz
