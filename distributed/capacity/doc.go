// Package capacity shares the capacity of resources among many
// distributed clients with leases: global client-side rate limiting.
//
// Each client tells a server how much of a resource it wants; the server
// divides the resource's capacity among all the clients that want it
// (with Allocate: weighted max-min fairness in strict priority bands, or
// proportional, static or no sharing) and hands each a lease: a capacity
// valid for a while, to refresh at an interval. The client upholds its
// capacity locally — a RateResource is a token bucket whose rate follows
// the lease, a GaugeResource a semaphore whose limit does — so no request
// for the resource itself ever waits on the server.
//
// # Guarantee
//
// For FairShare and ProportionalShare, the capacity that clients enforce
// on their unexpired leases never adds up to more than the resource's
// capacity: exactly, not within a rounding error, and whatever the
// network does to the calls (answers lost, late, or hanging for longer
// than the leases), while shares move, across a master's kill or pause,
// a restart with shorter leases, and huge wants. The tests check it
// where it can break: they run real Clients and Servers, on an in-memory
// network under virtual time and over loopback HTTP/2 through a fault
// proxy, inject those faults, and sum every 10ms what the clients'
// limiters are set to (Resource.Capacity).
//
// How it holds:
//   - A lease ends at the client at its expiry, counted on the client's
//     monotonic clock from when it sent the request, so before the server
//     stops counting it; a timer ends it on time even while a refresh
//     hangs, and the limiters follow at once.
//   - A grant is min(share, wants, capacity − what the others may still
//     hold). A lease the server lowered counts at its old size until the
//     client confirms the lower one (a refresh reporting Has at most the
//     new capacity) or the old lease has expired: a refresh reporting
//     more means the answer never arrived.
//   - A server applies no request whose caller has given up on it (its
//     context is done), so an old request cannot undo a newer one.
//   - A new master learns for at least the template's MaxLeaseLength,
//     confirming only what clients say they hold, at most the capacity in
//     total, and granting newcomers nothing: every lease an earlier master
//     gave out has then been reported or has expired.
//   - After a configuration change the sum stays within the larger of the
//     old and the new capacity, and within the new one once the leases
//     granted before the change have been confirmed lower or expired
//     (one old lease length at the most).
//
// It assumes that clients uphold their leases and report truthfully what
// they hold (while learning a server takes their word for it: a client
// claiming a lease it does not have takes capacity that others hold and
// have not yet reported), that client ids are unique, that clocks run at
// the same rate (their settings may differ), and that a request the
// client gave up on is not applied after the client's next one: the
// in-memory Network ensures it; over HTTP the server drops a request once
// the client's cancellation or deadline reaches it, but one held up in
// the network past the client's timeout and then handled just behind the
// client's next request could still be applied. Every lease any master
// gave out must be at most MaxLeaseLength long. A client without a lease
// uses its Mode's capacity: Pessimistic 0, so the guarantee covers all it
// enforces; Safe (the default) the resource's safe capacity, 0 unless
// configured, so the guarantee covers all it enforces too, while a
// positive safe capacity comes on top (at most capacity plus the safe
// capacity of each client without a lease); Optimistic its last lease,
// which is unbounded. Static and None do not
// bound the sum.
//
// Capacity a client does not use goes to those that want more within
// about one refresh interval: a client whose lease was lowered is asked to
// confirm it after a quarter of one. Leases are relative durations, so
// the hosts' clocks need not agree on the time.
//
// Servers form a tree (WithParent): a server leases each resource's
// capacity from its parent as a client per priority band, with its
// clients' demand in the band added up, reports what it holds, never grants a lease that outlives its own,
// hands out the safe capacity once its parent is unreachable and its lease
// has expired, and weighs its demand so that FairShare divides among all
// the clients of the tree as one server would.
//
// The pieces: Allocate (pure), Server (in process, transport
// independent; Run takes part in an Election), Client with Resource,
// RateResource and GaugeResource handles, the Transport interface with
// an in-memory Network for tests and simulations, and the wire API:
// NewHandler serves a Server over gRPC, gRPC-Web and JSON (Connect), and
// HTTPTransport calls it.
//
// Trust: a server believes what a request says — which client sends it,
// what it wants and holds. NewHandler alone authenticates nobody: whoever
// reaches it can act as any client (release its leases, ask nothing in
// its name), so serve it bare only on a network where every peer is
// trusted. Authenticated binds each request to the client id its caller
// proved, with a TLS client certificate (CertificateIdentity: the
// certificate's URI SAN or common name) or a bearer token (BearerTokens);
// NewTLSTransport and WithBearerToken are the client's side. An
// authenticated client still chooses its own demand and resource ids,
// within the server's bounds (WithMaxResources, WithMaxClients,
// WithMaxLeases, MaxParentBands), but cannot touch another client's lease.
package capacity
