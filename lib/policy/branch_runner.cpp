#include "policy/branch_runner.h"

#include <vector>

#include "core/error.h"

namespace dzr {

const char* forward_kind_name(ForwardKind kind) {
    switch (kind) {
        case ForwardKind::Prefill:
            return "prefill";
        case ForwardKind::Commit:
            return "commit";
        case ForwardKind::Denoise:
            return "denoise";
    }
    return "?";
}

namespace {

class HostCommunicator final : public Communicator {
public:
    void transfer(Backend& from, const TensorView& src, Backend& to, const TensorView& dst) override {
        DZR_CHECK(src.numel() == dst.numel() && src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous(),
                  "communicator: cannot move {} into {}", src.str(), dst.str());
        staging_.resize(src.nbytes());
        const TensorView host(staging_.data(), src.dtype, src.shape, Device::cpu());
        from.download(src, host);
        to.upload(host, dst);
    }
    std::string describe() const override { return "host copies"; }

private:
    std::vector<char> staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_communicator() { return std::make_unique<HostCommunicator>(); }

BranchRunner::BranchRunner(int branch, Backend& be, const CausalDit& dit, Backend& primary, Communicator* comm)
    : branch_(branch), be_(be), dit_(dit), primary_(primary), comm_(comm) {
    DZR_CHECK(!remote() || comm_ != nullptr, "branch {}: a runner on another backend needs a communicator", branch);
    time_rows_ = dit_.make_timestep_rows(be_);
}

void BranchRunner::enable_graphs(bool on) {
    if (on && graphs_supported(be_)) {
        if (!graphs_) graphs_ = std::make_unique<ForwardGraphs>(be_.stream(), kBranchNames[branch_]);
    } else {
        graphs_.reset();
    }
}

ForwardGraphStats BranchRunner::graph_stats() const { return graphs_ ? graphs_->stats() : ForwardGraphStats{}; }

ForwardGraphKey BranchRunner::graph_key(ForwardKind kind, const KvForwardSpec& spec, const DitInputs& in,
                                        const DitOutputs& out, const SelfAttentionCache& cache) const {
    ForwardGraphKey key;
    key.kind = int(kind);
    key.branch = branch_;
    key.frames = spec.video_frames;
    key.start_frame = in.start_frame;
    key.history_tokens = cache.history_tokens();
    key.register_tokens = spec.register_tokens;
    key.committing = spec.commit;
    key.numerics = int(be_.numerics());
    const CudaBackendOptions o = be_.cuda_options();
    key.settings = {int64_t(o.attention), int64_t(o.paged_attention), int64_t(o.plain_gemm), int64_t(o.conv_api),
                    int64_t(o.fallback_only), int64_t(o.fp8_fast_accum), int64_t(o.batched_attention),
                    int64_t(o.gemm_tune)};
    std::vector<uintptr_t>& a = key.addresses;
    const auto add = [&a](const void* p) { a.push_back(reinterpret_cast<uintptr_t>(p)); };
    // NOTE: the forward's activations come from the arena's next offset on: the same offsets, the same addresses
    const Arena& arena = be_.workspace();
    add(arena.base());
    a.push_back(uintptr_t(arena.mark()));
    for (const TensorView* t : {&in.x, &in.y, &out.video_velocity, &out.action_velocity}) add(t->data);
    if (in.registers) {
        add(in.registers->noisy_action.data);
        add(in.registers->state.data);
    }
    add(time_rows_.dit.data());
    add(time_rows_.action.data());
    for (const DitCrossKv::Layer& l : cross_.layers)
        for (const TensorView* t : {&l.k_txt, &l.v_txt, &l.k_img, &l.v_img}) add(t->data);
    if (paged_) {
        add(paged_->device_table().data);
        add(paged_->device_slots().data);
        const KvCacheManager& m = paged_->session().manager();
        for (const TensorView& t : {m.pool_k(0), m.pool_v(0), m.pool_k_scale(0), m.pool_v_scale(0)}) add(t.data);
        // NOTE: an in-place attention bakes the history's first slot into its kernels (the table does not move it)
        a.push_back(uintptr_t(paged_->in_place_slot() + 1));
    }
    return key;
}

BranchRunner::~BranchRunner() = default;

void BranchRunner::use_paged(KvSession& session, int kv_branch, PagedAttentionPath path) {
    paged_ = std::make_unique<PagedSelfAttentionCache>(session, kv_branch, path);
    dense_.reset();
    cross_ = DitCrossKv{};
    cross_.layers.resize(size_t(dit_.config().num_layers));
}

void BranchRunner::use_dense(const KvGeometry& geometry, const KvConfig& config) {
    dense_ = std::make_unique<DenseSelfAttentionCache>(be_, geometry, config);
    paged_.reset();
}

void BranchRunner::reset_history() {
    if (dense_) dense_->reset();
}

void BranchRunner::allocate_io(const Shape& video, const Shape& conditioning, const Shape& action,
                               const Shape& state, DType dtype, DType sample_dtype) {
    if (!remote()) return;
    x_ = be_.alloc(video, sample_dtype);
    video_out_ = be_.alloc(video, sample_dtype);
    y_ = be_.alloc(conditioning, dtype);
    action_ = be_.alloc(action, sample_dtype);
    action_out_ = be_.alloc(action, sample_dtype);
    state_ = be_.alloc(state, dtype);
}

TensorView BranchRunner::inbound(const TensorView& t, const Tensor& local, bool send) {
    if (!remote() || !t.defined()) return t;
    DZR_CHECK(local.defined() && t.numel() <= local.numel(), "branch {}: no room on {} for {}", branch_,
              be_.device().str(), t.str());
    const TensorView view(local.data(), t.dtype, t.shape, be_.device());
    if (send) comm_->transfer(primary_, t, be_, view);
    return view;
}

KvForwardSpec BranchRunner::forward_spec(ForwardKind kind, const BranchIo& io) const {
    const DitConfig& d = dit_.config();
    KvForwardSpec spec;
    spec.commit = kind != ForwardKind::Denoise;
    spec.video_frames = int(io.x.dim(1));
    spec.register_tokens = kind == ForwardKind::Denoise ? d.num_action_per_block + d.num_state_per_block : 0;
    return spec;
}

SelfAttentionCache& BranchRunner::begin_cache(const KvForwardSpec& spec) {
    if (paged_) {
        paged_->begin(spec);
        return *paged_;
    }
    DZR_CHECK(dense_ != nullptr, "branch {}: no KV cache", branch_);
    dense_->begin(spec);
    return *dense_;
}

void BranchRunner::end_cache(bool ok) {
    if (paged_) {
        if (ok) paged_->commit();
        else paged_->abort();
    } else if (dense_) {
        if (ok) dense_->commit();
        else dense_->abort();
    }
}

void BranchRunner::forward(ForwardKind kind, const BranchIo& io, int start_frame, int64_t timestep,
                           int64_t action_timestep, const DitForwardOptions& options) {
    const KvForwardSpec spec = forward_spec(kind, io);

    DitInputs in;
    in.x = inbound(io.x, x_, true);
    in.y = inbound(io.y, y_, true);
    in.start_frame = start_frame;
    in.timestep = timestep;
    in.time_rows = &time_rows_;
    if (kind == ForwardKind::Denoise)
        in.registers = DitRegisterInputs{inbound(io.action, action_, true), action_timestep,
                                         inbound(io.state, state_, true)};
    // NOTE: a remote branch's action velocity stays where it was computed: only the conditional branch's is used
    const DitOutputs out{inbound(io.video_out, video_out_, false), inbound(io.action_out, action_out_, false)};

    SelfAttentionCache& cache = begin_cache(spec);
    try {
        dit_.stage_timesteps(be_, timestep, kind == ForwardKind::Denoise ? action_timestep : -1, time_rows_);
        const auto run = [&] { dit_.forward(be_, in, cross_, cache, out, options); };
        // NOTE: a trace or a finite check reads tensors back inside the forward: op by op. So does the dense
        // reference cache: where it writes and reads its rows is host state (its length and window start) that the
        // key does not hold; the paged cache's is all in the device block table and the history length.
        if (graphs_ && paged_ && !options.trace && !options.check_finite)
            graphs_->run(graph_key(kind, spec, in, out, cache), run);
        else
            run();
    } catch (...) {
        end_cache(false);
        throw;
    }
    end_cache(true);
    if (remote()) comm_->transfer(be_, out.video_velocity, primary_, io.video_out);
}

bool BranchRunner::can_pair(const BranchRunner& a, const BranchRunner& b) {
    return &a != &b && !a.remote() && !b.remote() && &a.be_ == &b.be_ && &a.dit_ == &b.dit_ &&
           a.be_.numerics() == Numerics::Fast && bool(a.paged_) == bool(b.paged_);
}

void BranchRunner::forward_pair(BranchRunner& a, BranchRunner& b, ForwardKind kind, const BranchIo& io_a,
                                const BranchIo& io_b, int start_frame, int64_t timestep, int64_t action_timestep,
                                const DitForwardOptions& options, const std::array<DitTraceFn, 2>& traces) {
    DZR_CHECK(can_pair(a, b), "branches {} and {}: their forwards cannot run as one batch", a.branch_, b.branch_);
    DZR_CHECK(!options.trace, "branches {} and {}: a traced forward runs per branch", a.branch_, b.branch_);
    const KvForwardSpec spec = a.forward_spec(kind, io_a);

    DitInputs in;
    in.x = io_a.x;
    in.y = io_a.y;
    in.start_frame = start_frame;
    in.timestep = timestep;
    in.time_rows = &a.time_rows_;
    if (kind == ForwardKind::Denoise) in.registers = DitRegisterInputs{io_a.action, action_timestep, io_a.state};
    const DitOutputs out_a{io_a.video_out, io_a.action_out}, out_b{io_b.video_out, io_b.action_out};

    SelfAttentionCache& cache_a = a.begin_cache(spec);
    SelfAttentionCache* cache_b = nullptr;
    try {
        cache_b = &b.begin_cache(spec);
    } catch (...) {
        a.end_cache(false);
        throw;
    }
    try {
        a.dit_.stage_timesteps(a.be_, timestep, kind == ForwardKind::Denoise ? action_timestep : -1, a.time_rows_);
        const DitBranch branches[2] = {{&a.cross_, &cache_a, out_a, traces[0]}, {&b.cross_, cache_b, out_b, traces[1]}};
        const auto run = [&] { a.dit_.forward_batch(a.be_, in, branches, options); };
        // NOTE: a traced forward reads its outputs back (op by op), as in forward()
        const bool traced = traces[0] || traces[1];
        if (a.graphs_ && a.paged_ && !options.check_finite && !traced) {
            // NOTE: the key of both: a's forward with b's addresses (its cross K/V, table and outputs) appended
            ForwardGraphKey key = a.graph_key(kind, spec, in, out_a, cache_a);
            const ForwardGraphKey kb = b.graph_key(kind, spec, in, out_b, *cache_b);
            key.branch = kBothBranches;
            key.settings.push_back(kb.history_tokens);
            key.addresses.insert(key.addresses.end(), kb.addresses.begin(), kb.addresses.end());
            a.graphs_->run(key, run);
        } else {
            run();
        }
    } catch (...) {
        a.end_cache(false);
        b.end_cache(false);
        throw;
    }
    a.end_cache(true);
    b.end_cache(true);
}

}  // namespace dzr
