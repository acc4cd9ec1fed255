#include "weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"

namespace dzr {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string supported_codes() {
    std::string s;
#define DZR_X(e, n, st, b) s += std::string(s.empty() ? "" : ", ") + st;
    DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    return s;
}

/// A JSON number as a non-negative integer (rejects negatives, fractions and values over int64).
std::optional<uint64_t> as_count(const json& v) {
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
        return u;
    }
    if (v.is_number_integer()) {
        int64_t i = v.get<int64_t>();
        if (i < 0) return std::nullopt;
        return uint64_t(i);
    }
    return std::nullopt;
}

/// Parses the header text, recording the first duplicated key of any object (nlohmann keeps only one
/// of them silently).
json parse_header(const std::string& text, const fs::path& path) {
    std::vector<std::set<std::string>> open_objects;
    std::string duplicate;
    auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
        switch (event) {
            case json::parse_event_t::object_start:
                open_objects.emplace_back();
                break;
            case json::parse_event_t::object_end:
                if (!open_objects.empty()) open_objects.pop_back();
                break;
            case json::parse_event_t::key:
                if (!open_objects.empty() && parsed.is_string()) {
                    const auto& k = parsed.get_ref<const std::string&>();
                    if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
                }
                break;
            default:
                break;
        }
        return true;
    };
    json header;
    try {
        header = json::parse(text, callback);
    } catch (const json::exception& e) {
        DZR_THROW("{}: safetensors header is not valid JSON: {}", path.string(), e.what());
    }
    DZR_CHECK(duplicate.empty(), "{}: safetensors header: tensor {} is listed more than once", path.string(),
              duplicate);
    return header;
}

}  // namespace

// ---- MappedFile ----

MappedFile::MappedFile(const fs::path& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DZR_CHECK(fd >= 0, "cannot open {}: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        DZR_THROW("cannot stat {}: {}", path.string(), std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        DZR_THROW("{} is not a regular file", path.string());
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            DZR_THROW("cannot map {} ({} bytes): {}", path.string(), size_, std::strerror(err));
        }
        data_ = p;
    }
    ::close(fd);  // NOTE: the mapping stays valid after the descriptor is closed
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(data_, size_);
}

// ---- SafetensorsFile ----

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
    std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->map_ = std::make_shared<MappedFile>(path);
    const std::string file = path.string();
    const uint64_t size = f->map_->bytes();

    DZR_CHECK(size >= 8, "{}: file is {} bytes, too short for a safetensors header (at least 8 needed)", file,
              size);
    const uint8_t* p = f->map_->bytes_ptr();
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];  // little-endian u64
    DZR_CHECK(n <= kSafetensorsMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", file, n,
              kSafetensorsMaxHeaderBytes);
    DZR_CHECK(8 + n <= size, "{}: header length {} runs past the end of the file ({} bytes; truncated?)",
              file, n, size);
    f->header_size_ = n;
    const uint64_t data_size = size - 8 - n;

    const std::string text(reinterpret_cast<const char*>(p + 8), size_t(n));
    DZR_CHECK(!text.empty() && text[0] == '{', "{}: safetensors header does not start with '{{'", file);
    const json header = parse_header(text, path);
    DZR_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", file);

    for (const auto& [name, value] : header.items()) {
        if (name == "__metadata__") {
            DZR_CHECK(value.is_object(), "{}: __metadata__ must be an object of strings", file);
            for (const auto& [mk, mv] : value.items()) {
                DZR_CHECK(mv.is_string(), "{}: __metadata__ entry {} must be a string, got {}", file, mk,
                          mv.type_name());
                f->metadata_[mk] = mv.get<std::string>();
            }
            continue;
        }
        DZR_CHECK(value.is_object(), "{}: tensor {}: header entry must be an object, got {}", file, name,
                  value.type_name());
        for (const auto& [field, unused] : value.items()) {
            (void)unused;
            DZR_CHECK(field == "dtype" || field == "shape" || field == "data_offsets",
                      "{}: tensor {}: unknown header field '{}'", file, name, field);
        }
        DZR_CHECK(value.contains("dtype") && value.contains("shape") && value.contains("data_offsets"),
                  "{}: tensor {}: header entry needs dtype, shape and data_offsets", file, name);

        SafetensorsEntry e;
        e.name = name;
        const json& jd = value["dtype"];
        DZR_CHECK(jd.is_string(), "{}: tensor {}: dtype must be a string", file, name);
        const std::string code = jd.get<std::string>();
        auto dt = dtype_from_safetensors_code(code);
        DZR_CHECK(dt.has_value(), "{}: tensor {}: unsupported dtype {} (supported: {})", file, name, code,
                  supported_codes());
        e.dtype = *dt;

        const json& js = value["shape"];
        DZR_CHECK(js.is_array(), "{}: tensor {}: shape must be an array", file, name);
        DZR_CHECK(js.size() <= size_t(kMaxDims), "{}: tensor {}: rank {} exceeds the supported maximum of {}",
                  file, name, js.size(), kMaxDims);
        std::vector<int64_t> dims;
        uint64_t numel = 1;
        bool overflow = false;
        for (const auto& d : js) {
            auto v = as_count(d);
            DZR_CHECK(v.has_value(),
                      "{}: tensor {}: shape {} has an entry that is not a non-negative integer", file, name,
                      js.dump());
            dims.push_back(int64_t(*v));
            overflow = overflow || __builtin_mul_overflow(numel, *v, &numel);
        }
        e.shape = Shape(dims);

        const json& jo = value["data_offsets"];
        DZR_CHECK(jo.is_array() && jo.size() == 2, "{}: tensor {}: data_offsets must be [begin, end]", file,
                  name);
        auto b = as_count(jo[0]);
        auto en = as_count(jo[1]);
        DZR_CHECK(b.has_value() && en.has_value(),
                  "{}: tensor {}: data_offsets {} must be non-negative integers", file, name, jo.dump());
        e.begin = *b;
        e.end = *en;
        DZR_CHECK(e.begin <= e.end, "{}: tensor {}: data_offsets [{}, {}] end before they begin", file, name,
                  e.begin, e.end);
        uint64_t expected = 0;
        overflow = overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &expected);
        DZR_CHECK(!overflow && expected == e.end - e.begin,
                  "{}: tensor {}: {} {} needs {} bytes but data_offsets [{}, {}] span {}", file, name, code,
                  e.shape.str(), overflow ? std::string("too many") : std::to_string(expected), e.begin,
                  e.end, e.end - e.begin);
        DZR_CHECK(e.end <= data_size,
                  "{}: tensor {}: data_offsets [{}, {}] run past the end of the data buffer ({} bytes)", file,
                  name, e.begin, e.end, data_size);
        f->entries_.push_back(std::move(e));
    }

    std::sort(f->entries_.begin(), f->entries_.end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                  return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
              });
    uint64_t pos = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const auto& e : f->entries_) {
        if (e.begin < pos) {
            DZR_THROW("{}: tensors {} and {} overlap (bytes [{}, {}) and [{}, {}))", file, prev->name, e.name,
                      prev->begin, prev->end, e.begin, e.end);
        }
        if (e.begin > pos) {
            DZR_THROW(
                "{}: {} unused bytes in the data buffer before tensor {} (bytes [{}, {}) are not covered)",
                file, e.begin - pos, e.name, pos, e.begin);
        }
        pos = e.end;
        prev = &e;
    }
    DZR_CHECK(pos == data_size, "{}: {} bytes after the last tensor{} are not covered by any tensor", file,
              data_size - pos, prev ? " (" + prev->name + ")" : std::string());

    for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
    return f;
}

const SafetensorsEntry* SafetensorsFile::entry(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view_of(const SafetensorsEntry& e) const {
    auto* base = static_cast<uint8_t*>(map_->data());
    void* data = base ? base + data_offset() + e.begin : nullptr;
    return TensorView(data, e.dtype, e.shape);
}

std::optional<TensorView> SafetensorsFile::find(const std::string& name) const {
    const SafetensorsEntry* e = entry(name);
    if (!e) return std::nullopt;
    return view_of(*e);
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
    const SafetensorsEntry* e = entry(name);
    DZR_CHECK(e != nullptr, "{}: no tensor named {}", path_.string(), name);
    return Tensor(map_, view_of(*e));
}

// ---- writer ----

namespace {

/// Specs sorted by name; throws on duplicates.
std::vector<size_t> key_order(const std::vector<SafetensorsTensorSpec>& specs, const std::string& file) {
    std::vector<size_t> order(specs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return specs[a].name < specs[b].name; });
    for (size_t i = 1; i < order.size(); ++i)
        DZR_CHECK(specs[order[i]].name != specs[order[i - 1]].name, "{}: tensor {} given twice to the writer",
                  file, specs[order[i]].name);
    for (const auto& s : specs)
        DZR_CHECK(s.name != "__metadata__" && !s.name.empty(), "{}: invalid tensor name '{}'", file, s.name);
    return order;
}

json header_object(const std::vector<SafetensorsTensorSpec>& specs, const std::vector<size_t>& order,
                   const std::map<std::string, std::string>& metadata) {
    json h = json::object();
    if (!metadata.empty()) {
        json m = json::object();
        for (const auto& [k, v] : metadata) m[k] = v;
        h["__metadata__"] = m;
    }
    uint64_t pos = 0;
    for (size_t i : order) {
        const auto& s = specs[i];
        json shape = json::array();
        for (int d = 0; d < s.shape.rank(); ++d) shape.push_back(s.shape[d]);
        h[s.name] = {{"dtype", std::string(dtype_safetensors_code(s.dtype))},
                     {"shape", shape},
                     {"data_offsets", {pos, pos + s.nbytes()}}};
        pos += s.nbytes();
    }
    return h;
}

void write_all(std::FILE* f, const void* data, size_t n, const std::string& file) {
    if (n == 0) return;
    DZR_CHECK(std::fwrite(data, 1, n, f) == n, "cannot write {}: {}", file, std::strerror(errno));
}

}  // namespace

std::string safetensors_header_json(const std::vector<SafetensorsTensorSpec>& specs,
                                    const std::map<std::string, std::string>& metadata) {
    return header_object(specs, key_order(specs, "<header>"), metadata).dump();
}

void write_safetensors(const fs::path& path, const std::vector<SafetensorsTensorSpec>& specs,
                       const std::map<std::string, std::string>& metadata, const SafetensorsFill& fill) {
    const std::string file = path.string();
    const auto order = key_order(specs, file);
    std::string header = header_object(specs, order, metadata).dump();
    while ((8 + header.size()) % 8 != 0) header.push_back(' ');  // data starts 8-byte aligned

    const fs::path tmp = fs::path(file + ".tmp-" + std::to_string(::getpid()));
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    DZR_CHECK(f != nullptr, "cannot create {}: {}", tmp.string(), std::strerror(errno));
    try {
        uint8_t len[8];
        uint64_t n = header.size();
        for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
        write_all(f, len, 8, file);
        write_all(f, header.data(), header.size(), file);
        std::vector<uint8_t> buf;
        for (size_t i : order) {
            buf.assign(size_t(specs[i].nbytes()), 0);
            fill(i, buf);
            DZR_CHECK(buf.size() == specs[i].nbytes(),
                      "{}: tensor {}: the fill produced {} bytes, expected {}", file, specs[i].name,
                      buf.size(), specs[i].nbytes());
            write_all(f, buf.data(), buf.size(), file);
        }
        DZR_CHECK(std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0, "cannot write {}: {}", file,
                  std::strerror(errno));
        DZR_CHECK(std::fclose(f) == 0, "cannot write {}: {}", file, std::strerror(errno));
        f = nullptr;
        std::error_code ec;
        fs::rename(tmp, path, ec);
        DZR_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), file, ec.message());
    } catch (...) {
        if (f) std::fclose(f);
        std::error_code ec;
        fs::remove(tmp, ec);
        throw;
    }
}

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::vector<SafetensorsTensorSpec> specs;
    specs.reserve(tensors.size());
    for (const auto& [name, v] : tensors) {
        DZR_CHECK(v.device.is_cpu(), "{}: tensor {} is not on the host", path.string(), name);
        specs.push_back({name, v.dtype, v.shape});
    }
    write_safetensors(path, specs, metadata, [&](size_t i, std::vector<uint8_t>& out) {
        const TensorView& src = tensors[i].second;
        if (out.empty()) return;
        if (src.is_contiguous()) {
            std::memcpy(out.data(), src.data, out.size());
            return;
        }
        // NOTE: a byte-exact gather (no conversion), so i64 and f8 values survive unchanged.
        const size_t es = dtype_size(src.dtype);
        const int rank = src.rank();
        std::vector<int64_t> idx(size_t(rank), 0);
        const auto* base = static_cast<const uint8_t*>(src.data);
        for (int64_t n = 0; n < src.numel(); ++n) {
            int64_t off = 0;
            for (int d = 0; d < rank; ++d) off += idx[size_t(d)] * src.strides[d];
            std::memcpy(out.data() + size_t(n) * es, base + off * int64_t(es), es);
            for (int d = rank - 1; d >= 0; --d) {
                if (++idx[size_t(d)] < src.shape[d]) break;
                idx[size_t(d)] = 0;
            }
        }
    });
}

}  // namespace dzr
