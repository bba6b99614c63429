package throttle

import "errors"

// Sentinel errors. Every error returned by this module wraps one of them,
// so callers test with errors.Is.
var (
	// ErrInvalid reports a bad argument or configuration: n <= 0, a zero
	// or negative rate, a zero window, an empty or oversized key, ...
	ErrInvalid = errors.New("throttle: invalid argument")
	// ErrExceedsLimit reports a request larger than the limiter can ever
	// grant (n above the burst or limit). Retrying cannot help.
	ErrExceedsLimit = errors.New("throttle: request exceeds limit")
	// ErrClosed reports use of a limiter after Close.
	ErrClosed = errors.New("throttle: limiter closed")
	// ErrUnavailable reports that a backend (Redis, a peer, a daemon)
	// could not decide in time.
	ErrUnavailable = errors.New("throttle: backend unavailable")
	// ErrLimited is returned by functions made with Wrap when the call was
	// throttled instead of run.
	ErrLimited = errors.New("throttle: rate limited")
	// ErrDenied reports a key that is refused outright (a deny list), not
	// limited: no amount of waiting admits it.
	ErrDenied = errors.New("throttle: key denied")
)
