#include "serve/protocol.h"

// NOTE: msgpack-cxx without Boost (its optional Boost adaptors are not used); header-only either way
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/half.h"
#include "io/episode.h"

namespace dzr::serve {

namespace {

using msgpack::object;
namespace mt = msgpack::type;

// NOTE: the protocol nests three containers deep (request map -> array map -> shape array); with these limits
// a hostile message can make at most ~1M msgpack objects (~25 MB) whatever its size
constexpr size_t kMaxDepth = 3;
constexpr size_t kMaxMapEntries = 64;
constexpr size_t kMaxArrayElements = 256;
constexpr size_t kMaxRank = 8;

const char* type_name(const object& o) {
    switch (o.type) {
        case mt::NIL:
            return "nil";
        case mt::BOOLEAN:
            return "bool";
        case mt::POSITIVE_INTEGER:
        case mt::NEGATIVE_INTEGER:
            return "int";
        case mt::FLOAT32:
        case mt::FLOAT64:
            return "float";
        case mt::STR:
            return "str";
        case mt::BIN:
            return "bin";
        case mt::ARRAY:
            return "array";
        case mt::MAP:
            return "map";
        case mt::EXT:
            return "ext";
    }
    return "unknown";
}

/// A str or bin object's bytes (Python packs str as str and bytes as bin; keys come either way).
std::optional<std::string_view> bytes_of(const object& o) {
    if (o.type == mt::STR) return std::string_view(o.via.str.ptr, o.via.str.size);
    if (o.type == mt::BIN) return std::string_view(o.via.bin.ptr, o.via.bin.size);
    return std::nullopt;
}

const object* find(const object& map, std::string_view key) {
    for (uint32_t i = 0; i < map.via.map.size; ++i) {
        const auto k = bytes_of(map.via.map.ptr[i].key);
        if (k && *k == key) return &map.via.map.ptr[i].val;
    }
    return nullptr;
}

/// numpy's dtype.str: byte order ('<', '>', '|', '='), kind, item size ("<f4", "|u1").
struct DTypeSpec {
    char kind = 0;
    int size = 0;
    bool big_endian = false;
};

std::optional<DTypeSpec> parse_dtype(std::string_view s) {
    DTypeSpec d;
    if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
        d.big_endian = s[0] == '>';
        s.remove_prefix(1);
    }
    if (s.size() != 2 || s[1] < '1' || s[1] > '8') return std::nullopt;
    d.kind = s[0];
    d.size = s[1] - '0';
    return d;
}

/// A numpy array or scalar of the message (openpi_client's msgpack_numpy.pack_array).
struct WireArray {
    DTypeSpec dtype;
    std::string dtype_text;
    std::vector<int64_t> shape;      // empty for a scalar
    std::string_view data;           // arrays: the raw bytes
    const object* scalar = nullptr;  // scalars: the msgpack number
    int64_t numel = 1;
};

std::string shape_text(const std::vector<int64_t>& shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

WireArray decode_array(const object& o, std::string_view key) {
    if (o.type != mt::MAP)
        throw ProtocolError(
            fmt::format("'{}': expected a numpy array (openpi_client's msgpack encoding), got a msgpack {}",
                        key, type_name(o)));
    WireArray a;
    const object* nd = find(o, "__ndarray__");
    const object* gen = nd ? nullptr : find(o, "__npgeneric__");
    if (!nd && !gen)
        throw ProtocolError(
            fmt::format("'{}': expected a numpy array, got a map without the __ndarray__ marker "
                        "(encode it with openpi_client.msgpack_numpy)",
                        key));
    const object* data = find(o, "data");
    const object* dtype = find(o, "dtype");
    const auto dtype_bytes = dtype ? bytes_of(*dtype) : std::nullopt;
    if (!data || !dtype_bytes)
        throw ProtocolError(
            fmt::format("'{}': a numpy {} needs 'data' and a 'dtype' string", key, nd ? "array" : "scalar"));
    a.dtype_text = std::string(*dtype_bytes);
    const auto spec = parse_dtype(a.dtype_text);
    if (!spec) throw ProtocolError(fmt::format("'{}': unknown dtype '{}'", key, a.dtype_text));
    a.dtype = *spec;
    if (gen) {
        const bool number = data->type == mt::FLOAT32 || data->type == mt::FLOAT64 ||
                            data->type == mt::POSITIVE_INTEGER || data->type == mt::NEGATIVE_INTEGER;
        if (!number)
            throw ProtocolError(fmt::format("'{}': a numpy scalar's data must be a number, got a msgpack {}",
                                            key, type_name(*data)));
        a.scalar = data;
        return a;
    }
    const object* shape = find(o, "shape");
    const auto raw = bytes_of(*data);
    if (!raw)
        throw ProtocolError(
            fmt::format("'{}': the array's data must be bytes, got a msgpack {}", key, type_name(*data)));
    if (!shape || shape->type != mt::ARRAY || shape->via.array.size > kMaxRank)
        throw ProtocolError(
            fmt::format("'{}': the array's shape must be an array of at most {} sizes", key, kMaxRank));
    for (uint32_t i = 0; i < shape->via.array.size; ++i) {
        const object& s = shape->via.array.ptr[i];
        if (s.type != mt::POSITIVE_INTEGER || s.via.u64 > uint64_t(1) << 32)
            throw ProtocolError(fmt::format("'{}': shape entry {} is not a size", key, i));
        a.shape.push_back(int64_t(s.via.u64));
        if (a.shape.back() > 0 && a.numel > (int64_t(1) << 40) / a.shape.back())
            throw ProtocolError(fmt::format("'{}': shape {} is too large", key, shape_text(a.shape)));
        a.numel *= a.shape.back();
    }
    if (uint64_t(a.numel) * uint64_t(a.dtype.size) != raw->size())
        throw ProtocolError(fmt::format("'{}': shape {} of dtype {} needs {} bytes, the data has {}", key,
                                        shape_text(a.shape), a.dtype_text, a.numel * a.dtype.size,
                                        raw->size()));
    a.data = *raw;
    return a;
}

/// A float array's (or scalar's) elements as double, checked finite.
std::vector<double> float_values(const WireArray& a, std::string_view key) {
    const bool is_float =
        a.dtype.kind == 'f' && (a.dtype.size == 2 || a.dtype.size == 4 || a.dtype.size == 8);
    if (!is_float)
        throw ProtocolError(fmt::format("'{}': expected a float array (dtype <f4 or <f8), got dtype '{}'",
                                        key, a.dtype_text));
    std::vector<double> out;
    if (a.scalar) {
        const object& s = *a.scalar;
        out.push_back(s.type == mt::FLOAT32 || s.type == mt::FLOAT64 ? s.via.f64
                      : s.type == mt::POSITIVE_INTEGER               ? double(s.via.u64)
                                                                     : double(s.via.i64));
    } else {
        out.resize(size_t(a.numel));
        const auto* p = reinterpret_cast<const unsigned char*>(a.data.data());
        for (size_t i = 0; i < out.size(); ++i) {
            unsigned char b[8];
            std::memcpy(b, p + i * size_t(a.dtype.size), size_t(a.dtype.size));
            if (a.dtype.big_endian != (std::endian::native == std::endian::big))
                std::reverse(b, b + a.dtype.size);
            if (a.dtype.size == 2) {
                uint16_t h;
                std::memcpy(&h, b, 2);
                out[i] = f16_to_f32(h);
            } else if (a.dtype.size == 4) {
                float f;
                std::memcpy(&f, b, 4);
                out[i] = f;
            } else {
                std::memcpy(&out[i], b, 8);
            }
        }
    }
    for (size_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out[i]))
            throw ProtocolError(
                fmt::format("'{}': element {} is {}; the state must be finite", key, i, out[i]));
    return out;
}

WireFrames decode_frames(const object& o, std::string_view key, const ProtocolLimits& limits) {
    const WireArray a = decode_array(o, key);
    const auto expected = [&] {
        return fmt::format("uint8 frames [{0}, {1}, 3] or [T, {0}, {1}, 3]", limits.image_height,
                           limits.image_width);
    };
    if (a.scalar) throw ProtocolError(fmt::format("'{}': expected {}, got a numpy scalar", key, expected()));
    if (a.dtype.kind != 'u' || a.dtype.size != 1)
        throw ProtocolError(fmt::format("'{}': expected {}, got dtype '{}'", key, expected(), a.dtype_text));
    const size_t r = a.shape.size();
    const bool ok = (r == 3 || r == 4) && a.shape[r - 3] == limits.image_height &&
                    a.shape[r - 2] == limits.image_width && a.shape[r - 1] == 3 &&
                    (r == 3 || a.shape[0] >= 1);
    if (!ok)
        throw ProtocolError(
            fmt::format("'{}': expected {}, got shape {}", key, expected(), shape_text(a.shape)));
    WireFrames f;
    f.data = reinterpret_cast<const uint8_t*>(a.data.data());
    f.frames = r == 4 ? a.shape[0] : 1;
    f.height = limits.image_height;
    f.width = limits.image_width;
    return f;
}

/// A str, or a numpy str scalar (np.str_ packs as {"__npgeneric__": true, "data": str, "dtype": "<U5"}).
std::string text_value(const object& o, std::string_view key) {
    const object* v = &o;
    if (o.type == mt::MAP && find(o, "__npgeneric__") && find(o, "data")) v = find(o, "data");
    if (v->type != mt::STR)
        throw ProtocolError(fmt::format("'{}': expected a str, got a msgpack {}", key, type_name(o)));
    return std::string(v->via.str.ptr, v->via.str.size);
}

const object& require(const object& map, std::string_view key, std::string_view what) {
    const object* v = find(map, key);
    if (!v) throw ProtocolError(fmt::format("infer: missing key '{}' ({})", key, what));
    return *v;
}

InferRequest decode_infer(const object& map, const ProtocolLimits& limits) {
    InferRequest r;
    for (size_t c = 0; c < kNumCameras; ++c)
        r.cameras[c] =
            decode_frames(require(map, kCameraKeys[c], "uint8 camera frames"), kCameraKeys[c], limits);
    for (size_t c = 1; c < kNumCameras; ++c)
        if (r.cameras[c].frames != r.cameras[0].frames)
            throw ProtocolError(
                fmt::format("infer: the cameras carry different frame counts ({} has {}, {} has {})",
                            kCameraKeys[0], r.cameras[0].frames, kCameraKeys[c], r.cameras[c].frames));

    const WireArray joint = decode_array(require(map, kJointKey, "7 joint positions"), kJointKey);
    const bool joint_shape =
        !joint.scalar && ((joint.shape.size() == 1 && joint.shape[0] == kJointDims) ||
                          (joint.shape.size() == 2 && joint.shape[0] == 1 && joint.shape[1] == kJointDims));
    if (!joint_shape)
        throw ProtocolError(
            fmt::format("'{}': expected 7 floats, shape [7] or [1, 7], got {}", kJointKey,
                        joint.scalar ? "a numpy scalar" : "shape " + shape_text(joint.shape)));
    const std::vector<double> jv = float_values(joint, kJointKey);
    std::copy(jv.begin(), jv.end(), r.joint_position.begin());

    const WireArray grip = decode_array(require(map, kGripperKey, "1 gripper position"), kGripperKey);
    const bool grip_shape = grip.scalar || (grip.numel == 1 && grip.shape.size() <= 2);
    if (!grip_shape)
        throw ProtocolError(fmt::format("'{}': expected 1 float (shape [1]), got shape {}", kGripperKey,
                                        shape_text(grip.shape)));
    r.gripper_position = float_values(grip, kGripperKey)[0];

    r.prompt = text_value(require(map, "prompt", "the task instruction, a str"), "prompt");
    try {
        io::validate_prompt(r.prompt, "'prompt'");
    } catch (const Error& e) {
        throw ProtocolError(e.what());
    }
    if (const object* s = find(map, "session_id"); s && s->type != mt::NIL)
        r.session_id = text_value(*s, "session_id");
    return r;
}

bool reference_all(mt::object_type, size_t, void*) {
    return true;
}

void pack_str(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
    pk.pack_str(uint32_t(s.size()));
    pk.pack_str_body(s.data(), uint32_t(s.size()));
}

void pack_bin(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
    pk.pack_bin(uint32_t(s.size()));
    pk.pack_bin_body(s.data(), uint32_t(s.size()));
}

}  // namespace

std::string encode_server_config(const ServerConfig& c) {
    msgpack::sbuffer sb;
    msgpack::packer<msgpack::sbuffer> pk(sb);
    pk.pack_map(6);
    pack_str(pk, "image_resolution");
    pk.pack_array(2);
    pk.pack(c.image_height);
    pk.pack(c.image_width);
    pack_str(pk, "needs_wrist_camera");
    pk.pack(c.needs_wrist_camera);
    pack_str(pk, "n_external_cameras");
    pk.pack(c.n_external_cameras);
    pack_str(pk, "needs_stereo_camera");
    pk.pack(c.needs_stereo_camera);
    pack_str(pk, "needs_session_id");
    pk.pack(c.needs_session_id);
    pack_str(pk, "action_space");
    pack_str(pk, c.action_space);
    return std::string(sb.data(), sb.size());
}

std::string encode_float32_array(std::span<const float> values, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    DZR_ASSERT(n == int64_t(values.size()));
    static_assert(std::endian::native == std::endian::little, "the '<f4' reply assumes a little-endian host");
    msgpack::sbuffer sb;
    msgpack::packer<msgpack::sbuffer> pk(sb);
    // NOTE: the marker keys as bin: openpi_client's unpack_array looks for b"__ndarray__" (bytes keys)
    pk.pack_map(4);
    pack_bin(pk, "__ndarray__");
    pk.pack_true();
    pack_bin(pk, "data");
    pack_bin(pk, std::string_view(reinterpret_cast<const char*>(values.data()), values.size_bytes()));
    pack_bin(pk, "dtype");
    pack_str(pk, "<f4");
    pack_bin(pk, "shape");
    pk.pack_array(uint32_t(shape.size()));
    for (int64_t s : shape) pk.pack(s);
    return std::string(sb.data(), sb.size());
}

Request decode_request(std::string_view message, const ProtocolLimits& limits) {
    msgpack::object_handle handle;
    size_t offset = 0;
    const auto cap = uint32_t(std::min<size_t>(message.size(), std::numeric_limits<uint32_t>::max()));
    const msgpack::unpack_limit limit(kMaxArrayElements, kMaxMapEntries, cap, cap, 0, kMaxDepth);
    try {
        handle = msgpack::unpack(message.data(), message.size(), offset, reference_all, nullptr, limit);
    } catch (const msgpack::insufficient_bytes&) {
        throw ProtocolError(
            fmt::format("not a msgpack message: it ends inside a value ({} bytes)", message.size()));
    } catch (const msgpack::depth_size_overflow&) {
        throw ProtocolError(fmt::format("the message nests deeper than the protocol's {} levels", kMaxDepth));
    } catch (const msgpack::map_size_overflow&) {
        throw ProtocolError(fmt::format("the message has a map of more than {} entries", kMaxMapEntries));
    } catch (const msgpack::array_size_overflow&) {
        throw ProtocolError(
            fmt::format("the message has an array of more than {} elements", kMaxArrayElements));
    } catch (const msgpack::ext_size_overflow&) {
        throw ProtocolError("the message holds a msgpack ext value, which the protocol does not use");
    } catch (const std::exception& e) {
        throw ProtocolError(fmt::format("not a msgpack message ({})", e.what()));
    }
    if (offset != message.size())
        throw ProtocolError(
            fmt::format("not one msgpack message: {} bytes follow the first value of {} bytes",
                        message.size() - offset, offset));
    const object& root = handle.get();
    if (root.type != mt::MAP)
        throw ProtocolError(
            fmt::format("expected a map with an 'endpoint' key, got a msgpack {}", type_name(root)));
    const object* ep = find(root, "endpoint");
    if (!ep) throw ProtocolError("missing key 'endpoint' (\"infer\" or \"reset\")");
    const std::string endpoint = text_value(*ep, "endpoint");
    Request req;
    if (endpoint == "reset") {
        req.endpoint = Endpoint::Reset;
    } else if (endpoint == "infer") {
        req.endpoint = Endpoint::Infer;
        req.infer = decode_infer(root, limits);
    } else {
        throw ProtocolError(fmt::format("unknown endpoint '{}' (this server answers \"infer\" and \"reset\")",
                                        endpoint.substr(0, 64)));
    }
    return req;
}

}  // namespace dzr::serve
