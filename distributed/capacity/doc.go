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
// Guarantees: the leases held never add up to more than the capacity
// (exactly, not within a rounding error), including while shares move,
// after a configuration change (from each client's next refresh), while a
// new master learns what clients hold, and while a lowered lease travels
// to its client; capacity a client does not use goes to those that want
// more within about one refresh interval; leases are relative durations,
// so clock skew between hosts does not matter.
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
