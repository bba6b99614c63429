package capacity

import (
	"math"
	"time"
)

// The requests and answers of a Server, and their validation.

// Request asks for capacity on any number of resources at once.
type Request struct {
	// Client identifies the client process: unique among all clients.
	Client string
	// Resources are the client's demands, at most one per resource.
	Resources []ResourceRequest
	// Incarnation and Sequence order a client's calls: Incarnation is
	// the client's start time (Unix nanoseconds), Sequence increases with
	// each call it sends. A server ignores a call older, in (Incarnation,
	// Sequence) order, than the newest it applied for the client on one
	// of the call's resources, answering Stale. Sequence 0 is never
	// refused (and orders nothing). A call of a newer incarnation than
	// the last one applied (the client restarted) makes the server count
	// the older one's lease, on top of the new one's, until it expires.
	Incarnation int64
	Sequence    uint64
}

// ResourceRequest is a client's demand on one resource.
type ResourceRequest struct {
	// Resource is the resource id.
	Resource string
	// Wants is the capacity the client would use: finite and >= 0.
	Wants float64
	// Has is the capacity of the client's unexpired lease when it sent
	// the request, 0 if none; for a gauge, the larger of that and the
	// units it holds, leaving out those it kept past twice a lease's
	// length from the arrival of its last grant (no server counts them
	// any more: they come on top by design). While learning a server confirms it, capped by what
	// is unclaimed; afterwards Has at most the last grant confirms that
	// grant. More than the new grant says that an answer never arrived or
	// that the client still uses more: the server counts it, up to what
	// it granted the client before (while learning, up to the capacity,
	// or with lease keys what the Token proves), until the client reports
	// less or the new lease expires.
	Has float64
	// Priority puts the client in a band; higher bands are served first.
	Priority int32
	// Weight is the client's weight in sharing: 0 means 1, otherwise in
	// (0, 2²⁰].
	Weight float64
	// Token is the Grant.Token of the lease reported in Has, nil if
	// none. A server with lease keys (WithLeaseKeys) credits Has, while
	// it learns, only up to what a valid token proves.
	Token []byte
}

// Response answers a Request.
type Response struct {
	// Redirect reports that this server is not the master: nothing was
	// granted, and the client should ask Master (when not empty).
	Redirect bool
	// Master is the address of the master, "" while unknown.
	Master string
	// Grants hold one lease per requested resource, in request order.
	Grants []Grant
	// Stale reports that the server had already applied a newer call of
	// this client (see Request.Sequence) and ignored this one: nothing
	// was granted and nothing changed. Incarnation is then the newest
	// incarnation of the client the server applied a call of.
	Stale       bool
	Incarnation int64
}

// Grant is a lease on the capacity of one resource.
type Grant struct {
	// Resource is the resource id.
	Resource string
	// Capacity is the granted capacity.
	Capacity float64
	// Lease is how long the grant is valid, counted from when the client
	// sent its request (on the client's own monotonic clock).
	Lease time.Duration
	// Refresh is when the client should ask again.
	Refresh time.Duration
	// SafeCapacity is what the client may use once the lease has expired
	// without a refresh (in Safe mode).
	SafeCapacity float64
	// Err, when not nil, reports that this resource was refused while
	// the others of the request were served: it wraps ErrResourceRefused
	// and throttle.ErrInvalid (a bad demand) or ErrExhausted (the
	// resource is at its bound of clients). Capacity and Lease are then 0.
	Err error
	// Token proves the grant to the server's replicas, nil without lease
	// keys: the client sends it back with Has (ResourceRequest.Token).
	Token []byte
}

// ReleaseRequest gives back a client's leases.
type ReleaseRequest struct {
	Client    string
	Resources []string
	// As in Request: a release older than the newest call the server
	// applied for the client on a resource leaves that resource be.
	Incarnation int64
	Sequence    uint64
}

// validate checks a request before anything is changed.
func validate(req *Request) error {
	switch {
	case req == nil:
		return invalidf("nil request")
	case req.Client == "" || len(req.Client) > maxIDLen:
		return invalidf("client id must have 1 to %d bytes, got %d", maxIDLen, len(req.Client))
	case len(req.Resources) == 0 || len(req.Resources) > maxRequestResources:
		return invalidf("a request carries 1 to %d resources, got %d", maxRequestResources, len(req.Resources))
	}
	return nil
}

// refusals checks each resource of req on its own: the error of each
// one refused (a bad demand, an id requested twice), nil if none is.
func refusals(req *Request) []error {
	var errs []error
	for i := range req.Resources {
		rr := &req.Resources[i]
		err := rr.check()
		for _, o := range req.Resources[:i] {
			if err == nil && o.Resource == rr.Resource {
				err = invalidf("resource %q requested twice", rr.Resource)
			}
		}
		errs = refuse(errs, len(req.Resources), i, err)
	}
	return errs
}

// refuse records err (if not nil) as the refusal of resource i of n.
func refuse(errs []error, n, i int, err error) []error {
	if err == nil {
		return errs
	}
	if errs == nil {
		errs = make([]error, n)
	}
	errs[i] = refused(err)
	return errs
}

// priorities returns the priority of each resource of req.
func (req *Request) priorities() []int32 {
	out := make([]int32, len(req.Resources))
	for i, rr := range req.Resources {
		out[i] = rr.Priority
	}
	return out
}

// check validates one resource's demand. Errors wrap throttle.ErrInvalid.
func (rr *ResourceRequest) check() error {
	switch {
	case rr.Resource == "" || len(rr.Resource) > maxIDLen:
		return invalidf("resource id must have 1 to %d bytes, got %d", maxIDLen, len(rr.Resource))
	case !(rr.Wants >= 0) || math.IsInf(rr.Wants, 0):
		return invalidf("resource %q: wants must be finite and >= 0, got %v", rr.Resource, rr.Wants)
	case !(rr.Has >= 0) || math.IsInf(rr.Has, 0):
		return invalidf("resource %q: has must be finite and >= 0, got %v", rr.Resource, rr.Has)
	case !(rr.Weight >= 0) || rr.Weight > maxWeightValue:
		return invalidf("resource %q: weight must be in [0, %d], got %v", rr.Resource, maxWeightValue, rr.Weight)
	}
	return nil
}
