#include "io/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/half.h"
#include "io/atomic_file.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kPreludeV1 = 10;  // magic (6) + version (2) + uint16 header length
constexpr size_t kPreludeV2 = 12;  // magic (6) + version (2) + uint32 header length
// NOTE: numpy caps the header at this size on read unless told otherwise; a larger one is garbage.
constexpr size_t kMaxHeaderLen = 1u << 20;
constexpr int64_t kMaxElements = int64_t(1) << 40;

struct DTypeInfo {
    NpyDType dtype;
    std::string_view descr;
    std::string_view name;
    size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {NpyDType::F2, "<f2", "float16", 2}, {NpyDType::F4, "<f4", "float32", 4},
    {NpyDType::F8, "<f8", "float64", 8}, {NpyDType::U1, "|u1", "uint8", 1},
    {NpyDType::I4, "<i4", "int32", 4},   {NpyDType::I8, "<i8", "int64", 8},
};

const DTypeInfo& info(NpyDType t) {
    for (const auto& d : kDTypes)
        if (d.dtype == t) return d;
    DZR_ASSERT(false);
}

/// Maps a descr string to a supported dtype, or throws an error saying why it is not supported.
NpyDType dtype_from_descr(const std::string& descr, const std::string& name) {
    for (const auto& d : kDTypes)
        if (descr == d.descr) return d.dtype;
    // numpy writes one-byte types with '|', but '<' and '=' are harmless spellings of the same.
    if (descr == "<u1" || descr == "=u1") return NpyDType::U1;
    DZR_CHECK(descr.empty() || descr[0] != '>',
              "{}: big-endian dtype '{}' is not supported (convert with arr.astype('<{}'))", name, descr,
              descr.substr(1));
    DZR_CHECK(descr.find('O') == std::string::npos,
              "{}: object dtype '{}' is not supported (save a numeric array)", name, descr);
    DZR_THROW("{}: unsupported dtype '{}' (expected one of <f2 <f4 <f8 |u1 <i4 <i8)", name, descr);
}

uint32_t read_le(std::string_view b, size_t off, size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint32_t(uint8_t(b[off + i])) << (8 * i);
    return v;
}

/// Recursive-descent reader for the Python dict literal numpy writes:
///   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
public:
    HeaderParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

    NpyHeader parse() {
        NpyHeader h;
        std::optional<std::string> descr;
        std::optional<bool> fortran;
        std::optional<std::vector<int64_t>> shape;
        skip_ws();
        expect('{');
        skip_ws();
        while (peek() != '}') {
            const std::string key = parse_string();
            skip_ws();
            expect(':');
            skip_ws();
            if (key == "descr") {
                check_unique(descr.has_value(), key);
                DZR_CHECK(peek() == '\'' || peek() == '"',
                          "{}: unsupported dtype description in header at offset {} (structured or "
                          "non-string 'descr' values are not supported)", name_, pos_);
                descr = parse_string();
            } else if (key == "fortran_order") {
                check_unique(fortran.has_value(), key);
                fortran = parse_bool();
            } else if (key == "shape") {
                check_unique(shape.has_value(), key);
                shape = parse_tuple();
            } else {
                DZR_THROW("{}: malformed NPY header: unexpected key '{}' (expected descr, fortran_order, "
                          "shape)", name_, key);
            }
            skip_ws();
            if (peek() == ',') {
                ++pos_;
                skip_ws();
            } else if (peek() != '}') {
                fail("',' or '}'");
            }
        }
        ++pos_;
        skip_ws();
        DZR_CHECK(pos_ == s_.size(), "{}: malformed NPY header: unexpected text after the dictionary at "
                  "offset {}", name_, pos_);
        DZR_CHECK(descr && fortran && shape, "{}: malformed NPY header: missing key '{}'", name_,
                  !descr ? "descr" : !fortran ? "fortran_order" : "shape");
        DZR_CHECK(!*fortran, "{}: Fortran-order arrays are not supported (save a C-order array, e.g. "
                  "np.save(path, np.ascontiguousarray(a)))", name_);
        h.dtype = dtype_from_descr(*descr, name_);
        h.shape = std::move(*shape);
        return h;
    }

private:
    char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }

    [[noreturn]] void fail(std::string_view expected) const {
        const std::string found = pos_ < s_.size() ? fmt::format("'{}'", s_.substr(pos_, 12)) : "end of header";
        DZR_THROW("{}: malformed NPY header at offset {}: expected {}, found {}", name_, pos_, expected,
                  found);
    }

    void check_unique(bool seen, const std::string& key) const {
        DZR_CHECK(!seen, "{}: malformed NPY header: key '{}' appears twice", name_, key);
    }

    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }

    void expect(char c) {
        if (peek() != c) fail(fmt::format("'{}'", c));
        ++pos_;
    }

    std::string parse_string() {
        const char q = peek();
        if (q != '\'' && q != '"') fail("a quoted string");
        const size_t start = ++pos_;
        while (pos_ < s_.size() && s_[pos_] != q) {
            if (s_[pos_] == '\\') fail("a string without escapes");
            ++pos_;
        }
        if (pos_ >= s_.size()) fail("a closing quote");
        return std::string(s_.substr(start, pos_++ - start));
    }

    bool parse_bool() {
        if (s_.substr(pos_, 4) == "True") {
            pos_ += 4;
            return true;
        }
        if (s_.substr(pos_, 5) == "False") {
            pos_ += 5;
            return false;
        }
        fail("True or False");
    }

    int64_t parse_int() {
        if (peek() < '0' || peek() > '9') fail("a non-negative integer");
        int64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + (peek() - '0');
            DZR_CHECK(v <= kMaxElements, "{}: NPY header: dimension too large at offset {}", name_, pos_);
            ++pos_;
        }
        if (peek() == 'L') ++pos_;  // Python 2 long literal
        return v;
    }

    std::vector<int64_t> parse_tuple() {
        std::vector<int64_t> dims;
        expect('(');
        skip_ws();
        bool need_comma = false;  // a 1-tuple needs its trailing comma: "(5,)" (5) is an int
        while (peek() != ')') {
            dims.push_back(parse_int());
            skip_ws();
            if (peek() == ',') {
                ++pos_;
                skip_ws();
                need_comma = false;
            } else if (peek() == ')') {
                need_comma = dims.size() == 1;
            } else {
                fail("',' or ')' in the shape tuple");
            }
        }
        if (need_comma) fail("',' after the only dimension (a 1-tuple is written '(n,)')");
        ++pos_;
        return dims;
    }

    std::string_view s_;
    const std::string& name_;
    size_t pos_ = 0;
};

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& name) {
    int64_t n = 1;
    for (int64_t d : shape) {
        DZR_CHECK(d >= 0 && (d == 0 || n <= kMaxElements / d), "{}: NPY shape is too large", name);
        n *= d;
    }
    return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::optional<NpyDType> npy_dtype_of(DType t) {
    switch (t) {
        case DType::F32: return NpyDType::F4;
        case DType::F16: return NpyDType::F2;
        case DType::U8: return NpyDType::U1;
        case DType::I32: return NpyDType::I4;
        case DType::I64: return NpyDType::I8;
        default: return std::nullopt;
    }
}

}  // namespace

std::string_view npy_descr(NpyDType t) { return info(t).descr; }
std::string_view npy_dtype_name(NpyDType t) { return info(t).name; }
size_t npy_dtype_size(NpyDType t) { return info(t).size; }
bool npy_dtype_is_float(NpyDType t) { return t == NpyDType::F2 || t == NpyDType::F4 || t == NpyDType::F8; }

int64_t NpyHeader::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

size_t NpyHeader::data_bytes() const { return size_t(numel()) * npy_dtype_size(dtype); }

NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
    DZR_CHECK(bytes.size() >= kPreludeV1 && bytes.substr(0, kMagic.size()) == kMagic,
              "{}: not an NPY file (bad magic; expected \\x93NUMPY)", name);
    const int major = uint8_t(bytes[6]);
    const int minor = uint8_t(bytes[7]);
    DZR_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
              "{}: unsupported NPY format version {}.{} (expected 1.0, 2.0 or 3.0)", name, major, minor);
    size_t prelude = kPreludeV1;
    size_t header_len = 0;
    if (major == 1) {
        header_len = read_le(bytes, 8, 2);
    } else {
        prelude = kPreludeV2;
        DZR_CHECK(bytes.size() >= prelude, "{}: truncated NPY header", name);
        header_len = read_le(bytes, 8, 4);
    }
    DZR_CHECK(header_len <= kMaxHeaderLen, "{}: NPY header length {} is implausible (garbage header?)",
              name, header_len);
    DZR_CHECK(bytes.size() >= prelude + header_len,
              "{}: truncated NPY header: it declares {} bytes but only {} follow", name, header_len,
              bytes.size() - prelude);
    const std::string_view text = bytes.substr(prelude, header_len);
    // NOTE: version 1.0/2.0 headers are latin-1, 3.0 is UTF-8; a valid header is plain ASCII either way.
    for (size_t i = 0; i < text.size(); ++i)
        DZR_CHECK(uint8_t(text[i]) >= 0x20 || text[i] == '\n' || text[i] == '\t' || text[i] == '\r',
                  "{}: malformed NPY header: control byte 0x{:02x} at offset {}", name, uint8_t(text[i]),
                  prelude + i);
    NpyHeader h = HeaderParser(text, name).parse();
    h.major = major;
    h.minor = minor;
    h.data_offset = prelude + header_len;
    checked_numel(h.shape, name);
    return h;
}

std::string encode_npy_header(NpyDType dtype, const std::vector<int64_t>& shape) {
    std::string shape_text = "(";
    for (size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) shape_text += ",";
    shape_text += ")";
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(dtype), shape_text);
    // Pad with spaces and end with '\n' so that prelude + header is a multiple of 64.
    const bool v2 = dict.size() + 1 + kPreludeV1 > 0xffff;
    const size_t prelude = v2 ? kPreludeV2 : kPreludeV1;
    const size_t total = (prelude + dict.size() + 1 + 63) / 64 * 64;
    dict.append(total - prelude - dict.size() - 1, ' ');
    dict.push_back('\n');
    std::string out(kMagic);
    out.push_back(char(v2 ? 2 : 1));
    out.push_back(0);
    const size_t len = dict.size();
    for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) out.push_back(char((len >> (8 * i)) & 0xff));
    return out + dict;
}

NpyArray::NpyArray(NpyDType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    storage_ = std::make_shared<HostStorage>(nbytes());
}

int64_t NpyArray::numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
}

std::string NpyArray::shape_str() const { return shape_string(shape_); }

std::string NpyArray::describe() const { return fmt::format("{} {}", npy_dtype_name(dtype_), shape_str()); }

std::vector<double> NpyArray::to_f64() const {
    const size_t n = size_t(numel());
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
        switch (dtype_) {
            case NpyDType::F2: out[i] = f16_to_f32(ptr<uint16_t>()[i]); break;
            case NpyDType::F4: out[i] = ptr<float>()[i]; break;
            case NpyDType::F8: out[i] = ptr<double>()[i]; break;
            case NpyDType::U1: out[i] = ptr<uint8_t>()[i]; break;
            case NpyDType::I4: out[i] = ptr<int32_t>()[i]; break;
            case NpyDType::I8: out[i] = double(ptr<int64_t>()[i]); break;
        }
    }
    return out;
}

std::vector<float> NpyArray::to_f32() const {
    const std::vector<double> d = to_f64();
    return std::vector<float>(d.begin(), d.end());
}

Tensor NpyArray::to_tensor() const {
    DZR_CHECK(rank() >= 1 && rank() <= kMaxDims, "array {} has rank {}; tensors take rank 1..{}",
              describe(), rank(), kMaxDims);
    const Shape shape(shape_);
    if (dtype_ == NpyDType::F8) {
        Tensor t = Tensor::host(shape, DType::F32);
        const std::vector<double> v = to_f64();
        for (size_t i = 0; i < v.size(); ++i) t.ptr<float>()[i] = float(v[i]);
        return t;
    }
    DType dt = DType::F32;
    switch (dtype_) {
        case NpyDType::F2: dt = DType::F16; break;
        case NpyDType::F4: dt = DType::F32; break;
        case NpyDType::U1: dt = DType::U8; break;
        case NpyDType::I4: dt = DType::I32; break;
        case NpyDType::I8: dt = DType::I64; break;
        case NpyDType::F8: break;
    }
    return Tensor(storage_, TensorView(data(), dt, shape, Device::cpu()));
}

NpyArray parse_npy(std::string_view bytes, const std::string& name) {
    const NpyHeader h = parse_npy_header(bytes, name);
    const size_t have = bytes.size() - h.data_offset;
    DZR_CHECK(have >= h.data_bytes(), "{}: truncated: the header declares {} {} ({} bytes of data) but only "
              "{} bytes follow the header", name, npy_dtype_name(h.dtype), shape_string(h.shape),
              h.data_bytes(), have);
    DZR_CHECK(have == h.data_bytes(), "{}: {} unexpected bytes after the {} {} data", name,
              have - h.data_bytes(), npy_dtype_name(h.dtype), shape_string(h.shape));
    NpyArray a(h.dtype, h.shape);
    if (a.nbytes()) std::memcpy(a.data(), bytes.data() + h.data_offset, a.nbytes());
    return a;
}

namespace {

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

/// Opens `path` and reads its header (the prelude, then the header it announces, bounded); the file is
/// left open for the data.
NpyHeader open_and_read_header(const fs::path& path, FilePtr& f, uintmax_t& file_size) {
    const std::string name = path.string();
    std::error_code ec;
    DZR_CHECK(fs::is_regular_file(path, ec), "{}: no such file", name);
    file_size = fs::file_size(path, ec);
    DZR_CHECK(!ec, "{}: cannot read: {}", name, ec.message());
    f = FilePtr(std::fopen(path.c_str(), "rb"), &std::fclose);
    DZR_CHECK(f != nullptr, "{}: cannot open: {}", name, std::strerror(errno));

    std::string head(std::min<uintmax_t>(file_size, kPreludeV2), '\0');
    DZR_CHECK(std::fread(head.data(), 1, head.size(), f.get()) == head.size(), "{}: read error", name);
    if (head.size() >= kPreludeV1 && std::string_view(head).substr(0, kMagic.size()) == kMagic) {
        const bool v1 = uint8_t(head[6]) == 1;
        const size_t prelude = v1 ? kPreludeV1 : kPreludeV2;
        if (head.size() >= prelude) {
            const size_t len = std::min<size_t>(read_le(head, 8, v1 ? 2 : 4), kMaxHeaderLen + 1);
            const size_t want = std::min<uintmax_t>(file_size, prelude + len);
            const size_t old = head.size();
            if (want > old) {
                head.resize(want);
                DZR_CHECK(std::fread(head.data() + old, 1, want - old, f.get()) == want - old,
                          "{}: read error", name);
            }
        }
    }
    return parse_npy_header(head, name);
}

}  // namespace

NpyHeader read_npy_header(const fs::path& path) {
    FilePtr f(nullptr, &std::fclose);
    uintmax_t file_size = 0;
    return open_and_read_header(path, f, file_size);
}

NpyArray read_npy(const fs::path& path) {
    const std::string name = path.string();
    FilePtr f(nullptr, &std::fclose);
    uintmax_t file_size = 0;
    const NpyHeader h = open_and_read_header(path, f, file_size);
    const uintmax_t have = file_size - h.data_offset;
    DZR_CHECK(have >= h.data_bytes(), "{}: truncated: the header declares {} {} ({} bytes of data) but only "
              "{} bytes follow the header", name, npy_dtype_name(h.dtype), shape_string(h.shape),
              h.data_bytes(), have);
    DZR_CHECK(have == h.data_bytes(), "{}: {} unexpected bytes after the {} {} data", name,
              have - h.data_bytes(), npy_dtype_name(h.dtype), shape_string(h.shape));
    NpyArray a(h.dtype, h.shape);
    DZR_CHECK(std::fseek(f.get(), long(h.data_offset), SEEK_SET) == 0, "{}: seek error", name);
    DZR_CHECK(std::fread(a.data(), 1, a.nbytes(), f.get()) == a.nbytes(), "{}: read error in the data", name);
    return a;
}

void write_npy(const fs::path& path, NpyDType dtype, const std::vector<int64_t>& shape, const void* data) {
    const int64_t n = checked_numel(shape, path.string());
    AtomicFile f(path);
    f.write(encode_npy_header(dtype, shape));
    f.write(data, size_t(n) * npy_dtype_size(dtype));
    f.commit();
}

void write_npy(const fs::path& path, const NpyArray& array) {
    write_npy(path, array.dtype(), array.shape(), array.data());
}

void write_npy(const fs::path& path, const TensorView& view) {
    DZR_CHECK(view.device.is_cpu(), "{}: cannot write a {} tensor; download it to the host first",
              path.string(), view.device.str());
    DZR_CHECK(view.is_contiguous(), "{}: cannot write a strided tensor {}; make it contiguous first",
              path.string(), view.str());
    const auto dt = npy_dtype_of(view.dtype);
    DZR_CHECK(dt.has_value(), "{}: {} has no NPY dtype; convert the tensor to f32 first", path.string(),
              dtype_name(view.dtype));
    write_npy(path, *dt, view.shape.vec(), view.data);
}

void write_npy_f32(const fs::path& path, const std::vector<int64_t>& shape, std::span<const float> values) {
    DZR_ASSERT(checked_numel(shape, path.string()) == int64_t(values.size()));
    write_npy(path, NpyDType::F4, shape, values.data());
}

void write_npy_f64(const fs::path& path, const std::vector<int64_t>& shape, std::span<const double> values) {
    DZR_ASSERT(checked_numel(shape, path.string()) == int64_t(values.size()));
    write_npy(path, NpyDType::F8, shape, values.data());
}

}  // namespace dzr::io
