#include "io/util.h"

#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "kda/base/error.h"

namespace kda::io_internal {

nlohmann::json ParseJsonNoDuplicates(std::string_view text, const std::string& origin, const std::string& what,
                                     const std::string& top_key_noun) {
  // One key set per open object; the first repeated key found is remembered and reported after the parse
  // (throwing from inside the callback would leave nlohmann's parser mid-state).
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> duplicate;
  bool duplicate_at_top = false;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second && !duplicate) {
          duplicate = parsed.get<std::string>();
          duplicate_at_top = open_objects.size() == 1;
        }
        break;
      default:
        break;
    }
    return true;
  };

  nlohmann::json result;
  try {
    result = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": " + what + " is not valid JSON: " + e.what());
  }
  if (duplicate && duplicate_at_top) {
    throw Error(origin + ": " + what + " has duplicate " + top_key_noun + " '" + *duplicate + "'");
  }
  if (duplicate) throw Error(origin + ": " + what + " has duplicate key '" + *duplicate + "' in a nested object");
  return result;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Check(in.is_open(), "cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  Check(!in.bad(), "cannot read " + path);
  return text.str();
}

std::string Describe(const nlohmann::json& value) {
  std::string s = value.dump();
  constexpr size_t kMax = 60;
  if (s.size() > kMax) s.replace(kMax, std::string::npos, "...");
  return s;
}

}  // namespace kda::io_internal
