#pragma once
/// The websocket loop of `dzr serve` (Boost.Beast), over an abstract Handler so that it runs without a model.
///
/// Up to ServerOptions::max_sessions clients are served at once, one per engine session (one by default): a
/// connection completes its handshake and gets the greeting at once; while every session is taken it waits in a
/// queue (logged) until a served client disconnects; its messages wait unread meanwhile. Every connection is read
/// all the time (one message is buffered at most), so pings are answered and a disconnect is seen even while a
/// request runs. The handler runs on a worker thread of its own, one call at a time: the served clients' requests
/// in the order they arrived (so several clients' calls interleave), a client's client_done() after its last
/// request. A client that vanishes mid-request costs nothing: the request finishes, its reply is dropped,
/// client_done() runs.
///
/// A message above ServerOptions::max_message_bytes is read to its end without being kept and answered with a
/// text error (close code 1009); one past four times the limit is cut off by Beast (1009, no text). SIGINT or
/// SIGTERM (or stop()) stops accepting, lets the request in flight finish and its reply go out, then closes
/// every connection (1001, going away) and returns; a second signal kills the process (its default action
/// is restored).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dzr::serve {

/// Websocket close codes the server uses (RFC 6455 §7.4.1).
enum CloseCode : uint16_t {
    kCloseGoingAway = 1001,
    kCloseUnsupportedData = 1003,
    kClosePolicyViolation = 1008,
    kCloseTooBig = 1009,
    kCloseInternalError = 1011,
    kCloseTryAgainLater = 1013,
};

struct ClientInfo {
    uint64_t id = 0;      ///< 1, 2, ... in order of connection
    std::string address;  ///< "127.0.0.1:51234"
};

/// The handler's answer to one message.
struct Reply {
    bool text = false;  ///< a text frame (errors, the reset reply); else binary
    std::string payload;
    uint16_t close_code = 0;  ///< close the connection after the reply with this code (0: keep it open)
    std::string label;        ///< what the request was, for its log line ("session 'a' call 3, 4 frames")
    std::string category;     ///< its group in the timing summary ("infer, 4 frames", "reset", "error")
};

/// The policy behind the server. handle(), client_done() and shutdown() run on the server's worker thread,
/// one call at a time; greeting() once, when the server starts. With max_sessions above 1 the calls of up to that
/// many clients interleave: the handler keeps each client's state by ClientInfo::id.
class Handler {
  public:
    virtual ~Handler() = default;
    /// The first message of every connection (the protocol's config map), sent on connect.
    virtual std::string greeting() = 0;
    /// One message of a client being served; `binary`: a binary frame, else a text frame.
    virtual Reply handle(const ClientInfo& client, std::string_view message, bool binary) = 0;
    /// A client being served is gone (it disconnected, or the server closed it); after its last handle().
    virtual void client_done(const ClientInfo& client) = 0;
    /// Once, after the last client_done(), when the server stops.
    virtual void shutdown() {}
};

struct ServerOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 8000;  ///< 0: a free port, reported to on_listening
    size_t max_message_bytes = size_t(64) << 20;
    size_t max_sessions = 1;  ///< clients served at once (each its engine session); more wait in the queue
    size_t max_queued = 8;    ///< clients waiting beyond this are refused (a text error, close 1013)
    /// Opening and closing handshakes give up after this (a client that never answers a close).
    std::chrono::seconds handshake_timeout{10};
    bool handle_signals = true;  ///< SIGINT and SIGTERM stop the server
    /// Called once the socket listens (the port is the bound one).
    std::function<void(const std::string& host, uint16_t port)> on_listening;
};

/// One request: its summary group, and the milliseconds from its last byte in to its reply's last byte out.
struct RequestTiming {
    std::string category;
    double ms = 0;
};

struct ServeReport {
    uint64_t clients = 0;          ///< connections that completed the handshake
    uint64_t refused = 0;          ///< of those, turned away (queue full, shutting down)
    uint64_t dropped_replies = 0;  ///< replies to clients that were gone when the reply was ready
    std::vector<RequestTiming> requests;
};

class Server {
  public:
    Server(Handler& handler, ServerOptions options);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    /// Binds, listens and serves until stopped; returns what was served. Throws dzr::Error when the address
    /// cannot be bound.
    ServeReport run();
    /// Stops the server as SIGINT does; callable from any thread.
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dzr::serve
