// The registry of layer families (kda/models/layer_family.h): the list of the
// entries (models/families/), the lookup by model_type, and config.json's
// reading through the family's entry.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config_fields.h"
#include "io/util.h"
#include "kda/base/error.h"
#include "kda/models/layer_family.h"
#include "models/families/families.h"

namespace kda {
namespace {

using io_internal::ConfigFields;
using nlohmann::json;

// The model_type entry of `name` and its family; nullptr when none serves it.
const LayerFamily* FindFamily(const std::string& name, const ModelTypeName** type) {
  for (const LayerFamily& f : LayerFamilies()) {
    for (const ModelTypeName& t : f.model_types) {
      if (t.name == name) {
        if (type != nullptr) *type = &t;
        return &f;
      }
    }
  }
  return nullptr;
}

}  // namespace

const std::vector<LayerFamily>& LayerFamilies() {
  static const std::vector<LayerFamily> families = {
      families::KimiLinear(),       families::Qwen3Next(),  families::Qwen3_5(),  families::Glm5Next(),
      families::BailingHybrid(),    families::OlmoHybrid(), families::LaraMini(), families::Qwen4Exp(),
      families::GraniteMoeHybrid(), families::NemotronH(),  families::Bamba(),    families::Mamba2(),
      families::FalconH1(),         families::Zamba2(),
  };
  return families;
}

const std::vector<std::string>& SupportedModelTypes() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> names;
    for (const LayerFamily& f : LayerFamilies()) {
      for (const ModelTypeName& t : f.model_types) names.push_back(t.name);
    }
    return names;
  }();
  return types;
}

std::string SupportedModelTypesList() { return io_internal::Join(SupportedModelTypes()); }

const LayerFamily& LayerFamilyFor(const std::string& model_type) {
  const LayerFamily* f = FindFamily(model_type, nullptr);
  Check(f != nullptr, "unsupported model_type \"" + model_type + "\" (supported: " + SupportedModelTypesList() + ")");
  return *f;
}

ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin) {
  const json root = io_internal::ParseConfigJson(json_text, origin);
  Check(root.is_object(), origin + ": config is not a JSON object");
  const ConfigFields top(root, "", origin);

  const auto type_it = root.find("model_type");
  if (type_it == root.end()) return families::ReadUntypedKimiLinear(top);
  Check(type_it->is_string(), origin + ": model_type must be a string, got " + io_internal::Describe(*type_it));
  const std::string& name = type_it->get_ref<const std::string&>();
  const ModelTypeName* type = nullptr;
  const LayerFamily* family = FindFamily(name, &type);
  Check(family != nullptr, origin + ": unsupported model_type " + io_internal::Describe(*type_it) +
                               " (supported: " + SupportedModelTypesList() + ")");

  const auto text = root.find("text_config");
  const bool flat = type->nesting == ConfigNesting::kFlat ||
                    (type->nesting == ConfigNesting::kNestedOrFlat && (text == root.end() || text->is_null()));
  if (flat) {
    ModelConfig config = family->read_config(top);
    config.model_type = type->nesting == ConfigNesting::kFlat ? name : name + "_text";
    return config;
  }
  Check(text != root.end(), origin + ": missing text_config (model_type " + name + " keeps the text model there)");
  Check(text->is_object(), origin + ": text_config is not a JSON object");
  std::string text_type = name + "_text";
  if (const auto it = text->find("model_type"); it != text->end()) {
    Check(it->is_string() && io_internal::Contains(type->text_types, it->get_ref<const std::string&>()),
          origin + ": text_config.model_type must be " + (type->text_types.size() > 1 ? "one of " : "") +
              io_internal::Join(type->text_types) + ", got " + io_internal::Describe(*it));
    text_type = it->get<std::string>();
  }
  ModelConfig config = family->read_config(ConfigFields(*text, "text_config.", origin));
  config.model_type = text_type;
  return config;
}

ModelConfig LoadModelConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  Check(std::filesystem::is_regular_file(path, ec), "config.json not found in " + model_dir);
  return ParseModelConfig(io_internal::ReadFile(path.string()), path.string());
}

}  // namespace kda
