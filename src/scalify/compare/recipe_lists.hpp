#pragma once
// The recipe lists `scalify compare --recipes` accepts by name, and the families its plots draw
// side by side.
#include <string>
#include <vector>

namespace scalify::compare {

// Named lists: "seeds" (every preset, the default), "fp8", "fp16", "fp4", "scalify", "unit",
// "per_tensor", "allreduce", "state" (low-precision optimizer state); or comma-separated preset names / recipe JSON files. Lists may be
// mixed ("f32,fp8"). Throws naming an unknown entry.
std::vector<std::string> recipe_list(const std::string& spec);
std::vector<std::string> recipe_list_names();

// The family a recipe's curves are drawn with (one plot panel each): "SCALIFY", "unit scaling",
// "per-tensor FP8", "FP4", "all-reduce", "FP8 optimizer state" (the named lists of the same recipes), else "other"
// (block and MX FP8, loss scaling, the unscaled baselines, recipe files).
std::string recipe_family(const std::string& recipe);
// Every family, in the order the plots draw them.
std::vector<std::string> recipe_families();

}  // namespace scalify::compare
