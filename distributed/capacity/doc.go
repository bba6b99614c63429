// Package capacity shares the capacity of resources among many
// distributed clients with leases: global client-side rate limiting.
//
//	c, err := capacity.NewClient(capacity.NewHTTPTransport(http.DefaultClient),
//		[]string{"http://capacityd.internal:7400"}, capacity.WithClientID(host))
//	db, err := c.Rate("db.queries", 500) // wants 500/s; upholds what it is granted
//	d, err := db.Allow(ctx, "", 1)
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
// a restart with shorter leases, the crash and restart under the same id
// of a client or of a server in a tree, and huge wants. The tests check it
// where it can break: they run real Clients and Servers, on an in-memory
// network under virtual time and over loopback HTTP/2 through a fault
// proxy, inject those faults, and sum every 10ms what the clients'
// limiters are set to (Resource.Capacity).
//
// How it holds:
//   - A lease ends at the client at its expiry, counted on the client's
//     monotonic clock from when it sent the request, so before the server
//     stops counting it, which it does 5 % of the lease's length past its
//     expiry on its own clock (so also when that clock runs up to 5 %
//     faster); a timer ends it on time even while a refresh hangs, and
//     the limiters follow at once.
//   - A grant is min(share, wants, capacity − what the others may still
//     hold). A lease the server lowered counts at its old size until the
//     client confirms the lower one (a refresh reporting Has at most the
//     new capacity) or the old lease has expired: a refresh reporting
//     more means the answer never arrived (or that a gauge still holds
//     more units), and keeps it counting until the new lease expires.
//   - A server applies no request whose caller has given up on it (its
//     context is done), and none older than one it has applied for the
//     same client: each call carries the client's incarnation (its start
//     time) and a sequence number, and an older call held up in the
//     network is answered Stale and changes nothing, so it cannot undo a
//     newer one (a demand rolled back, or a lease taken again released).
//   - A call from a new incarnation of a client (restarted under the
//     same id) never confirms a lease granted to an older one: the server
//     counts what it granted the old life, on top of the new life's
//     leases, until it expires. A restarted server in a tree knows only
//     the clients that have reported to it, while the others keep using
//     leases cut from its old life's grant, which its parent thus counts.
//   - A GaugeResource reports the larger of its lease and its units in
//     flight, and a server counts what a client reports beyond its new
//     lease (up to what it granted it before, or while learning what an
//     earlier master may have) until the client reports less: the units
//     the clients hold add up to at most the capacity, also across a
//     failover, but for units a client keeps past its lease's expiry
//     while it cannot reach the servers.
//   - A new master learns for at least the template's MaxLeaseLength,
//     confirming only what clients say they hold, at most the capacity in
//     total, and granting newcomers nothing: every lease an earlier master
//     gave out has then been reported or has expired. With lease keys
//     (WithLeaseKeys) it confirms a claim only up to a grant signed by a
//     replica for that client and resource and not yet expired.
//   - After a configuration change the sum stays within the larger of the
//     old and the new capacity, and within the new one once the leases
//     granted before the change have been confirmed lower or expired
//     (one old lease length at the most).
//
// It assumes that clients uphold their leases, that client ids are unique
// and that no server's clock runs more than 5 % faster than a client's
// (their settings may differ; a new master learns on its own clock, so
// on a fast one give LearningDuration 5 % more than MaxLeaseLength). It
// assumes that clients report truthfully what they hold unless the
// servers have lease keys: without them a learning server takes their
// word for it, and a client claiming a lease it does not have takes
// capacity that others hold and have not yet reported (with them, a
// client can claim at most its own largest grant that has not expired,
// and the replicas' wall clocks must agree to well within a lease). Every
// lease any master gave out must be at most MaxLeaseLength long. A client without a lease
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
// clients' demand in the band added up, reports what it holds, never grants a lease that outlives its own
// (and asks its clients to refresh within half of one cut short by it),
// grants 0 once its parent is unreachable and its lease has expired, until
// the parent grants it one again, and weighs its demand so that FairShare
// divides among all the clients of the tree as one server would.
//
// A request asks for many resources at once; one whose demand is bad (a
// NaN, infinite or negative wants, an id too long or repeated) or that is
// at its bound of clients is refused on its own, with a Grant.Err (and
// Resource.Err at the client) wrapping ErrResourceRefused, and the others
// are served.
//
// The pieces: Allocate (pure), Server (in process, transport
// independent; Run takes part in an Election), Client with Resource,
// RateResource and GaugeResource handles, the Transport interface, and
// the wire API: NewHandler serves a Server over gRPC, gRPC-Web and JSON
// (Connect), and HTTPTransport calls it.
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
// WithMaxLeases, maxParentBands), but cannot touch another client's lease.
// Lease keys (WithLeaseKeys, capacityd's lease_keys_file) are the other
// half: they bound what a client, authenticated or not, can claim to hold
// when a new master learns.
package capacity
