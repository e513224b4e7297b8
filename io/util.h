// Helpers shared by the io readers (internal to io/).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kda::io_internal {

// The deepest nesting of arrays and objects any JSON document read by the component may have. Real headers,
// configs and indexes nest 3 deep; the bound keeps everything that walks a parsed value recursively (nlohmann's
// dump, comparisons) far from the stack limit.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as JSON. Refuses (kda::Error naming `origin`) malformed JSON, nesting deeper than kMaxJsonDepth
// (checked on the bytes before parsing) and any object with a repeated key: nlohmann silently keeps the last
// duplicate, which would hide e.g. two tensors with the same name.
// `what` names the document in messages ("header", "config"); `top_key_noun` names what a top-level key is
// ("tensor name" for a safetensors header).
nlohmann::json ParseJsonNoDuplicates(std::string_view text, const std::string& origin, const std::string& what,
                                     const std::string& top_key_noun = "key");

// Parses a config.json as transformers reads it (`ParseJsonNoDuplicates` otherwise): the non-finite floats
// Python's json writes, the bare tokens Infinity, -Infinity and NaN outside strings (transformers before 5.x wrote
// time_step_limit [0.0, Infinity] so), and transformers' own encoding of them, an object {"__float__": TAG}
// with TAG "Infinity", "-Infinity" or "NaN" (its _encode_special_floats, 5.x), are read as the float they stand
// for, wherever they appear; an object with other keys or another tag stays an object, as in transformers. The
// fields that must be finite refuse them by name. A bare token is read through the tagged form: a parse error
// later on its line counts columns of that rewritten text.
nlohmann::json ParseConfigJson(std::string_view text, const std::string& origin);

// The whole content of a file; kda::Error naming the path when it cannot be read.
std::string ReadFile(const std::string& path);

// A short rendering of a JSON value for error messages: at most ~60 characters, containers shown to a small depth
// and width ("[[...], 2, ...]"), non-finite floats as Python writes them (Infinity, -Infinity, NaN), so an
// untrusted value costs bounded time and stack whatever its size.
std::string Describe(const nlohmann::json& value);

}  // namespace kda::io_internal
