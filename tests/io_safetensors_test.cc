#include "kda/io/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "tests/error_util.h"
#include "tests/json_nesting.h"
#include "tests/temp_dir.h"

namespace kda {
namespace {

namespace fs = std::filesystem;

// One valid entry with 8 bytes of F32 data, for the malformed cases to vary.
constexpr char kEntryA[] = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

class SafetensorsTest : public testing::TempDirTest {
 protected:
  std::string PathOf(const std::string& file) const { return (dir_ / file).string(); }

  // Writes a file by hand: 8-byte little-endian length (header.size() unless given), header, data.
  std::string WriteRaw(const std::string& file, const std::string& header, const std::string& data = "",
                       int64_t header_length = -1) const {
    std::string path = PathOf(file);
    const uint64_t n = header_length < 0 ? header.size() : static_cast<uint64_t>(header_length);
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
    return path;
  }

  // WriteRaw of a header holding kEntryA and then `more` (entries, each after
  // its comma), with `data_bytes` zero bytes of data.
  std::string WriteAfterEntryA(const std::string& file, const std::string& more, size_t data_bytes) const {
    return WriteRaw(file, std::string("{") + kEntryA + more + "}", std::string(data_bytes, '\0'));
  }

  // Names of everything in the test directory.
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

// Expects SafetensorsFile::Open(path) to throw a kda::Error naming the path and containing `expected`.
void ExpectOpenError(const std::string& path, const std::string& expected) {
  try {
    SafetensorsFile::Open(path);
    ADD_FAILURE() << "opened " << path << " but expected an error containing: " << expected;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(expected), std::string::npos) << "message: " << message << "\nexpected: " << expected;
    EXPECT_NE(message.find(path), std::string::npos) << "message does not name the path: " << message;
  }
}

using testing::ErrorOf;

// Expects WriteSafetensors(path, tensors) to throw a kda::Error containing `expected`.
void ExpectWriteError(const std::string& path, const std::vector<TensorToWrite>& tensors, const std::string& expected) {
  const std::string message = ErrorOf([&] { WriteSafetensors(path, tensors); });
  EXPECT_NE(message.find(expected), std::string::npos) << "message: " << message << "\nexpected: " << expected;
}

TEST_F(SafetensorsTest, RoundTripAllDtypes) {
  const std::vector<float> f32 = {1.5F, -2.0F, 3.25F, 0.0F, 1e-3F, -7.0F};
  const std::vector<float> bf16_values = {1.0F, -0.5F, 3.0F, 256.0F};
  std::vector<BF16> bf16(bf16_values.size());
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = ToBF16(bf16_values[i]);
  const std::vector<int32_t> i32 = {0, -1, 2147483647};
  const std::vector<int64_t> i64 = {int64_t{1} << 40, -5, 7, 0};
  const float scalar = 42.0F;

  const std::string path = PathOf("model.safetensors");
  WriteSafetensors(path,
                   {{"f32", DType::kF32, {2, 3}, f32.data()},
                    {"bf16", DType::kBF16, {4}, bf16.data()},
                    {"i32", DType::kI32, {3}, i32.data()},
                    {"i64", DType::kI64, {2, 2}, i64.data()},
                    {"scalar", DType::kF32, {}, &scalar},
                    {"empty", DType::kF32, {0, 5}, nullptr}},
                   {{"format", "pt"}});
  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});  // no temp file left

  // The header is padded so the data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint8_t length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t{length_bytes[i]} << (8 * i);
  EXPECT_EQ(header_length % 8, 0U);

  const SafetensorsFile file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(file.tensors().size(), 6U);
  const std::vector<std::string> order = {"f32", "bf16", "i32", "i64", "scalar", "empty"};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(file.tensors()[i].name, order[i]);

  const TensorInfo& t_f32 = file.Get("f32");
  EXPECT_EQ(t_f32.dtype, DType::kF32);
  EXPECT_EQ(t_f32.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t_f32.numel(), 6);
  EXPECT_EQ(t_f32.nbytes, 24U);
  EXPECT_EQ(ToFloatVector(t_f32), f32);

  const TensorInfo& t_bf16 = file.Get("bf16");
  EXPECT_EQ(t_bf16.dtype, DType::kBF16);
  EXPECT_EQ(t_bf16.nbytes, 8U);
  EXPECT_EQ(ToFloatVector(t_bf16), bf16_values);

  EXPECT_EQ(file.Get("i32").dtype, DType::kI32);
  EXPECT_EQ(ToInt64Vector(file.Get("i32")), (std::vector<int64_t>{0, -1, 2147483647}));
  EXPECT_EQ(file.Get("i64").dtype, DType::kI64);
  EXPECT_EQ(ToInt64Vector(file.Get("i64")), i64);

  EXPECT_EQ(file.Get("scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(file.Get("scalar").numel(), 1);
  EXPECT_EQ(ToFloatVector(file.Get("scalar")), std::vector<float>{42.0F});
  EXPECT_EQ(file.Get("empty").numel(), 0);
  EXPECT_TRUE(ToFloatVector(file.Get("empty")).empty());

  EXPECT_TRUE(file.Has("i64"));
  EXPECT_FALSE(file.Has("nope"));
}

TEST_F(SafetensorsTest, AccessorErrors) {
  const int32_t ints[2] = {1, 2};
  const float floats[1] = {1.0F};
  const std::string path = PathOf("a.safetensors");
  WriteSafetensors(path, {{"ints", DType::kI32, {2}, ints}, {"floats", DType::kF32, {1}, floats}});
  const SafetensorsFile file = SafetensorsFile::Open(path);
  EXPECT_EQ(ErrorOf([&] { file.Get("nope"); }), "tensor 'nope' not found in " + path);
  EXPECT_NE(ErrorOf([&] { ToFloatVector(file.Get("ints")); }).find("has dtype I32, expected F32 or BF16"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ToInt64Vector(file.Get("floats")); }).find("has dtype F32, expected I32 or I64"),
            std::string::npos);
}

TEST_F(SafetensorsTest, MoveKeepsTheMappingAlive) {
  const float values[3] = {1.0F, 2.0F, 3.0F};
  const std::string path = PathOf("a.safetensors");
  WriteSafetensors(path, {{"x", DType::kF32, {3}, values}});
  SafetensorsFile first = SafetensorsFile::Open(path);
  const uint8_t* data = first.Get("x").data;
  SafetensorsFile second = std::move(first);
  EXPECT_EQ(second.Get("x").data, data);
  EXPECT_EQ(ToFloatVector(second.Get("x")), (std::vector<float>{1.0F, 2.0F, 3.0F}));
  SafetensorsFile third = SafetensorsFile::Open(path);
  third = std::move(second);
  EXPECT_EQ(ToFloatVector(third.Get("x")), (std::vector<float>{1.0F, 2.0F, 3.0F}));
}

TEST_F(SafetensorsTest, UnalignedTensorsAreReadable) {
  // A 1-element BF16 tensor pushes the F32 tensor after it to an offset that is not a multiple of 4.
  const BF16 b = ToBF16(2.0F);
  const float f = -3.5F;
  std::string data(6, '\0');
  std::memcpy(data.data(), &b.bits, 2);
  std::memcpy(data.data() + 2, &f, 4);
  const std::string path = WriteRaw("u.safetensors",
                                    R"({"b":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                                    R"("f":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                    data);
  const SafetensorsFile file = SafetensorsFile::Open(path);
  EXPECT_EQ(ToFloatVector(file.Get("b")), std::vector<float>{2.0F});
  EXPECT_EQ(ToFloatVector(file.Get("f")), std::vector<float>{-3.5F});
}

TEST_F(SafetensorsTest, RefusesShortFile) {
  const std::string path = PathOf("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abcde";
  ExpectOpenError(path, "file is 5 bytes, too short for the 8-byte header length");
}

TEST_F(SafetensorsTest, RefusesHeaderLengthOverLimit) {
  ExpectOpenError(WriteRaw("huge.safetensors", "{}", "", int64_t{200} << 20), "exceeds the limit of 104857600 bytes");
}

TEST_F(SafetensorsTest, RefusesHeaderLengthPastEndOfFile) {
  ExpectOpenError(WriteRaw("past.safetensors", "{}", "", 64), "header length 64 exceeds the file size minus 8 (2)");
}

TEST_F(SafetensorsTest, RefusesBadJson) {
  ExpectOpenError(WriteRaw("bad.safetensors", R"({"a": {"dtype": )"), "header is not valid JSON");
}

TEST_F(SafetensorsTest, RefusesHeaderThatIsNotAnObject) {
  ExpectOpenError(WriteRaw("array.safetensors", "[1, 2]"), "header is not a JSON object");
}

TEST_F(SafetensorsTest, RefusesEntryThatIsNotAnObject) {
  ExpectOpenError(WriteRaw("entry.safetensors", R"({"a": 3})"), "tensor 'a': header entry is not a JSON object");
}

TEST_F(SafetensorsTest, RefusesUnknownDtype) {
  ExpectOpenError(
      WriteRaw("f64.safetensors", R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "tensor 'a': unsupported dtype 'F64'");
}

TEST_F(SafetensorsTest, RefusesMissingOrMistypedFields) {
  ExpectOpenError(WriteRaw("1.safetensors", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  "tensor 'a': missing dtype");
  ExpectOpenError(
      WriteRaw("2.safetensors", R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "dtype is not a string");
  ExpectOpenError(WriteRaw("3.safetensors", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0')),
                  "tensor 'a': missing shape");
  ExpectOpenError(
      WriteRaw("4.safetensors", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", std::string(8, '\0')),
      "shape is not an array");
  ExpectOpenError(
      WriteRaw("5.safetensors", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "shape has a non-integer dimension 2.5");
  ExpectOpenError(
      WriteRaw("6.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, '\0')),
      "data_offsets is not an array of two integers");
  ExpectOpenError(
      WriteRaw("7.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})", std::string(8, '\0')),
      "are not non-negative integers");
}

TEST_F(SafetensorsTest, RefusesMissingDataOffsets) {
  ExpectOpenError(WriteRaw("m.safetensors", R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
                  "tensor 'a': missing data_offsets");
}

TEST_F(SafetensorsTest, RefusesNegativeShape) {
  ExpectOpenError(
      WriteRaw("neg.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "tensor 'a': shape has negative dimension -2");
}

TEST_F(SafetensorsTest, RefusesShapeOverflow) {
  ExpectOpenError(
      WriteRaw("ovf.safetensors", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               std::string(8, '\0')),
      "overflows the element count");
  ExpectOpenError(
      WriteRaw("ovf2.safetensors", R"({"a":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
               std::string(8, '\0')),
      "overflows the byte count");
}

TEST_F(SafetensorsTest, RefusesShapeBytesMismatch) {
  ExpectOpenError(
      WriteRaw("mis.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8");
}

TEST_F(SafetensorsTest, RefusesOffsetsOutsideData) {
  ExpectOpenError(
      WriteRaw("out.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(8, '\0')),
      "data_offsets [4, 12] lie outside the data section (8 bytes)");
}

TEST_F(SafetensorsTest, RefusesBeginAfterEnd) {
  ExpectOpenError(
      WriteRaw("rev.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0')),
      "data_offsets [8, 0] have begin > end");
}

TEST_F(SafetensorsTest, RefusesOverlap) {
  ExpectOpenError(
      WriteAfterEntryA("overlap.safetensors", R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})", 12),
      "tensors 'a' and 'b' overlap in the data section");
}

TEST_F(SafetensorsTest, RefusesGap) {
  ExpectOpenError(WriteAfterEntryA("gap.safetensors", R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]})", 16),
                  "gap in the data section: bytes [8, 12) belong to no tensor");
  ExpectOpenError(
      WriteRaw("lead.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')),
      "gap in the data section: bytes [0, 4) belong to no tensor");
}

TEST_F(SafetensorsTest, RefusesTrailingBytes) {
  ExpectOpenError(WriteAfterEntryA("trail.safetensors", "", 11),
                  "data section has 3 trailing bytes after the last tensor");
  ExpectOpenError(WriteRaw("nothing.safetensors", "{}", "x"), "data section has 1 trailing bytes");
}

TEST_F(SafetensorsTest, RefusesDuplicateNames) {
  ExpectOpenError(WriteAfterEntryA("dup.safetensors", R"(,"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})", 16),
                  "header has duplicate tensor name 'a'");
  ExpectOpenError(
      WriteRaw("dupkey.safetensors", R"({"a":{"dtype":"F32","shape":[2],"dtype":"F32","data_offsets":[0,8]}})",
               std::string(8, '\0')),
      "header has duplicate key 'dtype' in a nested object");
}

TEST_F(SafetensorsTest, RefusesBadMetadata) {
  ExpectOpenError(
      WriteRaw("meta.safetensors", std::string(R"({"__metadata__":{"n":1},)") + kEntryA + "}", std::string(8, '\0')),
      "__metadata__ is not a map of strings to strings (key 'n')");
}

TEST_F(SafetensorsTest, RefusesMissingFileAndDirectory) {
  ExpectOpenError(PathOf("absent.safetensors"), "cannot open safetensors file");
  ExpectOpenError(dir_.string(), "not a regular file");
}

TEST_F(SafetensorsTest, AcceptsSpacePaddedHeaderAndEmptyFile) {
  const std::string path = WriteRaw("pad.safetensors", std::string("{") + kEntryA + "}      ", std::string(8, '\1'));
  EXPECT_EQ(SafetensorsFile::Open(path).tensors().size(), 1U);
  EXPECT_TRUE(SafetensorsFile::Open(WriteRaw("empty.safetensors", "{}")).tensors().empty());
}

TEST_F(SafetensorsTest, WriterFailureInMissingDirectoryLeavesNothing) {
  const float v = 1.0F;
  const std::string path = PathOf("no_such_dir/model.safetensors");
  ExpectWriteError(path, {{"x", DType::kF32, {1}, &v}}, "cannot create " + path + ".tmp.");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(Listing().empty());
}

TEST_F(SafetensorsTest, WriterFailureKeepsTheOldFile) {
  const float old_values[2] = {1.0F, 2.0F};
  const float v = 5.0F;
  const std::string path = PathOf("model.safetensors");
  WriteSafetensors(path, {{"old", DType::kF32, {2}, old_values}});

  ExpectWriteError(path, {{"x", DType::kF32, {1}, &v}, {"x", DType::kF32, {1}, &v}}, "duplicate tensor name 'x'");
  ExpectWriteError(path, {{"x", DType::kF32, {-1}, &v}}, "shape [-1] has a negative dimension");
  ExpectWriteError(path, {{"__metadata__", DType::kF32, {1}, &v}}, "tensor '__metadata__': the name is reserved");
  ExpectWriteError(path, {{"", DType::kF32, {1}, &v}}, "a tensor has an empty name");
  ExpectWriteError(path, {{"x", DType::kF32, {1}, nullptr}}, "tensor 'x': data is null");

  EXPECT_EQ(Listing(), std::vector<std::string>{"model.safetensors"});
  const SafetensorsFile file = SafetensorsFile::Open(path);
  ASSERT_EQ(file.tensors().size(), 1U);
  EXPECT_EQ(ToFloatVector(file.Get("old")), (std::vector<float>{1.0F, 2.0F}));
}

TEST_F(SafetensorsTest, WriterRemovesTempFileWhenRenameFails) {
  // The target is a non-empty directory: the temp file is written, the rename fails.
  const std::string path = PathOf("target");
  fs::create_directories(path + "/inside");
  const float v = 1.0F;
  ExpectWriteError(path, {{"x", DType::kF32, {1}, &v}}, "cannot rename " + path + ".tmp.");
  EXPECT_EQ(Listing(), std::vector<std::string>{"target"});
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

using testing::Nested;

// Found by fuzzing: a shape or data_offsets element nested ~66k deep (a 130 KB header) crashed the reader with a
// stack overflow while formatting the error. Nesting is refused before parsing.
TEST_F(SafetensorsTest, RefusesDeeplyNestedHeader) {
  const std::string deep = Nested(66000, "1");
  ExpectOpenError(WriteRaw("deep_shape.safetensors",
                           R"({"a":{"dtype":"F32","shape":[)" + deep + R"(],"data_offsets":[0,4]}})", "abcd"),
                  "header nests arrays or objects deeper than 64 levels");
  ExpectOpenError(WriteRaw("deep_offsets.safetensors",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[)" + deep + R"(,4]}})", "abcd"),
                  "header nests arrays or objects deeper than 64 levels");
  ExpectOpenError(WriteRaw("deep_meta.safetensors", R"({"__metadata__":{"k":)" + Nested(65, "") + "}}"),
                  "deeper than 64 levels (at byte 83)");
}

TEST_F(SafetensorsTest, NestingUpToTheLimitIsParsedAndDescribedBriefly) {
  // Header object, entry object and shape array are 3 levels: 61 more reach the limit of 64.
  const std::string path =
      WriteRaw("limit.safetensors",
               R"({"a":{"dtype":"F32","shape":[)" + Nested(61, "1") + R"(],"data_offsets":[0,4]}})", "abcd");
  const std::string message = ErrorOf([&] { SafetensorsFile::Open(path); });
  EXPECT_NE(message.find("shape has a non-integer dimension [[[...]]]"), std::string::npos) << message;
  // Brackets inside strings are not nesting.
  const std::string name = std::string(100, '[') + std::string(100, '{');
  const std::string ok = WriteRaw("brackets.safetensors",
                                  R"({")" + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  EXPECT_TRUE(SafetensorsFile::Open(ok).Has(name));
}

TEST_F(SafetensorsTest, ErrorMessagesShowLargeValuesBriefly) {
  std::string huge = "[";
  for (int i = 0; i < 100000; ++i) huge += "1.5,";
  huge += "1]";
  const std::string message = ErrorOf([&] {
    SafetensorsFile::Open(WriteRaw("wide.safetensors", R"({"a":{"dtype":"F32","shape":[1],)"
                                                       R"("data_offsets":[)" +
                                                           huge + ",4]}}"));
  });
  EXPECT_NE(message.find("data_offsets [[1.5,1.5,1.5,"), std::string::npos) << message;
  EXPECT_LT(message.size(), 200U) << message;
}

// Found by fuzzing (UBSan): numel() multiplied in int64 and overflowed for a zero-element shape whose other
// dimensions multiply to between 2^63 and 2^64 (the reader's check counts in uint64 and stops growing at 0).
TEST_F(SafetensorsTest, ZeroDimensionAfterHugeDimensionsHasNoElements) {
  const std::string path =
      WriteRaw("zero.safetensors", R"({"a":{"dtype":"I64","shape":[4294967296,2147483649,0],"data_offsets":[0,0]}})");
  const SafetensorsFile file = SafetensorsFile::Open(path);
  const TensorInfo& t = file.Get("a");
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(ToInt64Vector(t).empty());
}

TEST(TensorInfoTest, NumelIsCheckedForHandBuiltShapes) {
  TensorInfo t;
  t.name = "w";
  t.shape = {4294967296, 2147483649, 0};
  EXPECT_EQ(t.numel(), 0);
  t.shape = {0, -1};
  EXPECT_NE(ErrorOf([&] { (void)t.numel(); }).find("tensor 'w' has shape [0, -1] with a negative dimension"),
            std::string::npos);
  t.shape = {4294967296, 2147483649};
  EXPECT_NE(ErrorOf([&] { (void)t.numel(); }).find("overflows int64"), std::string::npos);
  t.shape = {3037000499, 3037000499};  // just under 2^63
  EXPECT_EQ(t.numel(), int64_t{3037000499} * 3037000499);
  t.shape = {};
  EXPECT_EQ(t.numel(), 1);
}

// Found by fuzzing (a hang): numel() built its error message, shape and all, for every dimension, so a shape of
// many dimensions took quadratic time. Messages show long shapes by their first dimensions.
TEST_F(SafetensorsTest, ShapeWithManyDimensionsIsFastAndShownBriefly) {
  std::string dims;
  for (int i = 0; i < 200000; ++i) dims += "1,";
  const auto t0 = std::chrono::steady_clock::now();
  const SafetensorsFile file = SafetensorsFile::Open(
      WriteRaw("dims.safetensors", R"({"a":{"dtype":"F32","shape":[)" + dims + R"(1],"data_offsets":[0,4]}})", "abcd"));
  const TensorInfo& t = file.Get("a");
  EXPECT_EQ(t.shape.size(), 200001U);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(ToFloatVector(t).size(), 1U);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  TensorInfo bad = t;
  bad.shape.back() = -1;
  EXPECT_EQ(ErrorOf([&] { (void)bad.numel(); }),
            "tensor 'a' has shape [1, 1, 1, 1, 1, 1, 1, 1, ... (200001 dimensions)] with a negative dimension");
  EXPECT_EQ(ShapeString(std::vector<int64_t>(16, 2)), "[2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]");
}

// Found by fuzzing: a tensor name of half a megabyte with a shape of 10,000
// dimensions took 24 s (every dimension's check built a message holding the
// name). Messages now show long names briefly and are built only on failure.
TEST_F(SafetensorsTest, LongNameWithManyDimensionsIsFastAndShownBriefly) {
  const std::string name(400000, '{');
  std::string dims;
  for (int i = 0; i < 10000; ++i) dims += "1,";
  const SafetensorsFile file = SafetensorsFile::Open(
      WriteRaw("long_name.safetensors",
               "{\"" + name + R"(":{"dtype":"F32","shape":[)" + dims + R"(1],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_EQ(file.Get(name).shape.size(), 10001U);
  const std::string error = ErrorOf([&] {
    (void)SafetensorsFile::Open(
        WriteRaw("long_name_bad.safetensors",
                 "{\"" + name + R"(":{"dtype":"F32","shape":[)" + dims + R"(-1],"data_offsets":[0,4]}})", "abcd"));
  });
  EXPECT_NE(error.find("tensor '" + name.substr(0, 64) + "... (400000 bytes)': shape has negative dimension -1"),
            std::string::npos)
      << error.substr(0, 300);
  EXPECT_LT(error.size(), 400U);
}

TEST(CheckAllFiniteTest, NamesTheFirstBadElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {0.0F, 1.0F, 2.0F, 3.0F, -inf, 5.0F, nan};
  EXPECT_EQ(ErrorOf([&] { CheckAllFinite(v.data(), 4, {2, 2}, "x"); }), "(no error)");
  EXPECT_EQ(ErrorOf([&] { CheckAllFinite(v.data(), 7, {7}, "x"); }),
            "x has a non-finite value (-inf) at element [4] (flat index 4)");
  const std::vector<float> w = {0.0F, 0.0F, 0.0F, 0.0F, 0.0F, nan, inf};
  EXPECT_EQ(ErrorOf([&] {
              CheckAllFinite(w.data(), 6, {1, 2, 3}, "t");
            }),
            "t has a non-finite value (nan) at element [0, 1, 2] (flat index 5)");
  EXPECT_EQ(ElementIndexString({2, 3, 4}, 23), "[1, 2, 3] (flat index 23)");
}

}  // namespace
}  // namespace kda
