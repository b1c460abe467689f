#include "scalify/compare/recipe_lists.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include "scalify/error.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::compare {

namespace {

const std::map<std::string, std::vector<std::string>>& named_lists() {
  static const std::map<std::string, std::vector<std::string>> lists = {
      {"seeds", quant::preset_names()},
      {"fp8",
       {"scalify_fp8_3", "scalify_fp8_4", "unit_fp8", "current", "delayed", "fp8_amax", "fp8_cscale", "mxfp8", "blockwise",
        "fp8_unscaled"}},
      {"fp16", {"scalify_fp16_1", "scalify_fp16_2", "unit_fp16", "f16_loss_scaled", "fp16_unscaled"}},
      {"scalify", {"scalify_fp16_1", "scalify_fp16_2", "scalify_fp8_3", "scalify_fp8_4"}},
      {"unit", {"unit_f32", "unit_fp16", "unit_fp8", "umup", "umup_fp8"}},
      {"per_tensor", {"current", "delayed", "fp8_amax", "fp8_cscale"}},
      {"allreduce", {"f32_allreduce_f16", "f32_allreduce_e4m3", "f32_allreduce_e5m2"}},
      {"state", {"msamp_o2", "coat", "fp8_adam_no_expansion"}},
      {"fp4",
       {"nvfp4", "nvfp4_no_hadamard", "nvfp4_no_sr", "nvfp4_1x16_weights", "nvfp4_no_tensor_scale", "nvfp4_all_layers", "mxfp4",
        "mxfp4_rceil"}},
  };
  return lists;
}

// (family, the named list that defines it), in drawing order; "other" holds the rest.
const std::vector<std::pair<std::string, std::string>>& families() {
  static const std::vector<std::pair<std::string, std::string>> f = {{"SCALIFY", "scalify"},           {"unit scaling", "unit"},
                                                                     {"per-tensor FP8", "per_tensor"}, {"FP4", "fp4"},
                                                                     {"all-reduce", "allreduce"},      {"FP8 optimizer state", "state"}};
  return f;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out.append(out.empty() ? "" : ", ").append(s);
  return out;
}

}  // namespace

std::vector<std::string> recipe_list_names() {
  std::vector<std::string> names;
  for (const auto& [name, list] : named_lists()) names.push_back(name);
  return names;
}

std::vector<std::string> recipe_list(const std::string& spec) {
  std::vector<std::string> out;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const auto named = named_lists().find(item);
    const std::vector<std::string> add = named != named_lists().end() ? named->second : std::vector<std::string>{item};
    for (const std::string& r : add) {
      try {
        quant::load_recipe(r);
      } catch (const Error& e) {
        rethrow_as(e, "compare: recipe '" + r + "': " + e.what() + "; named lists: " + join(recipe_list_names()));
      }
      if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
    }
  }
  if (out.empty()) throw Error("compare: no recipes in '" + spec + "'");
  return out;
}

std::string recipe_family(const std::string& recipe) {
  for (const auto& [family, list] : families()) {
    const std::vector<std::string>& members = named_lists().at(list);
    if (std::find(members.begin(), members.end(), recipe) != members.end()) return family;
  }
  return "other";
}

std::vector<std::string> recipe_families() {
  std::vector<std::string> out;
  for (const auto& [family, list] : families()) out.push_back(family);
  out.push_back("other");
  return out;
}

}  // namespace scalify::compare
