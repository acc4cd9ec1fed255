#include "weights/inventory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "weights/fp8_weights.h"
#include "weights/keys.h"

namespace dzr {

std::string_view component_name(Component c) {
    switch (c) {
        case Component::Dit:
            return "DiT";
        case Component::TextEncoder:
            return "text encoder";
        case Component::ImageEncoder:
            return "image encoder";
        case Component::Vae:
            return "VAE";
        case Component::Backbone:
            return "backbone";
        case Component::Other:
            return "other";
    }
    return "?";
}

Component component_of(std::string_view key) {
    if (keys::has_prefix(key, keys::kDit)) return Component::Dit;
    if (keys::has_prefix(key, keys::kTextEncoder)) return Component::TextEncoder;
    if (keys::has_prefix(key, keys::kImageEncoder)) return Component::ImageEncoder;
    if (keys::has_prefix(key, keys::kVae)) return Component::Vae;
    if (keys::has_prefix(key, keys::kBackbone)) return Component::Backbone;
    return Component::Other;
}

uint64_t ComponentCensus::total_tensors() const {
    uint64_t n = 0;
    for (auto v : tensors) n += v;
    return n;
}

uint64_t ComponentCensus::total_params() const {
    uint64_t n = 0;
    for (auto v : params) n += v;
    return n;
}

ComponentCensus census(const std::vector<ExpectedWeight>& weights) {
    ComponentCensus c;
    for (const auto& w : weights) {
        c.tensors[size_t(w.component)] += 1;
        c.params[size_t(w.component)] += uint64_t(w.shape.numel());
    }
    return c;
}

bool is_lora_key(std::string_view key) {
    for (std::string_view marker :
         {".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude"})
        if (key.find(marker) != std::string_view::npos) return true;
    return false;
}

bool WeightCheckReport::ok() const {
    return missing.empty() && unexpected.empty() && lora.empty() && shape_mismatch.empty() &&
           dtype_mismatch.empty() && fp8_scale.empty();
}

std::string WeightCheckReport::message(const std::string& what, size_t cap) const {
    if (ok())
        return fmt::format("{}: all {} expected weights present with the expected shapes", what, checked);
    std::vector<std::string> counts;
    auto count = [&](size_t n, const char* one, const char* many) {
        if (n) counts.push_back(fmt::format("{} {}", n, n == 1 ? one : many));
    };
    count(missing.size(), "missing", "missing");
    count(unexpected.size(), "unexpected", "unexpected");
    count(shape_mismatch.size(), "with the wrong shape", "with the wrong shape");
    count(dtype_mismatch.size(), "with the wrong dtype", "with the wrong dtype");
    count(fp8_scale.size(), "FP8 weight with a bad scale", "FP8 weights with a bad scale");
    count(lora.size(), "LoRA adapter tensor", "LoRA adapter tensors");
    std::string msg =
        fmt::format("{} does not match the expected weights: {}", what, fmt::join(counts, ", "));

    auto group = [&](const char* title, size_t n, const std::string& note, auto&& line) {
        if (n == 0) return;
        msg += fmt::format("\n  {} ({}){}:", title, n, note);
        for (size_t i = 0; i < n && i < cap; ++i) msg += "\n    " + line(i);
        if (n > cap) msg += fmt::format("\n    ... and {} more", n - cap);
    };
    group("missing", missing.size(), "",
          [&](size_t i) { return missing[i].key + " " + missing[i].shape.str(); });
    group("unexpected", unexpected.size(), "", [&](size_t i) { return unexpected[i]; });
    group("wrong shape", shape_mismatch.size(), "", [&](size_t i) {
        const auto& m = shape_mismatch[i];
        return fmt::format("{}: expected {}, found {} ({})", m.key, m.expected, m.found, m.location);
    });
    group("wrong dtype", dtype_mismatch.size(), "", [&](size_t i) {
        const auto& m = dtype_mismatch[i];
        return fmt::format("{}: expected {}, found {} ({})", m.key, m.expected, m.found, m.location);
    });
    group("bad FP8 scales", fp8_scale.size(), "", [&](size_t i) {
        const auto& m = fp8_scale[i];
        return fmt::format("{}: {} ({})", m.key, m.found, m.location);
    });
    group("LoRA adapters", lora.size(),
          "; unmerged PEFT adapters are not supported: merge them into the base weights and save the "
          "checkpoint "
          "again",
          [&](size_t i) { return lora[i]; });
    return msg;
}

WeightCheckReport check_weights(const WeightSource& source, const std::vector<ExpectedWeight>& expected) {
    WeightCheckReport r;
    std::set<std::string> known;
    for (const auto& e : expected) {
        known.insert(e.key);
        auto v = source.find(e.key);
        if (!v) {
            r.missing.push_back(e);
        } else if (v->shape != e.shape) {
            r.shape_mismatch.push_back({e.key, source.location(e.key), e.shape.str(), v->shape.str()});
        } else if (v->dtype == DType::F8_E4M3 && e.linear) {
            // an FP8 Linear weight: its scale is part of it
            known.insert(fp8_scale_key(e.key));
            const std::string problem = fp8_scale_problem(source, e.key, e.shape[0]);
            if (problem.empty()) {
                ++r.checked;
            } else {
                const auto scale = source.find(fp8_scale_key(e.key));
                r.fp8_scale.push_back({e.key, scale ? source.location(fp8_scale_key(e.key)) : source.location(e.key),
                                       "", problem});
            }
        } else if (v->dtype != DType::BF16 && v->dtype != DType::F16 && v->dtype != DType::F32) {
            r.dtype_mismatch.push_back({e.key, source.location(e.key),
                                        e.linear ? "bf16, f16, f32 or f8_e4m3" : "bf16, f16 or f32",
                                        std::string(dtype_name(v->dtype))});
        } else {
            ++r.checked;
        }
    }
    // NOTE: the safetensors reader checks each tensor's bytes against its dtype and shape, but a label changed between
    // the two 16-bit dtypes passes that and reads as garbage. A network is stored in one 16-bit dtype (f32 beside it
    // is legitimate: norms, scales), so within each network the fewer of bf16 and f16 are refused
    std::map<std::pair<Component, DType>, std::vector<std::string>> half;
    for (const auto& e : expected)
        if (const auto v = source.find(e.key); v && v->shape == e.shape && (v->dtype == DType::BF16 || v->dtype == DType::F16))
            half[{component_of(e.key), v->dtype}].push_back(e.key);
    for (int c = 0; c < kNumComponents; ++c) {
        const auto& bf = half[{Component(c), DType::BF16}];
        const auto& f16 = half[{Component(c), DType::F16}];
        if (bf.empty() || f16.empty()) continue;
        const bool bf16_common = bf.size() >= f16.size();
        const auto& common = bf16_common ? bf : f16;
        for (const auto& key : bf16_common ? f16 : bf) {
            r.dtype_mismatch.push_back({key, source.location(key),
                                        fmt::format("{} like the {}'s {} other 16-bit weights (a relabelled tensor?)",
                                                    bf16_common ? "bf16" : "f16", component_name(Component(c)),
                                                    common.size()),
                                        bf16_common ? "f16" : "bf16"});
            --r.checked;
        }
    }
    for (const auto& k : source.keys()) {
        if (known.count(k) || component_of(k) == Component::Backbone) continue;
        if (is_lora_key(k)) {
            r.lora.push_back(k);
        } else {
            r.unexpected.push_back(k + " (" + source.location(k) + ")");
        }
    }
    return r;
}

}  // namespace dzr
