package capacity

import "context"

// Transport carries a client's calls to the server at an address.
// Implementations must be safe for concurrent use.
type Transport interface {
	GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error)
	Release(ctx context.Context, addr string, req *ReleaseRequest) (*Response, error)
}
