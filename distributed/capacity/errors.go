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

// ErrTooLarge reports a request body above MaxRequestBytes, as sent or
// once decompressed (the handler stops reading, and decompressing, at
// the bound). It wraps throttle.ErrInvalid; on the wire it is code
// InvalidArgument, or HTTP 413 for a Connect request whose
// Content-Length is above the bound.
var ErrTooLarge = fmt.Errorf("%w: capacity: request larger than %d bytes", throttle.ErrInvalid, MaxRequestBytes)
