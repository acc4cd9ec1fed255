#include "weights/quantize_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/output_guard.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/parallel.h"
#include "weights/checksums.h"
#include "weights/fp8_weights.h"
#include "weights/safetensors.h"

namespace dzr {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// What one output tensor is made of.
enum class Source : uint8_t {
    Copy,        // the stored bytes of `key`
    Quantize,    // E4M3 values of the float weight `key`
    Scale,       // the per-channel scales of the float weight `from`
    Dequantize,  // bf16 values of the F8_E4M3 weight `key` (times its scale)
};

struct OutTensor {
    std::string key;   // name in OUT
    std::string from;  // key in IN
    Source source = Source::Copy;
    DType dtype = DType::F32;
    Shape shape;
    uint64_t nbytes() const { return uint64_t(shape.numel()) * dtype_size(dtype); }
};

std::string shard_name(size_t i, size_t n) {
    return n == 1 ? std::string("model.safetensors") : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

void write_text_file(const fs::path& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    DZR_CHECK(f != nullptr, "cannot create {}: {}", path.string(), std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    DZR_CHECK(ok && closed, "cannot write {}: {}", path.string(), std::strerror(errno));
}

/// The output tensors in groups that share a shard (a weight and its scale), in the inventory's order, then what IN
/// holds beyond it (backbone keys) in key order.
std::vector<std::vector<OutTensor>> plan_tensors(const Checkpoint& in, const std::vector<ExpectedWeight>& expected,
                                                 Precision precision, QuantizeResult& r) {
    std::vector<std::vector<OutTensor>> groups;
    std::set<std::string> done;
    for (const ExpectedWeight& e : expected) {
        const auto v = in.find(e.key);
        DZR_ASSERT(v.has_value());  // check_weights passed
        done.insert(e.key);
        const bool stored_fp8 = v->dtype == DType::F8_E4M3;
        if (stored_fp8) done.insert(fp8_scale_key(e.key));
        if (precision == Precision::Fp8 && e.linear && !stored_fp8 && fp8_by_default(e.key)) {
            groups.push_back({{e.key, e.key, Source::Quantize, DType::F8_E4M3, e.shape},
                              {fp8_scale_key(e.key), e.key, Source::Scale, DType::F32, Shape{e.shape[0]}}});
            ++r.converted;
        } else if (precision == Precision::Bf16 && stored_fp8) {
            groups.push_back({{e.key, e.key, Source::Dequantize, DType::BF16, e.shape}});
            ++r.converted;
        } else if (stored_fp8) {
            const std::string s = fp8_scale_key(e.key);
            groups.push_back({{e.key, e.key, Source::Copy, v->dtype, v->shape},
                              {s, s, Source::Copy, DType::F32, Shape{e.shape[0]}}});
            r.copied += 2;
        } else {
            groups.push_back({{e.key, e.key, Source::Copy, v->dtype, v->shape}});
            ++r.copied;
        }
    }
    for (const std::string& k : in.keys()) {
        if (done.count(k)) continue;
        const auto v = in.find(k);
        groups.push_back({{k, k, Source::Copy, v->dtype, v->shape}});
        ++r.copied;
    }
    return groups;
}

/// The bytes of one output tensor.
void fill_tensor(const Checkpoint& in, const OutTensor& t, std::vector<uint8_t>& out) {
    const TensorView v = *in.find(t.from);
    switch (t.source) {
        case Source::Copy:
            DZR_ASSERT(v.is_contiguous() && v.nbytes() == out.size());
            if (!out.empty()) std::memcpy(out.data(), v.data, out.size());
            return;
        case Source::Quantize: {
            const Fp8Weight q = quantize_weight_fp8(v, t.from);
            std::memcpy(out.data(), q.q.data(), out.size());
            return;
        }
        case Source::Scale: {
            const Fp8Weight q = quantize_weight_fp8(v, t.from, true);
            std::memcpy(out.data(), q.scale.data(), out.size());
            return;
        }
        case Source::Dequantize: {
            const TensorView scale = *in.find(fp8_scale_key(t.from));
            dequantize_rows_fp8_host(v, scale, TensorView(out.data(), DType::BF16, t.shape));
            return;
        }
    }
}

/// Every regular file of IN that is not a shard, the index or the checksum list (config.json, experiment_cfg/,
/// the tokenizer, ...), as paths relative to IN.
std::vector<std::string> companion_files(const Checkpoint& in) {
    std::set<std::string> skip = {"model.safetensors.index.json", kChecksumsFile};
    for (const auto& s : in.shards()) skip.insert(s.name);
    std::vector<std::string> files;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(in.dir(), ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        const std::string rel = fs::relative(it->path(), in.dir()).generic_string();
        if (!rel.empty() && rel[0] == '.') {
            if (it->is_directory()) it.disable_recursion_pending();
            continue;  // hidden files and directories (a `dzr ckpt make` temp dir)
        }
        if (it->is_regular_file() && !skip.count(rel)) files.push_back(rel);
    }
    DZR_CHECK(!ec, "cannot list {}: {}", in.dir().string(), ec.message());
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace

QuantizeResult quantize_checkpoint(const Checkpoint& in, const std::vector<ExpectedWeight>& expected,
                                   const fs::path& out, const QuantizeOptions& options) {
    DZR_CHECK(options.shard_size > 0, "ckpt quantize: the shard size must be positive");
    const WeightCheckReport check = check_weights(in, expected);
    DZR_CHECK(check.ok(), "ckpt quantize: {}", check.message("checkpoint " + in.dir().string()));
    std::error_code ec;
    const fs::path abs = fs::absolute(out).lexically_normal();
    DZR_CHECK(!fs::exists(abs, ec) || !fs::equivalent(abs, in.dir(), ec),
              "ckpt quantize: the output {} is the input checkpoint", out.string());
    // NOTE: nor inside it (IN/sub would add files to the input checkpoint)
    io::InputSet inputs;
    inputs.add_dir(in.dir(), "input checkpoint");
    inputs.check_output_dir(abs);
    if (fs::exists(abs, ec))
        DZR_CHECK(fs::is_directory(abs, ec) && fs::is_empty(abs, ec),
                  "ckpt quantize: output {} already exists and is not an empty directory", out.string());
    const fs::path name = abs.has_filename() ? abs.filename() : abs.parent_path().filename();
    const fs::path parent = abs.has_filename() ? abs.parent_path() : abs.parent_path().parent_path();
    DZR_CHECK(fs::is_directory(parent, ec), "ckpt quantize: cannot write {}: the parent directory {} does not exist",
              out.string(), parent.string());

    QuantizeResult r;
    r.in_bytes = in.tensor_bytes();
    const std::vector<std::vector<OutTensor>> groups = plan_tensors(in, expected, options.precision, r);
    // NOTE: greedy split in order, as `dzr ckpt make` does; a weight and its scale never part
    std::vector<std::vector<const OutTensor*>> shards(1);
    std::vector<uint64_t> shard_bytes(1, 0);
    for (const auto& g : groups) {
        uint64_t bytes = 0;
        for (const auto& t : g) bytes += t.nbytes();
        if (!shards.back().empty() && shard_bytes.back() + bytes > options.shard_size) {
            shards.emplace_back();
            shard_bytes.push_back(0);
        }
        for (const auto& t : g) shards.back().push_back(&t);
        shard_bytes.back() += bytes;
        r.out_bytes += bytes;
        r.tensors += g.size();
    }
    r.shards = shards.size();

    const fs::path tmp = parent / fmt::format(".{}.tmp-{}", name.string(), ::getpid());
    fs::remove_all(tmp, ec);
    DZR_CHECK(fs::create_directories(tmp, ec), "ckpt quantize: cannot create {}: {}", tmp.string(), ec.message());
    try {
        std::vector<std::string> files = companion_files(in);
        for (const std::string& f : files) {
            fs::create_directories((tmp / f).parent_path(), ec);
            fs::copy_file(in.dir() / f, tmp / f, ec);
            DZR_CHECK(!ec, "ckpt quantize: cannot copy {}: {}", (in.dir() / f).string(), ec.message());
        }
        const std::map<std::string, std::string> metadata = {
            {"format", "pt"},
            {"dzr_precision", precision_name(options.precision)},
            {"dzr_fp8_scheme", "e4m3 weights, f32 <module>.weight_scale per output channel = amax / 448"}};
        const size_t threads = options.threads > 0 ? size_t(options.threads) : worker_threads(shards.size());
        parallel_for(shards.size(), threads, [&](size_t s) {
            std::vector<SafetensorsTensorSpec> specs;
            for (const OutTensor* t : shards[s]) specs.push_back({t->key, t->dtype, t->shape});
            write_safetensors(tmp / shard_name(s, shards.size()), specs, metadata,
                              [&](size_t i, std::vector<uint8_t>& bytes) { fill_tensor(in, *shards[s][i], bytes); });
        });
        for (size_t s = 0; s < shards.size(); ++s) files.push_back(shard_name(s, shards.size()));
        if (shards.size() > 1) {
            json weight_map = json::object();
            for (size_t s = 0; s < shards.size(); ++s)
                for (const OutTensor* t : shards[s]) weight_map[t->key] = shard_name(s, shards.size());
            const json index = {{"metadata", {{"total_size", r.out_bytes}}}, {"weight_map", weight_map}};
            write_text_file(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
            files.push_back("model.safetensors.index.json");
        }
        write_checksums(tmp, files);
        // NOTE: the result is read back as any checkpoint is (structure, every shard, the inventory, every scale)
        const Checkpoint written(tmp);
        const WeightCheckReport back = check_weights(written, expected);
        DZR_CHECK(back.ok(), "ckpt quantize: the written checkpoint does not check: {}", back.message(tmp.string()));
        fs::rename(tmp, abs, ec);
        DZR_CHECK(!ec, "ckpt quantize: cannot rename {} to {}: {}", tmp.string(), abs.string(), ec.message());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    return r;
}

}  // namespace dzr
