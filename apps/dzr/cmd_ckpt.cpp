// `dzr ckpt inspect|validate|make|quantize`: look into, check, create or re-store DreamZero checkpoint directories.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apps/dzr/command.h"
#include "config/embodiment.h"
#include "config/model_fields.h"
#include "config/run_config.h"
#include "core/error.h"
#include "model/inventory.h"
#include "policy/normalization.h"
#include "policy/tokenizer.h"
#include "weights/checkpoint.h"
#include "weights/checksums.h"
#include "weights/inventory.h"
#include "weights/quantize_checkpoint.h"
#include "weights/random_checkpoint.h"

namespace dzr::app {
namespace {

using config::format_bytes;
using config::format_count;

/// `make` refuses to write more than this without --force (the DROID geometry is ~46 GB).
constexpr uint64_t kMakeForceBytes = 4ull << 30;

struct CkptOptions {
    std::string dir;
    std::string config;
    std::vector<std::string> sets;
    uint64_t seed = 0;
    std::string out;
    std::string tokenizer;
    std::string dtype = "bf16";
    std::string shard_size = "5GB";
    std::string embodiment;
    bool dry_run = false;
    bool force = false;
    bool hash = false;
    int threads = 0;
    std::string precision;  // quantize
    int outlier_columns = 0;  // make
    std::optional<float> outlier_scale;
};

std::vector<config::Override> overrides(const CkptOptions& o) {
    std::vector<config::Override> v;
    for (const auto& s : o.sets) v.push_back(config::parse_override(s));
    return v;
}

std::string geometry_lines(const ModelConfig& m) {
    const auto& d = m.dit;
    const auto& t = m.t5;
    const auto& c = m.clip;
    const auto& v = m.vae;
    std::string s;
    s += fmt::format(
        "  DiT: {} layers, dim {}, {} heads x {}, ffn {}, in {} / out {}, patch [{}], text {}x{}, "
        "image dim {}\n",
        d.num_layers, d.dim, d.num_heads, d.head_dim(), d.ffn_dim, d.in_dim, d.out_dim,
        fmt::join(d.patch_size, ", "), d.text_len, d.text_dim, d.image_dim);
    s += fmt::format(
        "       frame_seqlen {}, {} frames + {} actions + {} state per block, max_chunk_size {} "
        "(window {} frames), action_dim {}, state_dim {}, hidden {}\n",
        d.frame_seqlen, d.num_frame_per_block, d.num_action_per_block, d.num_state_per_block,
        d.max_chunk_size, d.local_attn_size(), d.action_dim, d.max_state_dim, d.hidden_size);
    s += fmt::format("  umT5: vocab {}, dim {}, {} heads (attn {}), ffn {}, {} layers, {} buckets\n", t.vocab,
                     t.dim, t.num_heads, t.dim_attn, t.ffn_dim, t.num_layers, t.num_buckets);
    s += fmt::format(
        "  CLIP: {}px / patch {}, width {}, {} heads, mlp {}, {} layers stored ({} run), embed {}\n",
        c.image_size, c.patch_size, c.width, c.num_heads, c.mlp_dim, c.num_layers, c.use_layers, c.embed_dim);
    std::vector<std::string> td;
    for (bool b : v.temporal_downsample) td.push_back(b ? "true" : "false");
    s += fmt::format("  VAE: base {}, z {}, dim_mult [{}], {} res blocks, temporal [{}], decoder {}\n",
                     v.base_dim, v.z_dim, fmt::join(v.dim_mult, ", "), v.num_res_blocks, fmt::join(td, ", "),
                     v.has_decoder ? "yes" : "no");
    s += fmt::format("  head: num_frames {}, action_horizon {}, max_action_dim {}, canvas {}x{}\n",
                     m.num_frames, m.action_horizon, m.max_action_dim, m.canvas_height, m.canvas_width);
    return s;
}

/// The embodiments of experiment_cfg (or the built-ins bound to metadata.json), each checked against the
/// checkpoint's geometry.
void print_embodiments(const Checkpoint& ck) {
    CheckpointEmbodiments ce;
    try {
        ce = load_checkpoint_embodiments(ck.dir());
    } catch (const Error& e) {
        fmt::print("\nembodiments: cannot be read: {}\n", e.what());
        return;
    }
    fmt::print("\nembodiments ({}):\n", ce.has_conf ? "experiment_cfg/conf.yaml, statistics from metadata.json"
                                                     : "no experiment_cfg/conf.yaml: built-in descriptions, statistics "
                                                       "from metadata.json");
    for (const auto& e : ce.embodiments) {
        std::string text = e.describe();
        if (e.has_statistics) {
            try {
                check_embodiment(e, ck.model_config());
                text += "  fits this checkpoint's geometry\n";
            } catch (const Error& err) {
                text += fmt::format("  does not fit this checkpoint: {}\n", err.what());
            }
        } else {
            text += "  not usable: experiment_cfg/metadata.json has no statistics for it\n";
        }
        fmt::print("  {}", text);
    }
    for (const auto& [tag, why] : ce.unusable) fmt::print("  {}: not usable: {}\n", tag, why);
    if (ce.embodiments.empty() && ce.unusable.empty()) fmt::print("  none\n");
}

int run_inspect(const CkptOptions& o) {
    Checkpoint ck(o.dir);
    struct Row {
        uint64_t tensors = 0, params = 0, bytes = 0;
        std::map<std::string, uint64_t> dtypes;
        std::set<std::string> shards;
    };
    std::array<Row, kNumComponents> rows;
    Row total;
    for (const auto& key : ck.keys()) {
        const SafetensorsEntry* e = ck.entry(key);
        const std::string shard = ck.shard_of(key)->name;
        for (Row* r : {&rows[size_t(component_of(key))], &total}) {
            r->tensors += 1;
            r->params += uint64_t(e->shape.numel());
            r->bytes += e->nbytes();
            r->dtypes[std::string(dtype_name(e->dtype))] += 1;
            r->shards.insert(shard);
        }
    }
    fmt::print("checkpoint {}\n", ck.dir().string());
    fmt::print("  {} shard{}{}; {} of tensors\n", ck.shards().size(), ck.shards().size() == 1 ? "" : "s",
               ck.has_index() ? " (model.safetensors.index.json)" : "", format_bytes(ck.tensor_bytes()));
    fmt::print("\n{:<14} {:>8} {:>16} {:>16} {:>7}  {}\n", "component", "tensors", "parameters", "bytes",
               "shards", "dtypes");
    auto print_row = [](std::string_view name, const Row& r) {
        std::vector<std::string> dt;
        for (const auto& [n, c] : r.dtypes) dt.push_back(fmt::format("{} x{}", n, c));
        fmt::print("{:<14} {:>8} {:>16} {:>16} {:>7}  {}\n", name, r.tensors, format_count(r.params),
                   format_count(r.bytes), r.shards.size(), fmt::join(dt, ", "));
    };
    for (int c = 0; c < kNumComponents; ++c)
        if (rows[size_t(c)].tensors) print_row(component_name(Component(c)), rows[size_t(c)]);
    print_row("total", total);

    fmt::print("\ngeometry (config.json):\n{}", geometry_lines(ck.model_config()));
    if (!ck.defaulted_fields().empty())
        fmt::print("  not in config.json (real DreamZero defaults used): {}\n",
                   fmt::join(ck.defaulted_fields(), ", "));
    const auto problems = config::check_model_config(ck.model_config());
    for (const auto& p : problems) fmt::print("  inconsistent: {}\n", p);

    if (ck.has_metadata()) {
        fmt::print("\nstatistics (experiment_cfg/metadata.json):\n");
        for (const auto& [name, es] : ck.all_statistics()) {
            auto keys = [](const std::map<std::string, KeyStatistics>& g) {
                std::vector<std::string> v;
                for (const auto& [k, s] : g) v.push_back(fmt::format("{}[{}]", k, s.dim()));
                return fmt::format("{}", fmt::join(v, ", "));
            };
            fmt::print("  {}: state {}; action {}\n", name, keys(es.state), keys(es.action));
        }
    } else {
        fmt::print("\nstatistics: experiment_cfg/metadata.json is missing\n");
    }
    print_embodiments(ck);
    const auto tok = ck.tokenizer_path();
    fmt::print("tokenizer: {}\n",
               tok ? tok->string() : std::string("not found in the checkpoint (use --tokenizer)"));
    return 0;
}

int run_validate(const CkptOptions& o) {
    Checkpoint ck(o.dir);  // structure, index and every shard header (throws on the first violation)
    const std::string config_json = (ck.dir() / "config.json").string();
    const ModelConfig& m = ck.model_config();
    std::vector<std::string> problems;

    for (const auto& p : config::check_model_config(m)) problems.push_back(config_json + ": " + p);
    const auto report = check_weights(ck, expected_weights(m));
    if (!report.ok()) problems.push_back(report.message("checkpoint " + ck.dir().string()));
    if (!ck.has_metadata())
        problems.push_back(ck.dir().string() +
                           ": experiment_cfg/metadata.json is missing (normalization statistics)");

    std::optional<config::RunConfig> rc;
    if (!o.config.empty()) rc = config::load_run_config(o.config, overrides(o));
    // The statistics the policy reads (the config's embodiment, else DROID's when present).
    const std::string embodiment = rc ? rc->embodiment : std::string("oxe_droid");
    const std::string metadata_json = (ck.dir() / "experiment_cfg" / "metadata.json").string();
    if (ck.has_metadata() && ck.all_statistics().count(embodiment))
        for (const auto& p : check_policy_statistics(ck.all_statistics().at(embodiment), metadata_json))
            problems.push_back(p);

    // The tokenizer is loaded, not only found: a damaged spiece.model fails here rather than in a rollout.
    std::string tokenizer_note = "no tokenizer in the checkpoint (a rollout then needs --tokenizer)";
    if (const auto tok = ck.tokenizer_path()) {
        try {
            const Umt5Tokenizer t(*tok);
            if (t.vocab_size() > m.t5.vocab)
                problems.push_back(fmt::format("tokenizer {}: {} pieces, more than the text encoder's vocabulary of {}",
                                               tok->string(), t.vocab_size(), m.t5.vocab));
            tokenizer_note = fmt::format("tokenizer {} ({} pieces)", tok->filename().string(), t.vocab_size());
        } catch (const Error& e) {
            problems.push_back(e.what());
        }
    }

    ChecksumReport sums;
    if (o.hash) {
        std::vector<std::string> shard_files;
        for (const auto& s : ck.shards()) shard_files.push_back(s.name);
        sums = verify_checksums(ck.dir(), shard_files);
        for (const auto& p : sums.problems) problems.push_back(p);
    }

    std::string against = "config.json";
    if (rc) {
        const auto diff = config::diff_model_configs(m, rc->model);
        if (!diff.empty()) {
            std::string msg = fmt::format(
                "checkpoint geometry differs from {} ({} field{}; checkpoint vs config):", o.config,
                diff.size(), diff.size() == 1 ? "" : "s");
            for (const auto& d : diff) msg += "\n  " + d;
            problems.push_back(msg);
        }
        against += " and " + o.config;
    }
    if (ck.has_metadata()) {
        // The embodiment asked for (--embodiment, else the config's), else every one with statistics.
        std::string tag = o.embodiment;
        if (tag.empty() && !o.config.empty()) tag = config::load_run_config(o.config, overrides(o)).embodiment;
        try {
            const CheckpointEmbodiments ce = load_checkpoint_embodiments(ck.dir());
            if (!tag.empty()) {
                (void)select_embodiment(ce, tag, m);
            } else {
                for (const auto& e : ce.embodiments)
                    if (e.has_statistics) check_embodiment(e, m);
                if (ce.embodiments.empty()) (void)select_embodiment(ce, "", m);
            }
        } catch (const Error& e) {
            problems.push_back(e.what());
        }
    }
    if (!problems.empty()) {
        std::string msg = fmt::format("{} is not valid ({} problem{}):", ck.dir().string(), problems.size(),
                                      problems.size() == 1 ? "" : "s");
        for (const auto& p : problems) msg += "\n" + p;
        throw Error(msg);
    }
    std::set<std::string> dtypes;
    for (const auto& s : ck.shards())
        for (const auto& e : s.file->entries()) dtypes.insert(std::string(dtype_name(e.dtype)));
    const auto c = census(expected_weights(m));
    if (o.hash) {
        if (sums.had_list) {
            fmt::print("SHA-256: {} file{} match {}\n", sums.matched, sums.matched == 1 ? "" : "s", kChecksumsFile);
        } else {
            fmt::print("SHA-256 (no {} to compare with):\n", kChecksumsFile);
            for (const auto& [name, digest] : sums.computed) fmt::print("{}  {}\n", digest, name);
        }
    }
    fmt::print("OK {}: {} tensors, {} parameters ({}), {} shard{}, {}; geometry matches {}; {}\n",
               ck.dir().string(), report.checked, format_count(c.total_params()), fmt::join(dtypes, ", "),
               ck.shards().size(), ck.shards().size() == 1 ? "" : "s", format_bytes(ck.tensor_bytes()),
               against, tokenizer_note);
    return 0;
}

int run_make(const CkptOptions& o) {
    const auto rc = config::load_run_config(o.config, overrides(o));
    MakeOptions mo;
    mo.seed = o.seed;
    mo.threads = o.threads;
    auto dt = dtype_from_name(o.dtype);
    DZR_CHECK(dt && (*dt == DType::BF16 || *dt == DType::F16 || *dt == DType::F32),
              "--dtype {}: expected bf16, f16 or f32", o.dtype);
    mo.dtype = *dt;
    mo.shard_size = config::parse_byte_size(o.shard_size, "--shard-size");
    if (!o.tokenizer.empty()) mo.tokenizer = resolve_tokenizer_path(o.tokenizer);
    if (!o.embodiment.empty()) {
        const Embodiment e = builtin_embodiment(o.embodiment);
        mo.conf_yaml = experiment_conf_yaml(e, rc.model);
        mo.metadata_json = e.tag == "oxe_droid" ? droid_metadata_json() : synthetic_metadata_json(e);
        // What a rollout reads back, checked before anything is written.
        Embodiment back = parse_experiment_config(mo.conf_yaml, "conf.yaml").at(e.tag);
        bind_metadata(back, parse_embodiment_metadata(mo.metadata_json, "metadata.json").at(e.tag), "metadata.json");
        check_embodiment(back, rc.model);
    }
    DZR_CHECK(o.outlier_columns > 0 || !o.outlier_scale, "ckpt make: --outlier-scale needs --outlier-columns N");
    mo.outliers.columns = o.outlier_columns;
    if (o.outlier_scale) mo.outliers.scale = *o.outlier_scale;
    const MakePlan plan = plan_random_checkpoint(rc.model, mo);
    const size_t outlier_weights = check_outlier_options(plan.weights, mo.outliers);

    const std::string embodiment_note = o.embodiment.empty()
                                            ? std::string(", oxe_droid statistics, no conf.yaml")
                                            : fmt::format(", embodiment {}: conf.yaml + metadata.json", o.embodiment);
    if (o.dry_run)
        fmt::print("plan for the geometry of {} ({}, seed {}{}):\n", o.config, o.dtype, o.seed, embodiment_note);
    else
        fmt::print("writing {} using the geometry of {} ({}, seed {}{}):\n", o.out.empty() ? "(no --out)" : o.out,
                   o.config, o.dtype, o.seed, embodiment_note);
    fmt::print("{:<14} {:>8} {:>16} {:>16}\n", "component", "tensors", "parameters", "bytes");
    for (int c = 0; c < kNumComponents; ++c) {
        if (!plan.census.tensors[size_t(c)]) continue;
        fmt::print("{:<14} {:>8} {:>16} {:>16}\n", component_name(Component(c)),
                   plan.census.tensors[size_t(c)], format_count(plan.census.params[size_t(c)]),
                   format_count(plan.census.params[size_t(c)] * dtype_size(mo.dtype)));
    }
    fmt::print("{:<14} {:>8} {:>16} {:>16}\n", "total", plan.census.total_tensors(),
               format_count(plan.census.total_params()), format_count(plan.total_bytes));
    fmt::print("{} shard{} of at most {}{}; {} of tensors\n", plan.shards.size(),
               plan.shards.size() == 1 ? "" : "s", format_bytes(mo.shard_size),
               plan.indexed() ? " + model.safetensors.index.json" : "", format_bytes(plan.total_bytes));
    if (mo.outliers.enabled())
        fmt::print("outliers: {} input column{} of each of {} FP8 Linear weight{} times {}\n", mo.outliers.columns,
                   mo.outliers.columns == 1 ? "" : "s", outlier_weights, outlier_weights == 1 ? "" : "s",
                   mo.outliers.scale);
    if (o.dry_run) return 0;

    DZR_CHECK(!o.out.empty(), "ckpt make: --out DIR is required (or use --dry-run)");
    DZR_CHECK(
        plan.total_bytes <= kMakeForceBytes || o.force,
        "ckpt make: {} would write {} of weights; pass --force to write it anyway (or --dry-run to see the "
        "plan)",
        o.config, format_bytes(plan.total_bytes));
    write_random_checkpoint(rc.model, mo, o.out);
    fmt::print("wrote {}\n", o.out);
    return 0;
}

int run_quantize(const CkptOptions& o) {
    DZR_CHECK(!o.precision.empty(), "ckpt quantize: --precision fp8 (or bf16) is required");
    QuantizeOptions qo;
    qo.precision = parse_precision(o.precision, "--precision");
    qo.shard_size = config::parse_byte_size(o.shard_size, "--shard-size");
    qo.threads = o.threads;
    const Checkpoint in(o.dir);
    const QuantizeResult r = quantize_checkpoint(in, expected_weights(in.model_config()), o.out, qo);
    fmt::print("wrote {} ({}): {} tensors in {} shard{}, {} Linear weight{} {}, {} copied; {} of tensors (was {})\n",
               o.out, o.precision, r.tensors, r.shards, r.shards == 1 ? "" : "s", r.converted,
               r.converted == 1 ? "" : "s", qo.precision == Precision::Fp8 ? "quantized to f8_e4m3" : "dequantized to bf16",
               r.copied, format_bytes(r.out_bytes), format_bytes(r.in_bytes));
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* ckpt = app.add_subcommand("ckpt", "Inspect, validate, make or quantize DreamZero checkpoint directories");
    ckpt->require_subcommand(1);
    auto opts = std::make_shared<CkptOptions>();

    auto* inspect =
        ckpt->add_subcommand("inspect", "Per-component census, dtypes, shards, config.json geometry and embodiments");
    inspect->add_option("dir", opts->dir, "Checkpoint directory")->required();
    inspect->callback([&run, opts] { run = [opts] { return run_inspect(*opts); }; });

    auto* validate = ckpt->add_subcommand(
        "validate",
        "Check structure, every shard, the expected weights of the config.json geometry (and a YAML config), the "
        "normalization statistics and the tokenizer");
    validate->add_option("dir", opts->dir, "Checkpoint directory")->required();
    validate->add_option("--config", opts->config, "Also require the geometry of this configs/*.yaml");
    validate->add_option("--set", opts->sets, "Override a config key (KEY=VALUE, repeatable)");
    validate->add_option("--embodiment", opts->embodiment, "Check this embodiment (default: the config's, else all)");
    validate->add_flag("--hash", opts->hash,
                       "Compute every shard's SHA-256 and compare with checksums.sha256 when the directory has one");
    validate->callback([&run, opts] { run = [opts] { return run_validate(*opts); }; });

    auto* make = ckpt->add_subcommand("make", "Write a checkpoint of random weights at a config's geometry");
    make->add_option("--config", opts->config, "configs/*.yaml giving the geometry")->required();
    make->add_option("--seed", opts->seed, "Seed of the weights (same seed, same bytes)");
    make->add_option("--out", opts->out, "Output directory (must not exist)");
    make->add_option("--dtype", opts->dtype, "bf16, f16 or f32")->capture_default_str();
    make->add_option("--shard-size", opts->shard_size, "Most tensor bytes per shard (e.g. 5GB, 64MiB)")
        ->capture_default_str();
    make->add_option("--set", opts->sets, "Override a config key (KEY=VALUE, repeatable)");
    make->add_option("--tokenizer", opts->tokenizer, "Copy this umT5 spiece.model into the checkpoint");
    make->add_option("--embodiment", opts->embodiment,
                     "Write experiment_cfg/conf.yaml and metadata.json of this built-in embodiment (oxe_droid, "
                     "agibot, yam)");
    make->add_option("--outlier-columns", opts->outlier_columns,
                     "Multiply this many input columns (chosen per weight from the seed) of every Linear weight that "
                     "--precision fp8 quantizes by --outlier-scale (the FP8 gates, docs/PARITY.md; default 0: none)")
        ->check(CLI::Range(0, 1 << 20));
    make->add_option("--outlier-scale", opts->outlier_scale, "Factor of the outlier columns (default 30)");
    make->add_flag("--dry-run", opts->dry_run, "Print the inventory and sizes, write nothing");
    make->add_flag("--force", opts->force, "Allow writing more than 4 GiB");
    make->add_option("--threads", opts->threads, "Shards written at once (0: up to 8; the bytes never depend on it)")
        ->check(CLI::Range(0, 64));
    make->callback([&run, opts] { run = [opts] { return run_make(*opts); }; });

    auto* quantize = ckpt->add_subcommand(
        "quantize",
        "Rewrite a checkpoint with FP8 DiT Linear weights (f8_e4m3 + per-output-channel f32 <module>.weight_scale; "
        "docs/CHECKPOINTS.md), or back to bf16");
    quantize->add_option("--precision", opts->precision, "fp8 (quantize) or bf16 (dequantize an FP8 checkpoint)")
        ->required();
    quantize->add_option("in", opts->dir, "Checkpoint directory to read")->required();
    quantize->add_option("out", opts->out, "Output directory (must not exist, or be empty)")->required();
    quantize->add_option("--shard-size", opts->shard_size, "Most tensor bytes per shard (e.g. 5GB, 64MiB)")
        ->capture_default_str();
    quantize->add_option("--threads", opts->threads, "Shards written at once (0: up to 8; the bytes never depend on it)")
        ->check(CLI::Range(0, 64));
    quantize->callback([&run, opts] { run = [opts] { return run_quantize(*opts); }; });
});

}  // namespace
}  // namespace dzr::app
