#include "serve/server.h"

#include <algorithm>
#include <csignal>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <utility>  // NOTE: before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "core/error.h"
#include "core/log.h"

namespace dzr::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

/// Bytes one read may take: a message arrives in chunks of this, so an oversized one is never held whole.
constexpr size_t kReadChunk = size_t(1) << 20;
/// A buffer grown past this by a large message is given back afterwards.
constexpr size_t kKeepBufferBytes = size_t(4) << 20;

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

/// A message read whole.
struct Message {
    std::string data;
    bool binary = true;
    Clock::time_point received;
};

/// A frame to send; `timed` replies close a request (logged, counted in the report).
struct Outgoing {
    bool text = false;
    std::string payload;
    uint16_t close_code = 0;
    std::string close_reason;
    bool timed = false;
    std::string label, category;
    Clock::time_point received;
};

/// An untimed frame (the greeting, a refusal).
Outgoing frame(bool text, std::string payload, uint16_t close_code = 0) {
    Outgoing o;
    o.text = text;
    o.payload = std::move(payload);
    o.close_code = close_code;
    return o;
}

enum class ConnState { Handshake, Queued, Active, Closed };

struct Connection {
    Connection(tcp::socket socket, uint64_t id) : ws(std::move(socket)) { info.id = id; }

    websocket::stream<beast::tcp_stream> ws;
    ClientInfo info;
    ConnState state = ConnState::Handshake;
    Clock::time_point connected = Clock::now();
    // reading
    beast::flat_buffer buffer;
    size_t message_bytes = 0;
    bool oversized = false;
    bool reading = false;
    std::deque<Message> inbox;
    // writing
    std::deque<Outgoing> outbox;
    bool writing = false;
    bool closing = false;          // async_close started
    uint16_t close_when_sent = 0;  // close with this code once the outbox is empty
    uint64_t requests = 0;
};

using ConnPtr = std::shared_ptr<Connection>;

}  // namespace

struct Server::Impl {
    Impl(Handler& h, ServerOptions o) : handler(h), options(std::move(o)) {}

    Handler& handler;
    ServerOptions options;
    net::io_context io{1};
    net::io_context worker_io{1};
    std::optional<net::executor_work_guard<net::io_context::executor_type>> worker_guard;
    std::optional<tcp::acceptor> acceptor;
    std::optional<net::signal_set> signals;
    std::string greeting;  // the handler's, asked once

    std::set<ConnPtr> connections;  // every connection past accept
    std::vector<ConnPtr> active;    // the clients being served (at most options.max_sessions), in order of service
    std::deque<ConnPtr> queue;      // clients waiting, oldest first
    ConnPtr running;                // the client whose request is on the worker (null: none)
    bool stopping = false;
    bool shut_down = false;
    uint64_t next_id = 1;
    ServeReport report;

    // ---- accept and handshake -----------------------------------------------------------------------------
    void start_accept() {
        acceptor->async_accept(io, [this](beast::error_code ec, tcp::socket socket) {
            if (ec) {
                if (ec == net::error::operation_aborted || stopping) return;
                log()->warn("serve: accept failed: {}", ec.message());
            } else {
                on_accept(std::move(socket));
            }
            if (!stopping) start_accept();
        });
    }

    void on_accept(tcp::socket socket) {
        auto c = std::make_shared<Connection>(std::move(socket), next_id++);
        beast::error_code ec;
        const auto remote = beast::get_lowest_layer(c->ws).socket().remote_endpoint(ec);
        c->info.address = ec ? "unknown" : fmt::format("{}:{}", remote.address().to_string(), remote.port());
        connections.insert(c);
        // NOTE: the websocket stream's own timeouts, for the handshakes only: a client may idle for as long
        // as it likes
        beast::get_lowest_layer(c->ws).expires_never();
        websocket::stream_base::timeout t{};
        t.handshake_timeout = options.handshake_timeout;
        t.idle_timeout = websocket::stream_base::none();
        t.keep_alive_pings = false;
        c->ws.set_option(t);
        c->ws.set_option(websocket::stream_base::decorator(
            [](websocket::response_type& res) { res.set(beast::http::field::server, "dzr serve"); }));
        // NOTE: Beast cuts a message off past this (1009, no text); up to it, read() drains an oversized
        // message and answers it with a text error
        c->ws.read_message_max(options.max_message_bytes * 4 + kReadChunk);
        c->ws.async_accept([this, c](beast::error_code ec) { on_handshake(c, ec); });
    }

    void on_handshake(const ConnPtr& c, beast::error_code ec) {
        if (c->state == ConnState::Closed) return;
        if (ec) {
            log()->info("serve: client {} ({}): websocket handshake failed: {}", c->info.id, c->info.address,
                        ec.message());
            gone(c, "");
            return;
        }
        ++report.clients;
        log()->info("serve: client {} connected from {}", c->info.id, c->info.address);
        send(c, frame(false, greeting));
        if (stopping) {
            refuse(c, "the server is shutting down", kCloseGoingAway);
        } else if (active.size() < options.max_sessions) {
            activate(c);
        } else if (queue.size() >= options.max_queued) {
            refuse(c,
                   fmt::format("the server is busy: {} being served and {} more are waiting", served(),
                               queue.size()),
                   kCloseTryAgainLater);
        } else {
            c->state = ConnState::Queued;
            queue.push_back(c);
            log()->info("serve: client {} queued (position {}): {} being served; {} at a time", c->info.id,
                        queue.size(), served(),
                        options.max_sessions == 1 ? std::string("one session")
                                                  : fmt::format("{} sessions", options.max_sessions));
        }
        read(c);
    }

    /// "client 3 is", "clients 3, 5 are" (the clients being served, for a log line).
    std::string served() const {
        std::string ids;
        for (const ConnPtr& a : active) ids += fmt::format("{}{}", ids.empty() ? "" : ", ", a->info.id);
        return fmt::format("client{} {} {}", active.size() == 1 ? "" : "s", ids, active.size() == 1 ? "is" : "are");
    }

    void refuse(const ConnPtr& c, const std::string& why, uint16_t code) {
        ++report.refused;
        log()->warn("serve: client {} refused: {}", c->info.id, why);
        send(c, frame(true, "dzr serve: " + why, code));
    }

    void activate(const ConnPtr& c) {
        active.push_back(c);
        c->state = ConnState::Active;
        pump();
    }

    // ---- reading ------------------------------------------------------------------------------------------
    void read(const ConnPtr& c) {
        // NOTE: one message waits at most; the next read starts when it is taken (a pipelining client waits)
        if (c->reading || c->closing || c->state == ConnState::Closed || !c->inbox.empty()) return;
        c->reading = true;
        c->ws.async_read_some(c->buffer, kReadChunk,
                              [this, c](beast::error_code ec, size_t n) { on_read(c, ec, n); });
    }

    void on_read(const ConnPtr& c, beast::error_code ec, size_t n) {
        c->reading = false;
        if (c->state == ConnState::Closed) return;
        if (ec) {
            gone(c, ec == websocket::error::closed ? "" : ec.message());
            return;
        }
        c->message_bytes += n;
        if (c->message_bytes > options.max_message_bytes) {
            c->oversized = true;
            c->buffer.consume(c->buffer.size());
        }
        if (!c->ws.is_message_done()) {
            read(c);
            return;
        }
        const auto now = Clock::now();
        if (c->oversized) {
            send(c,
                 Outgoing{.text = true,
                          .payload = fmt::format("dzr serve: error: the message has {} bytes, more than the "
                                                 "server's limit of {} (--max-message-mb)",
                                                 c->message_bytes, options.max_message_bytes),
                          .close_code = kCloseTooBig,
                          .close_reason = "message too big",
                          .timed = true,
                          .label = fmt::format("a message of {} bytes, over the limit", c->message_bytes),
                          .category = "error",
                          .received = now});
        } else {
            c->inbox.push_back({beast::buffers_to_string(c->buffer.data()), c->ws.got_binary(), now});
        }
        c->buffer.consume(c->buffer.size());
        if (c->buffer.capacity() > kKeepBufferBytes) c->buffer.shrink_to_fit();
        c->message_bytes = 0;
        c->oversized = false;
        pump();
        read(c);
    }

    // ---- the worker ---------------------------------------------------------------------------------------
    /// The served client whose waiting request came first (null: none waits), so that the requests of several
    /// clients run in the order they arrived.
    ConnPtr next_request() const {
        ConnPtr next;
        for (const ConnPtr& a : active) {
            if (a->inbox.empty() || a->closing || a->close_when_sent) continue;
            if (!next || a->inbox.front().received < next->inbox.front().received) next = a;
        }
        return next;
    }

    void pump() {
        if (running) return;
        ConnPtr c = next_request();
        if (!c) return;
        Message m = std::move(c->inbox.front());
        c->inbox.pop_front();
        running = c;
        ++c->requests;
        net::post(worker_io, [this, c, m = std::move(m)]() mutable {
            Reply r;
            try {
                r = handler.handle(c->info, m.data, m.binary);
            } catch (const std::exception& e) {
                r = Reply{.text = true,
                          .payload = fmt::format("dzr serve: internal error: {}", e.what()),
                          .close_code = kCloseInternalError,
                          .label = "internal error",
                          .category = "error"};
            }
            m.data = std::string();  // NOTE: freed on the worker, before the reply waits for the io thread
            net::post(io, [this, c, r = std::move(r), received = m.received]() mutable {
                on_reply(c, std::move(r), received);
            });
        });
        read(c);  // the inbox has room again
    }

    void on_reply(const ConnPtr& c, Reply r, Clock::time_point received) {
        running.reset();
        if (c->state == ConnState::Closed || c->closing) {
            ++report.dropped_replies;
            report.requests.push_back({r.category, ms_since(received)});
            log()->info("serve: client {}: {}; reply dropped, the client is gone ({:.1f} ms)", c->info.id,
                        r.label, ms_since(received));
        } else {
            send(c, Outgoing{.text = r.text,
                             .payload = std::move(r.payload),
                             .close_code = r.close_code,
                             .close_reason = r.close_code ? "see the previous message" : "",
                             .timed = true,
                             .label = std::move(r.label),
                             .category = std::move(r.category),
                             .received = received});
            if (stopping && !c->close_when_sent) c->close_when_sent = kCloseGoingAway;
            flush(c);
        }
        pump();
    }

    // ---- writing ------------------------------------------------------------------------------------------
    void send(const ConnPtr& c, Outgoing o) {
        if (c->state == ConnState::Closed || c->closing) return;
        if (o.close_code) c->close_when_sent = o.close_code;
        c->outbox.push_back(std::move(o));
        flush(c);
    }

    /// Writes the next frame, or closes once the outbox is empty and a close is due.
    void flush(const ConnPtr& c) {
        if (c->writing || c->closing || c->state == ConnState::Closed) return;
        if (c->outbox.empty()) {
            if (c->close_when_sent) close(c, c->close_when_sent);
            return;
        }
        c->writing = true;
        const Outgoing& o = c->outbox.front();
        c->ws.text(o.text);
        c->ws.async_write(net::buffer(o.payload), [this, c](beast::error_code ec, size_t) {
            c->writing = false;
            if (c->state == ConnState::Closed) return;
            Outgoing done = std::move(c->outbox.front());
            c->outbox.pop_front();
            if (done.timed) {
                const double ms = ms_since(done.received);
                report.requests.push_back({done.category, ms});
                log()->info("serve: client {}: {}; {:.1f} ms request to reply", c->info.id, done.label, ms);
            }
            if (ec) {
                gone(c, ec.message());
                return;
            }
            if (done.close_code) {
                close(c, done.close_code, done.close_reason);
                return;
            }
            flush(c);
        });
    }

    void close(const ConnPtr& c, uint16_t code, const std::string& reason = "") {
        if (c->closing || c->state == ConnState::Closed) return;
        c->closing = true;
        c->ws.async_close(websocket::close_reason(websocket::close_code(code), reason),
                          [this, c](beast::error_code ec) {
                              gone(c, ec && ec != websocket::error::closed ? ec.message() : "");
                          });
    }

    // ---- the end of a connection --------------------------------------------------------------------------
    void gone(const ConnPtr& c, const std::string& why) {
        if (c->state == ConnState::Closed) return;
        const ConnState was = c->state;
        c->state = ConnState::Closed;
        // NOTE: its pending operations end with operation_aborted (and find it Closed)
        beast::error_code ignored;
        beast::get_lowest_layer(c->ws).socket().close(ignored);
        connections.erase(c);
        if (was != ConnState::Handshake)
            log()->info("serve: client {} disconnected after {} requests, {:.1f} s{}", c->info.id,
                        c->requests, ms_since(c->connected) / 1e3, why.empty() ? "" : " (" + why + ")");
        if (was == ConnState::Queued) queue.erase(std::remove(queue.begin(), queue.end(), c), queue.end());
        if (const auto it = std::find(active.begin(), active.end(), c); it != active.end()) {
            active.erase(it);
            // NOTE: posted behind the client's request if one runs: the handler sees its calls, then this
            net::post(worker_io, [this, info = c->info] {
                try {
                    handler.client_done(info);
                } catch (const std::exception& e) {
                    log()->error("serve: ending client {}'s session: {}", info.id, e.what());
                }
            });
            next_client();
        }
        if (stopping && connections.empty()) finish();
    }

    void next_client() {
        if (stopping) return;
        while (!queue.empty() && active.size() < options.max_sessions) {
            ConnPtr c = queue.front();
            queue.pop_front();
            if (c->state == ConnState::Closed) continue;
            log()->info("serve: client {} is served now (waited {:.1f} s)", c->info.id,
                        ms_since(c->connected) / 1e3);
            activate(c);
        }
    }

    // ---- stopping -----------------------------------------------------------------------------------------
    void begin_stop(const char* why) {
        if (stopping) return;
        stopping = true;
        log()->info(
            "serve: {}: stopping (the request in flight finishes and is answered; then every connection "
            "closes; a second signal kills)",
            why);
        beast::error_code ignored;
        if (signals) {
            signals->cancel(ignored);
            signals->clear(ignored);  // NOTE: asio restores the default action: a second Ctrl-C kills
        }
        if (acceptor) acceptor->close(ignored);
        const std::vector<ConnPtr> all(connections.begin(), connections.end());
        for (const ConnPtr& c : all) {
            if (c->state == ConnState::Handshake) {
                gone(c, "shutting down");
            } else if (c == running) {
                // closed once its reply is sent (on_reply)
            } else {
                if (!c->close_when_sent) c->close_when_sent = kCloseGoingAway;
                flush(c);
            }
        }
        if (connections.empty()) finish();
    }

    void finish() {
        if (shut_down) return;
        shut_down = true;
        net::post(worker_io, [this] {
            try {
                handler.shutdown();
            } catch (const std::exception& e) {
                log()->error("serve: shutting the handler down: {}", e.what());
            }
        });
        worker_guard.reset();  // the worker returns once its queue is done
    }
};

Server::Server(Handler& handler, ServerOptions options)
    : impl_(std::make_unique<Impl>(handler, std::move(options))) {}

Server::~Server() = default;

void Server::stop() {
    net::post(impl_->io, [impl = impl_.get()] { impl->begin_stop("stop requested"); });
}

ServeReport Server::run() {
    Impl& s = *impl_;
    const ServerOptions& o = s.options;
    DZR_CHECK(o.max_message_bytes > 0, "serve: the message size limit must be positive");
    DZR_CHECK(o.max_sessions >= 1, "serve: at least one client must be served at a time, got {}", o.max_sessions);
    s.greeting = s.handler.greeting();
    tcp::endpoint endpoint;
    try {
        tcp::resolver resolver(s.io);
        const auto results = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive);
        DZR_CHECK(!results.empty(), "serve: cannot resolve host '{}'", o.host);
        endpoint = results.begin()->endpoint();
        s.acceptor.emplace(s.io);
        s.acceptor->open(endpoint.protocol());
        s.acceptor->set_option(net::socket_base::reuse_address(true));
        s.acceptor->bind(endpoint);
        s.acceptor->listen(net::socket_base::max_listen_connections);
    } catch (const boost::system::system_error& e) {
        DZR_THROW("serve: cannot listen on {}:{}: {}", o.host, o.port, e.code().message());
    }
    const uint16_t port = s.acceptor->local_endpoint().port();
    if (o.handle_signals) {
        s.signals.emplace(s.io, SIGINT, SIGTERM);
        s.signals->async_wait([&s](beast::error_code ec, int sig) {
            if (!ec) s.begin_stop(sig == SIGINT ? "SIGINT" : "SIGTERM");
        });
    }
    s.worker_guard.emplace(net::make_work_guard(s.worker_io));
    std::thread worker([&s] {
        try {
            s.worker_io.run();
        } catch (const std::exception& e) {
            log()->error("serve: worker: {}", e.what());
        }
    });
    if (o.on_listening) o.on_listening(endpoint.address().to_string(), port);
    s.start_accept();
    try {
        s.io.run();
    } catch (...) {
        s.worker_guard.reset();
        s.worker_io.stop();
        worker.join();
        throw;
    }
    worker.join();
    return std::move(s.report);
}

}  // namespace dzr::serve
