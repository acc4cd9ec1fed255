#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::io;
namespace fs = std::filesystem;
using namespace std::string_literals;

namespace {

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// A .npy image with a hand-written header dict (padded the way numpy pads it) and raw data.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
    const size_t prelude = major == 1 ? 10 : 12;
    std::string header = dict;
    while ((prelude + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    std::string out = "\x93NUMPY";
    out.push_back(char(major));
    out.push_back(0);
    const size_t len = header.size();
    for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out.push_back(char((len >> (8 * i)) & 0xff));
    return out + header + data;
}

std::string floats_as_bytes(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

/// Expects reading `bytes` (saved as `name`) to fail with a message naming the file and containing `what`.
void check_rejects(const test::TempDir& dir, const std::string& name, const std::string& bytes,
                   const std::string& what) {
    const fs::path p = dir / name;
    write_bytes(p, bytes);
    std::string msg;
    try {
        read_npy(p);
    } catch (const Error& e) {
        msg = e.what();
    }
    INFO("file " << name << ": message '" << msg << "'");
    CHECK(msg.find(p.string()) != std::string::npos);
    CHECK(msg.find(what) != std::string::npos);
}

bool has_temp_files(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find(kTempMarker) != std::string::npos) return true;
    return false;
}

}  // namespace

TEST_CASE("npy header matches the bytes numpy writes for a float32 [2, 3] array") {
    // np.save of np.zeros((2, 3), np.float32) begins with these 128 bytes (header length 118 = 'v').
    std::string expected = "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"s;
    expected.append(127 - expected.size(), ' ');
    expected.push_back('\n');
    const std::string got = encode_npy_header(NpyDType::F4, {2, 3});
    CHECK(got.size() == 128);
    CHECK(got == expected);
    // One-dimensional shapes keep Python's 1-tuple comma; scalars have an empty tuple.
    CHECK(encode_npy_header(NpyDType::U1, {5}).find("'shape': (5,), }") != std::string::npos);
    CHECK(encode_npy_header(NpyDType::I8, {}).find("'descr': '<i8', 'fortran_order': False, 'shape': (), }") !=
          std::string::npos);
    CHECK(encode_npy_header(NpyDType::U1, {5}).find("'|u1'") != std::string::npos);
}

TEST_CASE("npy round-trips every supported dtype with its shape and bytes") {
    test::TempDir dir;
    struct Case {
        NpyDType dtype;
        std::vector<int64_t> shape;
    };
    const Case cases[] = {{NpyDType::F2, {3, 2}}, {NpyDType::F4, {2, 3, 4}}, {NpyDType::F8, {7}},
                          {NpyDType::U1, {2, 4, 5, 3}}, {NpyDType::I4, {1, 6}}, {NpyDType::I8, {}},
                          {NpyDType::F4, {0, 8}}};
    int k = 0;
    for (const auto& c : cases) {
        NpyArray a(c.dtype, c.shape);
        auto* bytes = static_cast<uint8_t*>(a.data());
        for (size_t i = 0; i < a.nbytes(); ++i) bytes[i] = uint8_t(i * 37 + 11);
        const fs::path p = dir / fmt::format("a{}.npy", k++);
        write_npy(p, a);
        const NpyArray b = read_npy(p);
        CHECK(b.dtype() == c.dtype);
        CHECK(b.shape() == c.shape);
        REQUIRE(b.nbytes() == a.nbytes());
        CHECK(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
        // The file is exactly header + data, and the header is 64-byte aligned.
        const auto size = fs::file_size(p);
        CHECK((size - a.nbytes()) % 64 == 0);
    }
}

TEST_CASE("npy reads version 2.0 and 3.0 headers, double quotes and Python 2 long literals") {
    test::TempDir dir;
    const std::vector<float> v = {1.5f, -2.f, 3.25f, 0.f, 8.f, 9.5f};
    for (int major : {2, 3}) {
        const fs::path p = dir / fmt::format("v{}.npy", major);
        write_bytes(p, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", floats_as_bytes(v),
                                 major));
        const NpyArray a = read_npy(p);
        CHECK(a.shape() == std::vector<int64_t>{3, 2});
        CHECK(a.to_f32() == v);
    }
    const fs::path p = dir / "py2.npy";
    write_bytes(p, npy_bytes("{\"shape\": (2L, 3L), \"fortran_order\": False, \"descr\": \"<f4\"}",
                             floats_as_bytes(v)));
    const NpyArray a = read_npy(p);
    CHECK(a.shape() == std::vector<int64_t>{2, 3});
    CHECK(a.to_f64()[2] == 3.25);
}

TEST_CASE("npy values convert to double and to tensors with the matching dtype") {
    NpyArray h(NpyDType::F2, {2});
    h.ptr<uint16_t>()[0] = 0x3c00;  // 1.0
    h.ptr<uint16_t>()[1] = 0xc100;  // -2.5
    CHECK(h.to_f64() == std::vector<double>{1.0, -2.5});
    NpyArray d(NpyDType::F8, {3});
    d.ptr<double>()[0] = 0.1;
    d.ptr<double>()[1] = -1e300;
    d.ptr<double>()[2] = 7.0;
    const Tensor t = d.to_tensor();
    CHECK(t.dtype() == DType::F32);
    CHECK(t.ptr<float>()[0] == 0.1f);
    CHECK(t.ptr<float>()[2] == 7.0f);
    NpyArray u(NpyDType::U1, {2, 2, 3});
    const Tensor tu = u.to_tensor();
    CHECK(tu.dtype() == DType::U8);
    CHECK(tu.data() == u.data());  // shares memory
    CHECK(tu.shape() == Shape{2, 2, 3});
    NpyArray i(NpyDType::I8, {2});
    i.ptr<int64_t>()[0] = -5;
    i.ptr<int64_t>()[1] = int64_t(1) << 40;
    CHECK(i.to_f64() == std::vector<double>{-5.0, double(int64_t(1) << 40)});
}

TEST_CASE("npy writes host tensors and refuses bf16 and strided views") {
    test::TempDir dir;
    const Tensor t = Tensor::host_f32({2, 2}, {1, 2, 3, 4});
    write_npy(dir / "t.npy", t.view());
    CHECK(read_npy(dir / "t.npy").to_f32() == std::vector<float>{1, 2, 3, 4});
    const Tensor b = Tensor::host({2}, DType::BF16);
    CHECK_THROWS_WITH_AS(write_npy(dir / "b.npy", b.view()), doctest::Contains("bf16 has no NPY dtype"), Error);
    CHECK_THROWS_WITH_AS(write_npy(dir / "s.npy", t.view().transpose(0, 1)), doctest::Contains("strided"), Error);
    CHECK_FALSE(fs::exists(dir / "b.npy"));
    CHECK_FALSE(has_temp_files(dir.path()));
}

TEST_CASE("npy rejects broken files with a message naming the file") {
    test::TempDir dir;
    const std::string data6 = floats_as_bytes({1, 2, 3, 4, 5, 6});
    const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    // Sanity: the good file reads.
    write_bytes(dir / "good.npy", npy_bytes(good_dict, data6));
    CHECK(read_npy(dir / "good.npy").numel() == 6);

    check_rejects(dir, "magic.npy", "\x93NUMPX\x01\x00"s + npy_bytes(good_dict, data6).substr(8), "bad magic");
    check_rejects(dir, "text.npy", "hello, this is not an array\n", "bad magic");
    check_rejects(dir, "empty.npy", "", "bad magic");
    check_rejects(dir, "fortran.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data6), "Fortran");
    check_rejects(dir, "bigendian.npy",
                  npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data6), "big-endian");
    check_rejects(dir, "object.npy",
                  npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", data6), "object dtype");
    check_rejects(dir, "complex.npy",
                  npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", data6), "unsupported dtype");
    check_rejects(dir, "structured.npy",
                  npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", data6.substr(0, 8)),
                  "structured");
    check_rejects(dir, "truncated.npy", npy_bytes(good_dict, data6.substr(0, 20)), "truncated");
    check_rejects(dir, "trailing.npy", npy_bytes(good_dict, data6 + "xx"), "unexpected bytes");
    check_rejects(dir, "short_header.npy", npy_bytes(good_dict, data6).substr(0, 40), "truncated NPY header");
    check_rejects(dir, "version.npy", [&] {
        std::string b = npy_bytes(good_dict, data6);
        b[6] = 4;
        return b;
    }(), "version 4.0");
    check_rejects(dir, "garbage.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': Nope, 'shape': (2, 3), }", data6), "True or False");
    check_rejects(dir, "unknown_key.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", data6),
                  "unexpected key 'x'");
    check_rejects(dir, "missing_key.npy", npy_bytes("{'descr': '<f4', 'shape': (2, 3), }", data6),
                  "missing key 'fortran_order'");
    check_rejects(dir, "duplicate.npy",
                  npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", data6),
                  "appears twice");
    check_rejects(dir, "not_tuple.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", data6), "1-tuple");
    check_rejects(dir, "negative.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", data6),
                  "non-negative integer");
    check_rejects(dir, "after_dict.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } junk", data6),
                  "after the dictionary");
    check_rejects(dir, "control.npy",
                  npy_bytes(std::string("{'descr': '<f4', 'fortran_order': False,\x01 'shape': (6,), }"), data6),
                  "control byte");
    check_rejects(dir, "unterminated.npy", npy_bytes("{'descr': '<f4, 'fortran_order': False", ""),
                  "malformed NPY header");
    check_rejects(dir, "huge.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", ""),
                  "too large");
    CHECK_THROWS_WITH_AS(read_npy(dir / "absent.npy"), doctest::Contains("absent.npy: no such file"), Error);
}

TEST_CASE("npy writes are atomic: no temporary files remain and a failed write leaves nothing") {
    test::TempDir dir;
    const std::vector<float> v(12, 2.0f);
    write_npy_f32(dir / "x.npy", {3, 4}, v);
    write_npy_f32(dir / "x.npy", {4, 3}, v);  // overwrite in place
    CHECK(read_npy(dir / "x.npy").shape() == std::vector<int64_t>{4, 3});
    CHECK_FALSE(has_temp_files(dir.path()));
    CHECK_THROWS_AS(write_npy_f32(dir / "missing_dir" / "y.npy", {3, 4}, v), Error);
    CHECK_FALSE(fs::exists(dir / "missing_dir"));
    {
        // An AtomicFile destroyed without commit leaves neither the target nor its temporary.
        AtomicFile f(dir / "z.bin");
        f.write("partial");
        CHECK(fs::exists(f.temp_path()));
    }
    CHECK_FALSE(fs::exists(dir / "z.bin"));
    CHECK_FALSE(has_temp_files(dir.path()));
}
