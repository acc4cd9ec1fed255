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
                               const Shape& state, DType dtype) {
    if (!remote()) return;
    x_ = be_.alloc(video, dtype);
    video_out_ = be_.alloc(video, dtype);
    y_ = be_.alloc(conditioning, dtype);
    action_ = be_.alloc(action, dtype);
    action_out_ = be_.alloc(action, dtype);
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

void BranchRunner::forward(ForwardKind kind, const BranchIo& io, int start_frame, int64_t timestep,
                           int64_t action_timestep, const DitForwardOptions& options) {
    const DitConfig& d = dit_.config();
    KvForwardSpec spec;
    spec.commit = kind != ForwardKind::Denoise;
    spec.video_frames = int(io.x.dim(1));
    spec.register_tokens = kind == ForwardKind::Denoise ? d.num_action_per_block + d.num_state_per_block : 0;

    DitInputs in;
    in.x = inbound(io.x, x_, true);
    in.y = inbound(io.y, y_, true);
    in.start_frame = start_frame;
    in.timestep = timestep;
    if (kind == ForwardKind::Denoise)
        in.registers = DitRegisterInputs{inbound(io.action, action_, true), action_timestep,
                                         inbound(io.state, state_, true)};
    // NOTE: a remote branch's action velocity stays where it was computed: only the conditional branch's is used
    const DitOutputs out{inbound(io.video_out, video_out_, false), inbound(io.action_out, action_out_, false)};

    SelfAttentionCache* cache = nullptr;
    if (paged_) {
        paged_->begin(spec);
        cache = paged_.get();
    } else {
        DZR_CHECK(dense_ != nullptr, "branch {}: no KV cache", branch_);
        dense_->begin(spec);
        cache = dense_.get();
    }
    try {
        dit_.forward(be_, in, cross_, *cache, out, options);
    } catch (...) {
        if (paged_) paged_->abort();
        else dense_->abort();
        throw;
    }
    if (paged_) paged_->commit();
    else dense_->commit();
    if (remote()) comm_->transfer(be_, out.video_velocity, primary_, io.video_out);
}

}  // namespace dzr
