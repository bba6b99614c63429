package capacity

import (
	"errors"
	"fmt"

	"github.com/throttlekit/throttle"
)

// ErrExhausted reports that a server holds as many clients or resources
// as it is configured to: the request was refused, nothing was granted.
// Retrying later, or elsewhere, may help.
var ErrExhausted = errors.New("capacity: server at its bound of clients or resources")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: capacity: %s", throttle.ErrInvalid, fmt.Sprintf(format, args...))
}

// errTooLarge reports a request body above MaxRequestBytes, as sent or
// once decompressed (the handler stops reading, and decompressing, at
// the bound). It wraps throttle.ErrInvalid; on the wire it is code
// InvalidArgument, or HTTP 413 for a Connect request whose
// Content-Length is above the bound.
var errTooLarge = fmt.Errorf("%w: capacity: request larger than %d bytes", throttle.ErrInvalid, MaxRequestBytes)

// ErrResourceRefused reports that a server refused one resource of a
// request (Grant.Err, Resource.Err) while it served the others. The
// error also wraps throttle.ErrInvalid (the resource's demand or id is
// invalid) or ErrExhausted (the resource is at its bound of clients).
var ErrResourceRefused = errors.New("capacity: resource refused")

// errStale reports an answer saying that the server had already applied
// a newer call of the client (Response.Stale): the call changed nothing.
// A Client then takes up a newer incarnation and asks again; its Err
// wraps errStale and throttle.ErrUnavailable while no server answered
// otherwise.
var errStale = errors.New("capacity: the server applied a newer call of this client")

// resourceError is the refusal of one resource of a request: it wraps
// ErrResourceRefused and kind, throttle.ErrInvalid or ErrExhausted.
type resourceError struct {
	kind error
	msg  string
}

func (e *resourceError) Error() string   { return e.msg }
func (e *resourceError) Unwrap() []error { return []error{ErrResourceRefused, e.kind} }

// refused makes err, which wraps throttle.ErrInvalid or ErrExhausted,
// the refusal of one resource.
func refused(err error) error {
	kind := throttle.ErrInvalid
	if errors.Is(err, ErrExhausted) {
		kind = ErrExhausted
	}
	return &resourceError{kind: kind, msg: err.Error()}
}
