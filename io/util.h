// Helpers shared by the io readers (internal to io/).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kda::io_internal {

// Parses `text` as JSON. Refuses (kda::Error naming `origin`) malformed JSON and any object with a repeated key:
// nlohmann silently keeps the last duplicate, which would hide e.g. two tensors with the same name.
// `what` names the document in messages ("header", "config"); `top_key_noun` names what a top-level key is
// ("tensor name" for a safetensors header).
nlohmann::json ParseJsonNoDuplicates(std::string_view text, const std::string& origin, const std::string& what,
                                     const std::string& top_key_noun = "key");

// The whole content of a file; kda::Error naming the path when it cannot be read.
std::string ReadFile(const std::string& path);

// A short, bounded rendering of a JSON value for error messages.
std::string Describe(const nlohmann::json& value);

}  // namespace kda::io_internal
