#include "io/util.h"

#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "kda/base/error.h"

namespace kda::io_internal {

namespace {

// Says, byte by byte, which bytes of JSON text lie outside strings (a string's quotes and escapes included in
// it).
class OutsideStrings {
 public:
  // Whether `c`, the text's next byte, is outside every string.
  bool Next(char c) {
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      return false;
    }
    in_string_ = c == '"';
    return !in_string_;
  }

 private:
  bool in_string_ = false;
  bool escaped_ = false;
};

// Refuses nesting deeper than kMaxJsonDepth. A scan of the bytes, counting brackets outside strings, without
// recursion: it runs before the parser, so no deep value is ever built. Unbalanced brackets are left to the
// parser to report.
void CheckNestingDepth(std::string_view text, const std::string& origin, const std::string& what) {
  int depth = 0;
  OutsideStrings scan;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!scan.Next(c)) continue;
    if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw Error(origin + ": " + what + " nests arrays or objects deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels (at byte " + std::to_string(i) + ")");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

constexpr size_t kDescribeMaxChars = 60;
constexpr int kDescribeMaxDepth = 2;     // deeper containers are shown as [...] / {...}
constexpr size_t kDescribeMaxItems = 8;  // items shown per container

// A scalar as JSON text (a non-finite float as Python writes it: nlohmann writes null); invalid UTF-8 (possible
// after truncation) is replaced, never thrown on.
std::string DumpScalar(const nlohmann::json& value) {
  if (value.is_number_float() && !std::isfinite(value.get<double>())) {
    const double v = value.get<double>();
    return std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Appends a bounded rendering of `value` to *out: recursion is limited to kDescribeMaxDepth levels whatever the
// value's own depth, and stops once *out is longer than kDescribeMaxChars.
void AppendBounded(const nlohmann::json& value, int depth, std::string* out) {
  if (value.is_array() || value.is_object()) {
    const bool array = value.is_array();
    if (depth >= kDescribeMaxDepth && !value.empty()) {
      *out += array ? "[...]" : "{...}";
      return;
    }
    *out += array ? '[' : '{';
    size_t shown = 0;
    for (auto it = value.begin(); it != value.end(); ++it, ++shown) {
      if (shown > 0) *out += ',';
      if (shown == kDescribeMaxItems || out->size() > kDescribeMaxChars) {
        *out += "...";
        break;
      }
      if (!array) {
        AppendBounded(nlohmann::json(it.key()), depth + 1, out);
        *out += ':';
      }
      AppendBounded(*it, depth + 1, out);
    }
    *out += array ? ']' : '}';
  } else if (value.is_string() && value.get_ref<const std::string&>().size() > kDescribeMaxChars) {
    *out += DumpScalar(nlohmann::json(value.get_ref<const std::string&>().substr(0, kDescribeMaxChars))) + "...";
  } else {
    *out += DumpScalar(value);
  }
}

// The non-finite floats of Python's json: the bare token and transformers' tag (the same spelling) of each.
constexpr std::string_view kFloatTagKey = "__float__";
struct NonFiniteFloat {
  std::string_view token;
  double value;
};
constexpr std::array<NonFiniteFloat, 3> kNonFiniteFloats = {{
    {"-Infinity", -std::numeric_limits<double>::infinity()},  // before "Infinity": the longer token first
    {"Infinity", std::numeric_limits<double>::infinity()},
    {"NaN", std::numeric_limits<double>::quiet_NaN()},
}};

// `text` with every bare Infinity, -Infinity and NaN outside strings replaced by {"__float__": "TOKEN"}; nullopt
// when it has none. No valid JSON has these letters outside strings, so each occurrence is one of Python's tokens
// or an error the parser reports either way.
std::optional<std::string> TagBareNonFiniteFloats(std::string_view text) {
  std::string out;
  size_t copied = 0;  // text[0, copied) is in out
  OutsideStrings scan;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!scan.Next(text[i])) continue;
    for (const NonFiniteFloat& f : kNonFiniteFloats) {
      if (text.substr(i, f.token.size()) != f.token) continue;
      out.append(text.substr(copied, i - copied));
      out.append("{\"").append(kFloatTagKey).append("\":\"").append(f.token).append("\"}");
      i += f.token.size() - 1;
      copied = i + 1;
      break;
    }
  }
  if (copied == 0) return std::nullopt;
  out.append(text.substr(copied));
  return out;
}

// Replaces every {"__float__": TAG} of `value` with TAG's float, as transformers' _decode_special_floats does.
// The depth is bounded (kMaxJsonDepth, checked before parsing), so the recursion is too.
void DecodeTaggedFloats(nlohmann::json* value) {
  if (value->is_object()) {
    if (value->size() == 1 && value->begin().key() == kFloatTagKey && value->begin()->is_string()) {
      const std::string& tag = value->begin()->get_ref<const std::string&>();
      for (const NonFiniteFloat& f : kNonFiniteFloats) {
        if (tag == f.token) {
          *value = f.value;
          return;
        }
      }
      return;
    }
    for (auto& item : value->items()) DecodeTaggedFloats(&item.value());
  } else if (value->is_array()) {
    for (nlohmann::json& item : *value) DecodeTaggedFloats(&item);
  }
}

}  // namespace

nlohmann::json ParseConfigJson(std::string_view text, const std::string& origin) {
  const std::optional<std::string> tagged = TagBareNonFiniteFloats(text);
  nlohmann::json root = ParseJsonNoDuplicates(tagged ? std::string_view(*tagged) : text, origin, "config");
  DecodeTaggedFloats(&root);
  return root;
}

nlohmann::json ParseJsonNoDuplicates(std::string_view text, const std::string& origin, const std::string& what,
                                     const std::string& top_key_noun) {
  CheckNestingDepth(text, origin, what);
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
  std::string s;
  AppendBounded(value, 0, &s);
  if (s.size() > kDescribeMaxChars) s.replace(kDescribeMaxChars, std::string::npos, "...");
  return s;
}

}  // namespace kda::io_internal
