#include "weights/bulk_load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/staging.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace dzr {

namespace fs = std::filesystem;

namespace {

/// O_DIRECT's alignment of offsets, lengths and buffers (the largest logical block size in use).
constexpr uint64_t kAlign = 4096;
/// The most one pread asks for (Linux returns at most 2 GiB - 4 KiB per call anyway).
constexpr uint64_t kMaxRead = uint64_t(1) << 30;
constexpr size_t kMaxChunkBytes = size_t(1) << 30;
constexpr int kMaxThreads = 256;

uint64_t align_down(uint64_t x) {
    return x / kAlign * kAlign;
}
uint64_t align_up(uint64_t x) {
    return (x + kAlign - 1) / kAlign * kAlign;
}

/// One file opened for reading, closed with the object.
class ReadFile {
  public:
    ReadFile(const fs::path& path, bool want_direct) : path_(path) {
        if (want_direct) {
            fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
            // NOTE: a file system without O_DIRECT (tmpfs before Linux 6.6) refuses it: read buffered.
            if (fd_ >= 0)
                direct_ = true;
            else if (errno != EINVAL)
                fail_open();
        }
        if (fd_ < 0) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) fail_open();
        struct stat st {};
        if (::fstat(fd_, &st) != 0) {
            const int err = errno;
            ::close(fd_);
            DZR_THROW("cannot stat {}: {}", path_.string(), std::strerror(err));
        }
        size_ = uint64_t(st.st_size);
        if (!direct_) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    ~ReadFile() {
        if (fd_ >= 0) ::close(fd_);
    }
    ReadFile(const ReadFile&) = delete;
    ReadFile& operator=(const ReadFile&) = delete;

    const fs::path& path() const { return path_; }
    bool direct() const { return direct_; }
    uint64_t size() const { return size_; }

    /// Reads file bytes [offset, offset + n) into buf (any alignment; buffered files only).
    void read_exact(uint8_t* buf, uint64_t offset, uint64_t n, const std::string& what) const {
        uint64_t got = 0;
        while (got < n) {
            const ssize_t r =
                ::pread(fd_, buf + got, size_t(std::min(n - got, kMaxRead)), off_t(offset + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) fail_read(offset, n, what, errno);
            if (r == 0) fail_short(offset, n, offset + got, what);
            got += uint64_t(r);
        }
    }

    /// Reads file bytes [offset, offset + n) into buf (4096-byte aligned, room for n + 8192 bytes) with reads
    /// widened to the alignment O_DIRECT needs; returns where in buf the byte at `offset` landed.
    size_t read_aligned(uint8_t* buf, uint64_t offset, uint64_t n, const std::string& what) const {
        const uint64_t a0 = align_down(offset), want = align_up(offset + n) - a0, need = offset + n - a0;
        uint64_t got = 0;
        while (got < need) {
            const ssize_t r =
                ::pread(fd_, buf + got, size_t(std::min(want - got, kMaxRead)), off_t(a0 + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) fail_read(offset, n, what, errno);
            if (r == 0) fail_short(offset, n, a0 + got, what);
            got += uint64_t(r);
            // NOTE: O_DIRECT returns an unaligned count only at the file's end (a next read is refused).
            if (got < need && uint64_t(r) % kAlign != 0) fail_short(offset, n, a0 + got, what);
        }
        return size_t(offset - a0);
    }

  private:
    [[noreturn]] void fail_open() const {
        DZR_THROW("cannot open {}: {}", path_.string(), std::strerror(errno));
    }
    [[noreturn]] void fail_read(uint64_t offset, uint64_t n, const std::string& what, int err) const {
        DZR_THROW("cannot read {} (bytes [{}, {}), {}){}: {}", path_.string(), offset, offset + n, what,
                  direct_ ? " with O_DIRECT" : "", std::strerror(err));
    }
    [[noreturn]] void fail_short(uint64_t offset, uint64_t n, uint64_t end, const std::string& what) const {
        DZR_THROW(
            "{}: the file ends at byte {}, inside {} (bytes [{}, {})): it is shorter than its header says "
            "(truncated or rewritten while loading?)",
            path_.string(), end, what, offset, offset + n);
    }

    fs::path path_;
    int fd_ = -1;
    bool direct_ = false;
    uint64_t size_ = 0;
};

struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
};

/// Free staging slots, handed out first in, first out (the slot released longest ago has most likely finished
/// its copies).
class SlotPool {
  public:
    explicit SlotPool(int slots) {
        for (int i = 0; i < slots; ++i) free_.push_back(i);
    }
    int take() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !free_.empty(); });
        const int s = free_.front();
        free_.pop_front();
        return s;
    }
    void give(int s) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            free_.push_back(s);
        }
        cv_.notify_one();
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<int> free_;
};

/// One slot for one chunk: taken from the pool and acquired (its last copies done); released and given back
/// at the end, also when reading fails, so the slot's next user waits for whatever copies were queued.
class SlotLease {
  public:
    SlotLease(SlotPool& pool, StagingRing& ring) : pool_(pool), ring_(ring), slot_(pool.take()) {
        try {
            data_ = ring.acquire(slot_);
        } catch (...) {
            pool_.give(slot_);
            throw;
        }
    }
    ~SlotLease() {
        try {
            ring_.release(slot_);
        } catch (const std::exception& e) {
            log()->error("staging: releasing slot {} failed: {}", slot_, e.what());
        }
        pool_.give(slot_);
    }
    SlotLease(const SlotLease&) = delete;
    SlotLease& operator=(const SlotLease&) = delete;
    int slot() const { return slot_; }
    uint8_t* data() const { return data_; }

  private:
    SlotPool& pool_;
    StagingRing& ring_;
    int slot_;
    uint8_t* data_ = nullptr;
};

/// "tensor k" for one piece, "tensors a .. b" for several.
std::string describe(const BulkChunk& c, const std::vector<BulkLoadItem>& items) {
    const std::string& first = items[c.pieces.front().item].key;
    if (c.pieces.size() == 1) return "tensor " + first;
    return fmt::format("tensors {} .. {}", first, items[c.pieces.back().item].key);
}

uint8_t* dst_bytes(const BulkLoadItem& item) {
    return static_cast<uint8_t*>(item.dst.data);
}

/// One reader thread's state: its bounce buffer for conversions and O_DIRECT reads on the host path.
class Reader {
  public:
    Reader(const std::vector<BulkLoadItem>& items, const std::vector<std::unique_ptr<ReadFile>>& files,
           size_t buffer_bytes, StagingRing* ring, SlotPool* pool)
        : items_(items), files_(files), buffer_bytes_(buffer_bytes), ring_(ring), pool_(pool) {}

    void read(const BulkChunk& c) {
        if (ring_)
            read_staged(c);
        else
            read_host(c);
    }

  private:
    uint8_t* bounce() {
        if (!bounce_) {
            bounce_.reset(static_cast<uint8_t*>(std::aligned_alloc(size_t(kAlign), buffer_bytes_)));
            DZR_CHECK(bounce_ != nullptr, "bulk load: cannot allocate a {}-byte read buffer", buffer_bytes_);
        }
        return bounce_.get();
    }

    /// Reads the chunk's file bytes into buf (room for buffer_bytes_); returns the first byte's position in
    /// buf.
    size_t read_into(const BulkChunk& c, uint8_t* buf) {
        const ReadFile& f = *files_[c.file];
        const std::string what = describe(c, items_);
        if (f.direct()) return f.read_aligned(buf, c.offset, c.bytes, what);
        f.read_exact(buf, c.offset, c.bytes, what);
        return 0;
    }

    /// The one piece of a conversion chunk from its stored dtype at `raw` into `out` (the destination's
    /// dtype).
    void convert(const BulkChunk& c, const uint8_t* raw, uint8_t* out) const {
        const BulkPiece& p = c.pieces.front();
        const BulkLoadItem& item = items_[p.item];
        const int64_t n = int64_t(p.bytes / dtype_size(item.stored));
        convert_copy_host(TensorView(const_cast<uint8_t*>(raw), item.stored, Shape{n}),
                          TensorView(out, item.dst.dtype, Shape{n}));
    }

    /// Where a conversion chunk's piece starts in its destination.
    uint8_t* converted_dst(const BulkChunk& c) const {
        const BulkPiece& p = c.pieces.front();
        const BulkLoadItem& item = items_[p.item];
        return dst_bytes(item) + p.item_offset / dtype_size(item.stored) * dtype_size(item.dst.dtype);
    }

    void read_staged(const BulkChunk& c) {
        SlotLease lease(*pool_, *ring_);
        if (c.convert) {
            uint8_t* buf = bounce();
            convert(c, buf + read_into(c, buf), lease.data());
            const BulkPiece& p = c.pieces.front();
            const BulkLoadItem& item = items_[p.item];
            const size_t out = size_t(p.bytes / dtype_size(item.stored) * dtype_size(item.dst.dtype));
            ring_->copy(lease.slot(), 0, converted_dst(c), out);
            return;
        }
        size_t at = read_into(c, lease.data());
        for (const BulkPiece& p : c.pieces) {
            ring_->copy(lease.slot(), at, dst_bytes(items_[p.item]) + p.item_offset, size_t(p.bytes));
            at += size_t(p.bytes);
        }
    }

    void read_host(const BulkChunk& c) {
        if (c.convert) {
            uint8_t* buf = bounce();
            convert(c, buf + read_into(c, buf), converted_dst(c));
            return;
        }
        const ReadFile& f = *files_[c.file];
        if (!f.direct()) {
            // NOTE: straight into the tensors, one read per piece (the pieces are consecutive in the file).
            uint64_t pos = c.offset;
            for (const BulkPiece& p : c.pieces) {
                f.read_exact(dst_bytes(items_[p.item]) + p.item_offset, pos, p.bytes,
                             "tensor " + items_[p.item].key);
                pos += p.bytes;
            }
            return;
        }
        uint8_t* buf = bounce();
        size_t at = read_into(c, buf);
        for (const BulkPiece& p : c.pieces) {
            std::memcpy(dst_bytes(items_[p.item]) + p.item_offset, buf + at, size_t(p.bytes));
            at += size_t(p.bytes);
        }
    }

    const std::vector<BulkLoadItem>& items_;
    const std::vector<std::unique_ptr<ReadFile>>& files_;
    size_t buffer_bytes_;
    StagingRing* ring_;
    SlotPool* pool_;
    std::unique_ptr<uint8_t, FreeDeleter> bounce_;
};

void check_item(const BulkLoadItem& item, const Backend& be) {
    const TensorView& d = item.dst;
    DZR_CHECK(d.device == be.device() && (d.data != nullptr || d.numel() == 0),
              "bulk load: tensor {}: the destination {} is not a tensor on {}", item.key, d.str(),
              be.device().str());
    DZR_CHECK(d.is_contiguous(), "bulk load: tensor {}: the destination {} is not contiguous", item.key,
              d.str());
    DZR_CHECK(item.stored == d.dtype || (dtype_is_float(item.stored) && dtype_is_float(d.dtype)),
              "bulk load: tensor {}: cannot convert the stored {} to {}", item.key, dtype_name(item.stored),
              dtype_name(d.dtype));
}

}  // namespace

std::string BulkLoadStats::summary() const {
    std::string how = slots > 0 ? fmt::format("{} x {} MiB pinned staging", slots, slot_bytes >> 20)
                                : "straight into host tensors";
    return fmt::format(
        "{:.2f} GB from {} file{} in {:.2f} s ({:.2f} GB/s): {} tensors, {} reads, {} thread{}, {}, {} "
        "reads",
        double(file_bytes) / 1e9, files, files == 1 ? "" : "s", seconds, gb_per_s(), tensors, chunks, threads,
        threads == 1 ? "" : "s", how, direct ? "O_DIRECT" : "buffered");
}

int bulk_load_threads(const BulkLoadOptions& o) {
    if (o.threads > 0) return o.threads;
    return int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

BulkPlan plan_bulk_load(const std::vector<BulkLoadItem>& items, size_t chunk_bytes) {
    DZR_CHECK(chunk_bytes > 0 && chunk_bytes <= kMaxChunkBytes,
              "bulk load: a read of {} bytes is not in (0, {}]", chunk_bytes, kMaxChunkBytes);
    const uint64_t S = align_up(chunk_bytes);
    BulkPlan plan;
    std::map<std::string, size_t> file_index;
    for (const auto& item : items) file_index.emplace(item.file.string(), 0);
    for (auto& [name, index] : file_index) {
        index = plan.files.size();
        plan.files.emplace_back(name);
    }
    std::vector<size_t> order(items.size());
    std::vector<size_t> file_of(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
        order[i] = i;
        file_of[i] = file_index.at(items[i].file.string());
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (file_of[a] != file_of[b]) return file_of[a] < file_of[b];
        if (items[a].offset != items[b].offset) return items[a].offset < items[b].offset;
        return a < b;
    });

    BulkChunk cur;
    bool open = false;
    const auto close = [&] {
        if (open) plan.chunks.push_back(std::move(cur));
        cur = BulkChunk{};
        open = false;
    };
    for (size_t i : order) {
        const BulkLoadItem& item = items[i];
        const uint64_t total = item.stored_bytes();
        if (total == 0) continue;
        if (item.stored != item.dst.dtype) {
            close();
            const uint64_t es = dtype_size(item.stored), ed = dtype_size(item.dst.dtype);
            const uint64_t per = std::max<uint64_t>(1, S / std::max(es, ed)) * es;  // stored bytes per chunk
            for (uint64_t at = 0; at < total; at += per) {
                const uint64_t n = std::min(per, total - at);
                plan.chunks.push_back({file_of[i], item.offset + at, n, true, {{i, at, n}}});
            }
            continue;
        }
        for (uint64_t at = 0; at < total;) {
            const uint64_t pos = item.offset + at;
            if (open && (cur.file != file_of[i] || cur.offset + cur.bytes != pos || cur.bytes == S)) close();
            if (!open) {
                cur.file = file_of[i];
                cur.offset = pos;
                open = true;
            }
            const uint64_t take = std::min(total - at, S - cur.bytes);
            cur.pieces.push_back({i, at, take});
            cur.bytes += take;
            at += take;
        }
    }
    close();
    return plan;
}

BulkLoadStats bulk_load(const std::vector<BulkLoadItem>& items, Backend& be, const BulkLoadOptions& o) {
    const Timer timer;
    DZR_CHECK(o.threads >= 0 && o.threads <= kMaxThreads, "bulk load: threads must be in [0, {}], got {}",
              kMaxThreads, o.threads);
    DZR_CHECK(o.slots >= 0, "bulk load: staging slots must be 0 (automatic) or more, got {}", o.slots);
    for (const auto& item : items) check_item(item, be);
    const BulkPlan plan = plan_bulk_load(items, o.chunk_bytes);

    BulkLoadStats stats;
    stats.files = plan.files.size();
    stats.chunks = plan.chunks.size();
    for (const auto& item : items) {
        if (item.stored_bytes() == 0) continue;
        ++stats.tensors;
        stats.tensor_bytes += item.dst.nbytes();
    }
    for (const auto& c : plan.chunks) stats.file_bytes += c.bytes;
    if (plan.chunks.empty()) {
        stats.seconds = timer.seconds();
        return stats;
    }

    // Open every file and check it holds every range read from it before anything is read.
    std::vector<std::unique_ptr<ReadFile>> files;
    for (const auto& path : plan.files) files.push_back(std::make_unique<ReadFile>(path, o.direct));
    stats.direct = std::all_of(files.begin(), files.end(), [](const auto& f) { return f->direct(); });
    if (o.direct && !stats.direct)
        log()->warn("bulk load: O_DIRECT refused by the file system; reading buffered");
    for (const auto& c : plan.chunks) {
        const ReadFile& f = *files[c.file];
        if (c.offset + c.bytes <= f.size()) continue;
        for (const auto& p : c.pieces) {
            const BulkLoadItem& item = items[p.item];
            const uint64_t begin = item.offset, end = item.offset + item.stored_bytes();
            DZR_CHECK(
                end <= f.size(),
                "{}: the file has {} bytes but tensor {} is stored at bytes [{}, {}): it is shorter than its "
                "header says (truncated or rewritten after it was opened?)",
                f.path().string(), f.size(), item.key, begin, end);
        }
    }

    const size_t buffer_bytes = size_t(align_up(o.chunk_bytes)) + 2 * size_t(kAlign);
    const int threads = int(std::min<size_t>(size_t(bulk_load_threads(o)), plan.chunks.size()));
    stats.threads = threads;
    const int slots = o.slots > 0 ? o.slots : threads + 2;
    std::unique_ptr<StagingRing> ring = make_staging_ring(be, StagingOptions{buffer_bytes, slots});
    std::unique_ptr<SlotPool> pool;
    if (ring) {
        ring->begin();
        pool = std::make_unique<SlotPool>(ring->slots());
        stats.slots = ring->slots();
        stats.slot_bytes = ring->slot_bytes();
    }

    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first;
    std::mutex mu;
    const auto work = [&] {
        Reader reader(items, files, buffer_bytes, ring.get(), pool.get());
        for (size_t i; !failed.load() && (i = next.fetch_add(1)) < plan.chunks.size();) {
            try {
                reader.read(plan.chunks[i]);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu);
                if (!first) first = std::current_exception();
                failed.store(true);
            }
        }
    };
    if (threads == 1) {
        work();
    } else {
        std::vector<std::thread> pool_threads;
        pool_threads.reserve(size_t(threads));
        try {
            for (int t = 0; t < threads; ++t) pool_threads.emplace_back(work);
        } catch (...) {
            // NOTE: no more threads to be had: the ones running finish the work
            if (pool_threads.empty()) throw;
        }
        for (auto& t : pool_threads) t.join();
    }
    if (first) std::rethrow_exception(first);  // NOTE: the ring's destructor waits for the queued copies
    if (ring) ring->finish();
    stats.seconds = timer.seconds();
    return stats;
}

}  // namespace dzr
