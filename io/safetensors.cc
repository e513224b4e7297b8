#include "kda/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/util.h"
#include "kda/base/error.h"

namespace kda {
namespace {

// Safetensors stores little-endian data; this reader hands out the bytes as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // 100 MiB, the limit of the reference implementation
constexpr char kMetadataKey[] = "__metadata__";

std::string ErrnoText(int err) { return std::generic_category().message(err); }

bool ParseDType(const std::string& name, DType* dtype) {
  static const std::pair<const char*, DType> kKnown[] = {
      {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"I32", DType::kI32}, {"I64", DType::kI64},
      {"U8", DType::kU8},   {"I8", DType::kI8},     {"F16", DType::kF16}};
  for (const auto& [known_name, known_dtype] : kKnown) {
    if (name == known_name) {
      *dtype = known_dtype;
      return true;
    }
  }
  return false;
}

// *out = a * b; false on uint64 overflow.
bool MultiplyChecked(uint64_t a, uint64_t b, uint64_t* out) {
  if (b != 0 && a > std::numeric_limits<uint64_t>::max() / b) return false;
  *out = a * b;
  return true;
}

enum class IntStatus { kOk, kNotInteger, kNegative };

// Reads a JSON integer that must be >= 0. nlohmann stores non-negative integers as unsigned and negative ones as
// signed; integers beyond 64 bits come back as floats and so are "not an integer".
IntStatus ReadNonNegative(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return IntStatus::kOk;
  }
  if (!value.is_number_integer()) return IntStatus::kNotInteger;
  const int64_t v = value.get<int64_t>();
  if (v < 0) return IntStatus::kNegative;
  *out = static_cast<uint64_t>(v);
  return IntStatus::kOk;
}

std::string OffsetsText(uint64_t begin, uint64_t end) {
  std::string s = "[";  // built with += (GCC 12 warns falsely on "literal" + std::to_string(...))
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  return s + "]";
}

// A header entry after validation, with its offsets inside the data section.
struct ParsedEntry {
  TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A tensor name as messages show it: a header may hold names of any length.
std::string BriefName(const std::string& name) {
  constexpr size_t kMaxChars = 64;
  return name.size() <= kMaxChars ? name
                                  : name.substr(0, kMaxChars) + "... (" + std::to_string(name.size()) + " bytes)";
}

ParsedEntry ParseEntry(const std::string& path, const std::string& name, const json& entry, uint64_t data_size) {
  const std::string where = path + ": tensor '" + BriefName(name) + "'";
  Check(entry.is_object(), where + ": header entry is not a JSON object");
  ParsedEntry parsed;
  parsed.info.name = name;

  const auto dtype_it = entry.find("dtype");
  Check(dtype_it != entry.end(), where + ": missing dtype");
  Check(dtype_it->is_string(), where + ": dtype is not a string");
  const std::string dtype_name = dtype_it->get<std::string>();
  Check(ParseDType(dtype_name, &parsed.info.dtype),
        where + ": unsupported dtype '" + dtype_name + "' (supported: F32, BF16, I32, I64, I8, F16)");

  const auto shape_it = entry.find("shape");
  Check(shape_it != entry.end(), where + ": missing shape");
  Check(shape_it->is_array(), where + ": shape is not an array");
  uint64_t numel = 1;
  for (const json& dim_json : *shape_it) {
    uint64_t dim = 0;
    const IntStatus status = ReadNonNegative(dim_json, &dim);
    // Messages built only on failure: a shape may have any number of dimensions.
    Check(status != IntStatus::kNotInteger,
          [&] { return where + ": shape has a non-integer dimension " + io_internal::Describe(dim_json); });
    Check(status != IntStatus::kNegative,
          [&] { return where + ": shape has negative dimension " + io_internal::Describe(dim_json); });
    Check(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) && MultiplyChecked(numel, dim, &numel),
          [&] { return where + ": shape " + io_internal::Describe(*shape_it) + " overflows the element count"; });
    parsed.info.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  Check(MultiplyChecked(numel, DTypeSize(parsed.info.dtype), &nbytes),
        where + ": shape " + ShapeString(parsed.info.shape) + " overflows the byte count");

  const auto offsets_it = entry.find("data_offsets");
  Check(offsets_it != entry.end(), where + ": missing data_offsets");
  Check(offsets_it->is_array() && offsets_it->size() == 2, where + ": data_offsets is not an array of two integers");
  for (int i = 0; i < 2; ++i) {
    uint64_t* target = i == 0 ? &parsed.begin : &parsed.end;
    Check(ReadNonNegative((*offsets_it)[i], target) == IntStatus::kOk,
          where + ": data_offsets " + io_internal::Describe(*offsets_it) + " are not non-negative integers");
  }
  const std::string offsets_text = OffsetsText(parsed.begin, parsed.end);
  Check(parsed.begin <= parsed.end, where + ": data_offsets " + offsets_text + " have begin > end");
  Check(parsed.end <= data_size, where + ": data_offsets " + offsets_text + " lie outside the data section (" +
                                     std::to_string(data_size) + " bytes)");
  Check(nbytes == parsed.end - parsed.begin, where + ": shape " + ShapeString(parsed.info.shape) + " of " + dtype_name +
                                                 " needs " + std::to_string(nbytes) + " bytes but data_offsets " +
                                                 offsets_text + " span " + std::to_string(parsed.end - parsed.begin));
  parsed.info.nbytes = static_cast<size_t>(nbytes);
  return parsed;
}

std::map<std::string, std::string> ParseMetadata(const std::string& path, const json& value) {
  const std::string problem = path + ": __metadata__ is not a map of strings to strings";
  Check(value.is_object(), problem);
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    Check(item.is_string(), problem + " (key '" + key + "')");
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// Checks that the tensors, sorted by offset, cover [0, data_size) exactly once.
void CheckTiling(const std::string& path, const std::vector<ParsedEntry>& sorted, uint64_t data_size) {
  uint64_t cursor = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const ParsedEntry& e = sorted[i];
    if (e.begin < cursor) {  // cursor starts at 0, so i > 0 here
      throw Error(path + ": tensors '" + sorted[i - 1].info.name + "' and '" + e.info.name +
                  "' overlap in the data section");
    }
    Check(e.begin == cursor, path + ": gap in the data section: bytes [" + std::to_string(cursor) + ", " +
                                 std::to_string(e.begin) + ") belong to no tensor");
    cursor = e.end;
  }
  Check(cursor == data_size,
        path + ": data section has " + std::to_string(data_size - cursor) + " trailing bytes after the last tensor");
}

// Owns a file descriptor for the duration of a call.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

void CheckTensorForCopy(const TensorInfo& tensor) {
  const int64_t numel = tensor.numel();
  Check(numel >= 0 && static_cast<uint64_t>(numel) * DTypeSize(tensor.dtype) == tensor.nbytes,
        "tensor '" + tensor.name + "': nbytes " + std::to_string(tensor.nbytes) + " does not match shape " +
            ShapeString(tensor.shape) + " of " + DTypeName(tensor.dtype));
  Check(tensor.nbytes == 0 || tensor.data != nullptr, "tensor '" + tensor.name + "' has no data");
}

}  // namespace

int64_t TensorInfo::numel() const {
  // A zero dimension makes the count 0 whatever the others are (their product may not fit int64: the file check
  // counts in uint64, and only up to the zero).
  // Messages are built only on failure: a shape may have very many dimensions.
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    throw Error("tensor '" + name + "' has shape " + ShapeString(shape) + " with a negative dimension");
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw Error("tensor '" + name + "': the element count of shape " + ShapeString(shape) + " overflows int64");
    }
  }
  return n;
}

SafetensorsFile SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;  // read before anything else can change it
    throw Error("cannot open safetensors file " + path + ": " + ErrnoText(err));
  }
  FdCloser closer(fd);  // the mapping outlives the descriptor
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    throw Error("cannot stat " + path + ": " + ErrnoText(err));
  }
  Check(S_ISREG(st.st_mode), path + ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  Check(file_size >= 8,
        path + ": file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");

  SafetensorsFile file;
  file.path_ = path;
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    throw Error("cannot mmap " + path + ": " + ErrnoText(err));
  }
  file.mapping_ = mapping;  // from here on `file`'s destructor unmaps if validation throws
  file.mapping_size_ = file_size;
  const auto* bytes = static_cast<const uint8_t*>(mapping);

  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t{bytes[i]} << (8 * i);
  Check(header_size <= kMaxHeaderBytes, path + ": header length " + std::to_string(header_size) +
                                            " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  Check(header_size <= file_size - 8, path + ": header length " + std::to_string(header_size) +
                                          " exceeds the file size minus 8 (" + std::to_string(file_size - 8) + ")");
  const uint8_t* data_section = bytes + 8 + header_size;
  const uint64_t data_size = file_size - 8 - header_size;

  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_size);
  const json header = io_internal::ParseJsonNoDuplicates(header_text, path, "header", "tensor name");
  Check(header.is_object(), path + ": header is not a JSON object");

  std::vector<ParsedEntry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata_ = ParseMetadata(path, value);
      continue;
    }
    entries.push_back(ParseEntry(path, name, value, data_size));
  }
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  CheckTiling(path, entries, data_size);

  file.tensors_.reserve(entries.size());
  for (ParsedEntry& e : entries) {
    e.info.data = data_section + e.begin;
    file.index_.emplace(e.info.name, file.tensors_.size());
    file.tensors_.push_back(std::move(e.info));
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_size_(std::exchange(other.mapping_size_, 0)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_size_ = std::exchange(other.mapping_size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() noexcept {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  mapping_size_ = 0;
}

bool SafetensorsFile::Has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::Get(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error("tensor '" + name + "' not found in " + path_);
  return tensors_[it->second];
}

namespace {

// The tensor's elements as Out: stored as Out (dtype `same`: copied) or as Narrow (dtype `narrow`: each
// converted); kda::Error naming the `expected` dtypes for any other.
template <class Out, class Narrow, class Convert>
std::vector<Out> ToVector(const TensorInfo& tensor, DType same, DType narrow, const char* expected, Convert convert) {
  Check(tensor.dtype == same || tensor.dtype == narrow,
        "tensor '" + tensor.name + "' has dtype " + DTypeName(tensor.dtype) + ", expected " + expected);
  CheckTensorForCopy(tensor);
  std::vector<Out> out(static_cast<size_t>(tensor.numel()));
  if (tensor.dtype == same) {
    if (!out.empty()) std::memcpy(out.data(), tensor.data, tensor.nbytes);
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      Narrow value{};
      std::memcpy(&value, tensor.data + sizeof(Narrow) * i, sizeof(Narrow));  // memcpy: data may be unaligned
      out[i] = convert(value);
    }
  }
  return out;
}

}  // namespace

std::vector<float> ToFloatVector(const TensorInfo& tensor) {
  return ToVector<float, BF16>(tensor, DType::kF32, DType::kBF16, "F32 or BF16", [](BF16 x) { return ToFloat(x); });
}

std::vector<int64_t> ToInt64Vector(const TensorInfo& tensor) {
  return ToVector<int64_t, int32_t>(tensor, DType::kI64, DType::kI32, "I32 or I64",
                                    [](int32_t x) { return int64_t{x}; });
}

namespace {

// The temp file of WriteSafetensors: removed on destruction unless renamed into place.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }

  void WriteAll(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (size > 0) {
      const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
      const ssize_t n = ::write(fd_, p, chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        throw Error("cannot write " + path_ + ": " + ErrnoText(err));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

  void SyncCloseAndRename(const std::string& target) {
    if (::fsync(fd_) != 0) {
      const int err = errno;
      throw Error("cannot fsync " + path_ + ": " + ErrnoText(err));
    }
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int err = errno;
      throw Error("cannot close " + path_ + ": " + ErrnoText(err));
    }
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      const int err = errno;
      throw Error("cannot rename " + path_ + " to " + target + ": " + ErrnoText(err));
    }
    renamed_ = true;
  }

 private:
  std::string path_;
  int fd_;
  bool renamed_ = false;
};

}  // namespace

void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything is validated and laid out before the disk is touched.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  std::vector<size_t> sizes;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string where = "cannot write " + path + ": tensor '" + t.name + "'";
    Check(!t.name.empty(), "cannot write " + path + ": a tensor has an empty name");
    Check(t.name != kMetadataKey, where + ": the name is reserved");
    Check(names.insert(t.name).second, "cannot write " + path + ": duplicate tensor name '" + t.name + "'");
    Check(DTypeSize(t.dtype) != 0, where + ": invalid dtype");
    uint64_t nbytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      Check(d >= 0, where + ": shape " + ShapeString(t.shape) + " has a negative dimension");
      Check(MultiplyChecked(nbytes, static_cast<uint64_t>(d), &nbytes), where + ": shape overflows the byte count");
    }
    Check(nbytes == 0 || t.data != nullptr, where + ": data is null");
    Check(nbytes <= std::numeric_limits<uint64_t>::max() - offset, where + ": data section overflows");
    header[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(static_cast<size_t>(nbytes));
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error("cannot write " + path + ": a tensor name or metadata entry is not valid UTF-8 (" + e.what() + ")");
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  Check(header_text.size() <= kMaxHeaderBytes,
        "cannot write " + path + ": header exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(uint64_t{header_text.size()} >> (8 * i));

  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw Error("cannot create " + temp_path + ": " + ErrnoText(err));
  }
  TempFile temp(temp_path, fd);
  temp.WriteAll(length_bytes, sizeof(length_bytes));
  temp.WriteAll(header_text.data(), header_text.size());
  for (size_t i = 0; i < tensors.size(); ++i) temp.WriteAll(tensors[i].data, sizes[i]);
  temp.SyncCloseAndRename(path);
}

}  // namespace kda
